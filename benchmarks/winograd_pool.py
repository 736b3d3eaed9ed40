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
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.onednn_linger import forward, step
from jaxconv._src.bench import machine
from jaxconv._src.native import library

INFERENCE = (("resnet18", 1), ("resnet50", 1), ("mnist_cnn", 1), ("resnet18", 8),
             ("mnist_cnn", 8))
STEPS = (("resnet18", 8), ("mnist_cnn", 128))
SIDES = ("rule", "team", "pool")


def _side(side: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if side == "rule" else library.winograd_on_pool(
        side == "pool")


def ab(call: Callable[[], Any], rounds: int, per_round: int) -> dict[str, float]:
    """Each side's median ms (of its rounds' medians), sides alternating in a fresh order."""
    for _ in range(3):
        call()
    rng = np.random.default_rng(1)
    medians: dict[str, list[float]] = {k: [] for k in SIDES}
    for _ in range(rounds):
        for k in rng.permutation(list(SIDES)):
            with _side(str(k)):
                call()  # the side's threads as its calls leave them
                ts = []
                for _ in range(per_round):
                    t = time.perf_counter()
                    call()
                    ts.append(time.perf_counter() - t)
            medians[str(k)].append(statistics.median(ts))
    return {k: statistics.median(v) * 1e3 for k, v in medians.items()}


def on_pool(call: Callable[[], Any], calls: int = 5) -> float:
    """The Winograd forwards the rule ran on the pool per call (``cache_stats``)."""
    call()
    before = library.cache_stats()["winograd_pool_calls"]
    for _ in range(calls):
        call()
    return (library.cache_stats()["winograd_pool_calls"] - before) / calls


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
            med = ab(call, args.rounds if part == "inference" else max(4, args.rounds // 2),
                     per_round)
            rows.append({"part": part, "model": name, "batch": batch, "median_ms": med,
                         "team_over_rule": med["team"] / med["rule"],
                         "pool_over_rule": med["pool"] / med["rule"],
                         "pool_calls_per_call": on_pool(call)})
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
