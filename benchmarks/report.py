"""Render a benchmark runner (jaxconv bench) JSON result as Markdown tables, or write
docs/performance.md from the JSONs it cites.

usage: python -m benchmarks.report benchmarks/results/full.json > table.md  (the per-row tables)
       python -m benchmarks.report --page [PATH]  (docs/performance.md: jaxconv/_src/bench/page.py)
"""

from __future__ import annotations

import json
import sys

from jaxconv._src.bench import run


def render(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    summary = run.summarize(rows)  # recomputed: the tables always follow run.py's summary
    cpu = f", {meta['cpu']}" if meta.get("cpu") else ""
    out = [f"Measured with `{meta['command']}` (jax {meta['jax']}, backend {meta['backend']}, "
           f"{meta['cpu_count']} CPUs{cpu}, {meta['platform']}; median of {meta['reps']} "
           f"interleaved runs, float32, NXC/XIO, minibatch capped at {meta['batch_cap']}).", "",
           *([f"{meta['onednn']}.", ""] if meta.get("onednn") else []),
           "| list | problems | geomean speed-up vs jax.vjp | min speed-up | geomean jaxconv/torch "
           "| geomean best(jaxconv, jaxconv+opts)/torch |",
           "|---|---|---|---|---|---|"]
    for key, s in summary.items():
        if key.startswith(("category:", "target_lists")):
            continue
        out.append(f"| {key} | {s['problems']} | {s['geomean_speedup_vs_vjp']:.2f}x | "
                   f"{s['min_speedup_vs_vjp']:.2f}x | {s['geomean_jaxconv_over_torch']:.2f} | "
                   f"{s.get('geomean_best_over_torch', float('nan')):.2f} |")
    for key, s in summary.items():
        if key.startswith("category:"):
            out.append(f"| {key} | {s['problems']} | {s['geomean_speedup_vs_vjp']:.2f}x | "
                       f"{s['min_speedup_vs_vjp']:.2f}x | "
                       f"{s.get('geomean_jaxconv_over_torch', float('nan')):.2f} | |")
    t = summary.get("target_lists")
    if t:
        out += ["", f"Target lists together: {t['problems']} problems, geometric-mean speed-up "
                    f"{t['geomean_speedup_vs_vjp']:.2f}x. Slower than jax.vjp (ratio < 1/1.05) with "
                    f"a different program: {', '.join(t['slower_than_vjp']) or 'none'}. Below "
                    f"1/1.05 although both compile to the same optimized HLO (timing noise): "
                    f"{', '.join(t.get('slower_same_program', [])) or 'none'}; "
                    f"{t.get('same_program_as_vjp', 0)} rows compile to the same program as jax.vjp."]
        if "slower_beyond_noise" in t:
            out[-1] += (" Slower by more than 5% in at least three of four paired rounds (the "
                        "upper quartile of jax.vjp's time over jaxconv's per round below 1/1.05): "
                        f"{', '.join(t['slower_beyond_noise']) or 'none'}.")
    out += ["", "| list | problem | kind | jaxconv ms | jaxconv+opts ms | jax.vjp ms | torch ms "
                "| x vjp | same HLO | jaxconv/torch | GFLOP/s | first call s (jaxconv / vjp) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median_ms"]
        torch = f"{m['torch']:.2f}" if "torch" in m else "-"
        ratio = f"{r['jaxconv_over_torch']:.2f}" if "jaxconv_over_torch" in r else "-"
        fc = r["first_call_s"]
        opts = f"{m['jaxconv+opts']:.2f}" if "jaxconv+opts" in m else "-"
        out.append(f"| {r['list']} | {r['name']} | {r['kind']} | {m['jaxconv']:.2f} | {opts} | "
                   f"{m['jax.vjp']:.2f} | {torch} | {r['speedup_vs_vjp']:.2f} | "
                   f"{'yes' if r.get('same_program_as_vjp') else ''} | {ratio} | "
                   f"{r['gflops_per_s']['jaxconv']:.1f} | {fc['jaxconv']:.2f} / {fc['jax.vjp']:.2f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--page"]:
        from jaxconv._src.bench import page
        raise SystemExit(page.main(sys.argv[2:]))
    print(render(json.loads(open(sys.argv[1]).read())), end="")
