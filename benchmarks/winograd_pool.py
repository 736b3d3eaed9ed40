"""Where should Winograd's forward run: the OpenMP team or XLA's pool? The rule against both, in
one process.

A Winograd forward runs its passes as parts on XLA's pool once no call has run on the OpenMP
team for ``kLingerAfterTeam`` (a served model's forward, whose other calls split over the pool),
else on the team (a training step's, beside its weight gradients on the team)
(``native/onednn/decisions.h``, ``WinogradOnPool``; docs/onednn.md, "Threads"). This times,
with ``jaxconv.accelerate``, each model's inference-mode forward (batch 1 and 8) and training
steps at batch 8, each alternating between the rule, every Winograd forward on the team and
every one on the pool (``library.winograd_on_pool``), in one process: a fresh random order each
round, each side's median of its rounds' medians; and how many of a call's Winograd forwards
the rule put on the pool (``winograd_pool_calls``).

usage: python -m benchmarks.winograd_pool [--rounds 15] [--out docs/benchmarks/winograd_pool.json]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from benchmarks.runtime_ab import Side, ab, forward, per_call, step
from jaxconv._src.bench import machine
from jaxconv._src.native import library

INFERENCE = (("resnet18", 1), ("resnet50", 1), ("mnist_cnn", 1), ("resnet18", 8),
             ("mnist_cnn", 8))
STEPS = (("resnet18", 8), ("mnist_cnn", 128))


def _on_pool(on: bool | None) -> Side:
    return lambda: (contextlib.nullcontext() if on is None else library.winograd_on_pool(on))


#: the rule, every Winograd forward on the team, every one on the pool
SIDES = {"rule": _on_pool(None), "team": _on_pool(False), "pool": _on_pool(True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.winograd_pool", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", help="the JSON result's path (default: printed only)")
    args = ap.parse_args(argv)
    if not library.status().available:
        print("the oneDNN handler is not loaded: no Winograd kernel runs", file=sys.stderr)
        return 1
    rows = []
    for part, cases, make, per_round in (("inference", INFERENCE, forward, 10),
                                         ("step", STEPS, step, 3)):
        for name, batch in cases:
            call = make(name, batch)
            med = ab(call, SIDES,
                     args.rounds if part == "inference" else max(4, args.rounds // 2), per_round)
            rows.append({"part": part, "model": name, "batch": batch, "median_ms": med,
                         "team_over_rule": med["team"] / med["rule"],
                         "pool_over_rule": med["pool"] / med["rule"],
                         "pool_calls_per_call": per_call(call, "winograd_pool_calls")})
            print(f"{part:9s} {name:13s} batch {batch:3d}: rule {med['rule']:8.3f} ms, team "
                  f"{med['team']:8.3f}, pool {med['pool']:8.3f}; team/rule "
                  f"{med['team'] / med['rule']:.3f}, pool/rule {med['pool'] / med['rule']:.3f}"
                  f", on the pool a call {rows[-1]['pool_calls_per_call']:.1f}", flush=True)
    machine.write(args.out, machine.result(
        "python -m benchmarks.winograd_pool " + " ".join(argv if argv is not None
                                                         else sys.argv[1:]),
        rounds=args.rounds, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
