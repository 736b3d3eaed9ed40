"""Markdown tables of ``jaxconv bench models`` results (the opening of docs/performance.md).

usage: python -m jaxconv._src.bench.model_report JSON [JSON ...]  (results of jaxconv bench models)
       python -m jaxconv._src.bench.model_report --lead JSON [JSON ...]  (the headline table)

Each file's ``steps`` rows become one table (model, BatchNorm, memory mode, the processes
(one, or one per contender: ``--separate``), the contenders' medians, torch/jaxconv and
torch/accelerate with every run's, lax/jaxconv, the max pool alone on both sides and
torch/jaxconv with it taken from both steps, each contender's minor page faults a step); its
``layers``
become, per model, the summary (step-weighted jaxconv/torch, worst row, the convolutions'
GFLOP/s beside the machine's peak) and the rows furthest behind.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

#: the memory column per mode (any other mode name prints as glibc's defaults)
_MEMORY = {"kept": "kept first", "usual": "usual script"}


def _ms(v: float | None) -> str:
    """A median in ms, or "-" where the contender did not run."""
    return "-" if v is None else f"{v:.0f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _faults(r: dict[str, Any], contenders: tuple[str, ...]) -> str:
    """The contenders' minor page faults a step (median over runs), "-" where not counted."""
    faults = r.get("minor_faults_per_step") or {}
    return " / ".join("-" if k not in faults else f"{faults[k]:,.0f}" for k in contenders)


def steps_table(results: list[dict[str, Any]]) -> str:
    lines = ["| model (batch, image) | BatchNorm | memory | processes | lax ms | jaxconv ms "
             "| accelerate ms | torch ms | torch/jaxconv (runs) | torch/accelerate (runs) "
             "| lax/jaxconv | max pool ms, XLA / jaxconv / torch | torch/jaxconv without it "
             "| minor faults a step, jaxconv / accelerate / torch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res.get("steps", []):
            m = r["median_ms"]
            pool, rest = r.get("max_pool"), r.get("torch_over_jaxconv_without_max_pool")
            pool_ms = "-" if not pool else " / ".join(
                _ms(pool["median_ms"].get(k)) for k in ("xla", "jaxconv", "torch"))
            lines.append(
                f"| {r['description']} ({r['batch']}, {r['image']}) | {'yes' if r['batchnorm'] else 'no'} "
                f"| {_MEMORY.get(r['mode'], 'glibc defaults')} "
                f"| {'one each' if r.get('processes') == 'one per contender' else 'one'} "
                + "".join(f"| {_ms(m.get(k))} " for k in ("lax", "jaxconv", "accelerate", "torch"))
                + "".join(f"| {_bold(r.get(f'torch_over_{k}'))}{runs(r, k)} "
                          for k in ("jaxconv", "accelerate"))
                + f"| {_ratio(r['lax_over_jaxconv'])} "
                f"| {pool_ms} | {_ratio(rest)} | {_faults(r, ('jaxconv', 'accelerate', 'torch'))} |")
    return "\n".join(lines)


def _bold(v: float | None) -> str:
    return "-" if v is None else f"**{v:.2f}**"


def runs(r: dict[str, Any], contender: str, label: str = "") -> str:
    """Each run's torch/``contender`` ratio, in parentheses (after ``label``); empty where none
    was timed."""
    ratios = [v for v in r.get(f"torch_over_{contender}_runs") or [] if v]
    return f" ({label}{', '.join(f'{v:.2f}' for v in ratios)})" if ratios else ""


def lead_table(results: list[dict[str, Any]]) -> str:
    """The headline (docs/performance.md, README): per model, the step's median ms of each
    contender and torch over it, each process's ratio beside, for each BatchNorm setting and
    memory mode the results hold (a column only where something was timed)."""
    rows: dict[str, dict[tuple[str, bool], dict[str, Any]]] = {}
    for res in results:
        for r in res.get("steps", []):
            rows.setdefault(f"{r['description']} ({r['batch']}, {r['image']})", {})[
                (r["mode"], r["batchnorm"])] = r
    found = {key for by in rows.values() for key in by}
    columns = [(contender, mode, bn) for contender in ("accelerate", "jaxconv")
               for mode in ("usual", "kept") for bn in (False, True)
               if (mode, bn) in found and any(
                   by.get((mode, bn), {}).get(f"torch_over_{contender}") is not None
                   for by in rows.values())]

    def head(contender: str, mode: str, bn: bool) -> str:
        who = "accelerate" if contender == "accelerate" else "jaxconv (hooks)"
        kept = ", kept first" if mode == "kept" else ""
        return (f"{'with' if bn else 'no'} BatchNorm: torch / {who}{kept} (per process); "
                f"{who} ms")

    def cell(r: dict[str, Any], contender: str) -> str:
        ratio = r.get(f"torch_over_{contender}")
        if ratio is None:
            return "-"
        ms = r["median_ms"].get(contender)
        return f"**{ratio:.2f}**" + runs(r, contender) + ("" if ms is None else f"; {ms:.0f}")

    lines = ["| model (batch, image) | " + " | ".join(head(*c) for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for model, by in rows.items():
        lines.append(f"| {model} | " + " | ".join(
            cell(by.get((mode, bn), {}), contender) for contender, mode, bn in columns) + " |")
    return "\n".join(lines)


def layers_summary(result: dict[str, Any]) -> str:
    peak = result["machine"]["peak"]["gflops"]
    lines = ["| model | rows | step-weighted jaxconv/torch | worst row | convolutions' GFLOP/s, "
             "jaxconv (torch) | of the peak |", "|---|---|---|---|---|---|"]
    for lay in result.get("layers", []):
        g = lay["conv_gflops"]
        lines.append(f"| {lay['model']} ({lay['batch']}, {lay['image']}) | {len(lay['rows'])} "
                     f"| **{lay['step_weighted']:.3f}** | {lay['worst']:.2f} "
                     f"| {g['jaxconv']:.0f} ({g['torch']:.0f}) | {g['jaxconv'] / peak:.0%} |")
    return "\n".join(lines)


def layers_rows(result: dict[str, Any], over: float = 1.05) -> str:
    """The rows of every model more than ``over`` behind torch, furthest first."""
    lines = ["| model | layer | kernel | count | jaxconv ms | torch ms | jaxconv/torch "
             "(paired range) | torch's layout |", "|---|---|---|---|---|---|---|---|"]
    rows = [(lay["model"], r) for lay in result.get("layers", []) for r in lay["rows"]
            if r["jaxconv_over_torch"] > over]
    for model, r in sorted(rows, key=lambda t: -t[1]["jaxconv_over_torch"]):
        lo, hi = r["paired_ratio_range"]
        lines.append(f"| {model} | {r['layer']} | {r['kind']} | {r['count']} "
                     f"| {r['median_ms']['jaxconv']:.2f} | {r['median_ms']['torch']:.2f} "
                     f"| {r['jaxconv_over_torch']:.2f} ({lo:.2f}-{hi:.2f}) | {r['torch_layout']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    lead = "--lead" in args
    results = [json.loads(pathlib.Path(p).read_text()) for p in args if p != "--lead"]
    if lead:
        print(lead_table(results))
        return 0
    print(steps_table(results))
    for res in results:
        if res.get("layers"):
            print()
            print(layers_summary(res))
            print()
            print(layers_rows(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
