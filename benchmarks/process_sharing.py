"""Does sharing a process move the training-step comparison? ``jaxconv bench models``'s
contenders interleaved in one process against each contender in a process of its own
(``--separate``), the two kinds of process alternating round by round so that a VM's slow
phase hits both alike.

Per round: one process with the contenders interleaved, then one process per contender; the
same script, arrays and state (``jaxconv._src.bench.model_steps``). JSON: every round's
medians, ratios and minor page faults a step, and per kind the median and range of the
ratio:

    python -m benchmarks.process_sharing --models mobilenet_v2 --batch 32 --rounds 3 \
        --out sharing.json
    python -m benchmarks.process_sharing --report JSON [JSON ...]  (the markdown table)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from typing import Any

from jaxconv._src.bench.model_steps import _child, _merge
from jaxconv._src.native import library


def table(results: list[dict[str, Any]]) -> str:
    """The table (CHANGELOG.md, "Earlier measurements"): per model and batch, each kind of process's medians (ms,
    the median over rounds), the ratio's median and every round's, the faults a step."""
    lines = ["| model (batch) | processes | rounds | accelerate ms | torch ms | torch/accelerate "
             "(each round) | minor faults a step, accelerate / torch |",
             "|---|---|---|---|---|---|---|"]
    for res in results:
        for s in res["summary"]:
            rows = [r for r in res["rounds"] if r["model"] == s["model"] and r["kind"] == s["kind"]]
            med = {k: statistics.median(r["median_ms"][k] for r in rows) for k in ("accelerate", "torch")}
            faults = {k: max(r["minor_faults_per_step"][k] for r in rows) for k in med}
            each = ", ".join(f"{r['ratio']:.2f}" for r in rows)
            lines.append(f"| {s['model']} ({res['batch']}) | "
                         f"{'one, interleaved' if s['kind'] == 'interleaved' else 'one per contender'} "
                         f"| {len(rows)} | {med['accelerate']:,.0f} | {med['torch']:,.0f} "
                         f"| **{s['median']:.2f}** ({each}) "
                         f"| {faults['accelerate']:,.0f} / {faults['torch']:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--report"]:
        print(table([json.loads(pathlib.Path(p).read_text()) for p in argv[1:]]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--contenders", nargs="+", default=["accelerate", "torch"])
    ap.add_argument("--no-batchnorm", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args(argv)
    a, b = args.contenders[-1], args.contenders[0]  # the ratio: a's time over b's
    onednn = library.status().line()  # every child's, checked by _child
    print(onednn, file=sys.stderr, flush=True)  # "not available": accelerate without oneDNN
    rounds: list[dict[str, object]] = []
    for r in range(args.rounds):
        for kind in ("interleaved", "separate"):
            print(f"round {r + 1}/{args.rounds}: {kind}", file=sys.stderr, flush=True)
            run = (_child(args, "usual", args.contenders) if kind == "interleaved" else
                   _merge([_child(args, "usual", [c]) for c in args.contenders]))
            for row in run["rows"]:
                med = row["median_ms"]
                rounds.append({"round": r, "kind": kind, "model": row["model"],
                               "median_ms": med, "ratio": med[a] / med[b],
                               "minor_faults_per_step": row["minor_faults_per_step"],
                               "peak_rss_mib": run["peak_rss_mib"]})
    summary = []
    for model in args.models:
        for kind in ("interleaved", "separate"):
            ratios = [x["ratio"] for x in rounds if x["model"] == model and x["kind"] == kind]
            summary.append({"model": model, "kind": kind, "ratio": f"{a}/{b}",
                            "median": statistics.median(ratios),
                            "range": [min(ratios), max(ratios)]})
            print(f"{model} {kind}: {a}/{b} {statistics.median(ratios):.2f} "
                  f"({', '.join(f'{v:.2f}' for v in ratios)})")
    result = {"command": " ".join(["python -m benchmarks.process_sharing", *argv]),
              "batch": args.batch, "onednn": onednn, "rounds": rounds, "summary": summary}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
