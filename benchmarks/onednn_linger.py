"""Do the pool threads that linger after a split call pay? The rule against none, in one process.

A thread of XLA's pool that ran a split call's chunks waits up to ``kLinger`` for the next
split call's job before it returns to the pool, where the call after would have to wake it
(``native/runtime/linger.h``), and only where the split calls come within ``kLingerGap`` of
each other and no call has run on the OpenMP team for ``kLingerAfterTeam`` (``decisions.h``,
``Lingers``; docs/onednn.md, "Threads"). This times, with
``jaxconv.accelerate``, each model's inference-mode forward at batch 1 (a chain of split
calls microseconds apart: where it should pay) and two training steps at batch 8 (XLA's own
work between the calls: where a waiting thread would slow it), each alternating between the
rule (``kLinger``) and no lingering (``library.lingering(0)``) in one process: a fresh
random order each round, each side's median of its rounds' medians.

usage: python -m benchmarks.onednn_linger [--rounds 15] [--out docs/benchmarks/onednn_linger.json]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from benchmarks.runtime_ab import Side, ab, forward, per_call, step
from jaxconv._src.bench import machine
from jaxconv._src.native import library

INFERENCE = (("mobilenet_v2", 1), ("resnet18", 1), ("resnet50", 1), ("dcgan", 1),
             ("mnist_cnn", 1))
STEPS = (("resnet18", 8), ("mobilenet_v2", 8))


def _lingering(microseconds: float | None) -> Side:
    return lambda: (contextlib.nullcontext() if microseconds is None
                    else library.lingering(microseconds))


#: the linger: kLinger, or not at all (microseconds)
SIDES = {"rule": _lingering(None), "none": _lingering(0.0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.onednn_linger", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", help="the JSON result's path (default: printed only)")
    args = ap.parse_args(argv)
    if not library.status().available:
        print("the oneDNN handler is not loaded: nothing lingers", file=sys.stderr)
        return 1
    rows = []
    for part, cases, make, per_round in (("inference", INFERENCE, forward, 20),
                                         ("step", STEPS, step, 3)):
        for name, batch in cases:
            call = make(name, batch)
            med = ab(call, SIDES,
                     args.rounds if part == "inference" else max(4, args.rounds // 2), per_round)
            rows.append({"part": part, "model": name, "batch": batch, "median_ms": med,
                         "none_over_rule": med["none"] / med["rule"],
                         "lingered_jobs_per_call": per_call(call, "lingered_jobs",
                                                                settle_s=0.03)})
            print(f"{part:9s} {name:13s} batch {batch}: rule {med['rule']:8.3f} ms, none "
                  f"{med['none']:8.3f} ms, none/rule {med['none'] / med['rule']:.3f}, "
                  f"lingered jobs a call {rows[-1]['lingered_jobs_per_call']:.1f}", flush=True)
    machine.write(args.out, machine.result(
        "python -m benchmarks.onednn_linger " + " ".join(argv if argv is not None
                                                          else sys.argv[1:]),
        rounds=args.rounds, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
