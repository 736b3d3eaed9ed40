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
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from jaxconv._src.bench.model_steps import _child, _merge


def main(argv: list[str] | None = None) -> int:
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
    result = {"command": " ".join(["python -m benchmarks.process_sharing",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "batch": args.batch, "rounds": rounds, "summary": summary}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
