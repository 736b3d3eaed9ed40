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
import functools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv
from jaxconv._src import lax_refs
from jaxconv._src.bench import machine, model_inference, model_steps, models
from jaxconv._src.native import library

INFERENCE = (("mobilenet_v2", 1), ("resnet18", 1), ("resnet50", 1), ("dcgan", 1),
             ("mnist_cnn", 1))
STEPS = (("resnet18", 8), ("mobilenet_v2", 8))
SIDES = {"rule": None, "none": 0.0}  # the linger: kLinger, or not at all (microseconds)


def forward(name: str, batch: int) -> Callable[[], Any]:
    """The model's accelerated inference-mode forward, its variables closed over (as served)."""
    shape = {"mnist_cnn": (batch, 28, 28, 1), "dcgan": (batch, 1, 1, 100)}.get(
        name, (batch, 224, 224, 3))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    v = jax.tree.map(jnp.asarray, model_inference.variables(name, x))
    model = model_inference._flax_model(name, None)
    f = jax.jit(jaxconv.accelerate(functools.partial(model.apply, v)))
    xj = jnp.asarray(x)
    return lambda: jax.block_until_ready(f(xj))


def step(name: str, batch: int) -> Callable[[], Any]:
    """One accelerated training step (BatchNorm, SGD with momentum), carrying its state."""
    spec = models.MODELS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, spec.image, spec.image, spec.channels)).astype(np.float32)
    labels = rng.integers(0, spec.classes, batch).astype(np.int32)
    variables = models.init(name, jnp.asarray(x), True)
    model = models.build(name, lax_refs.conv_general_dilated, True)
    jitted, tx = model_steps._jax_step(model, True, donate=True, accelerate=True)
    run = model_steps._training_loop(jitted, variables["params"], variables.get("batch_stats", {}),
                                     tx.init(variables["params"]), jnp.asarray(x),
                                     jnp.asarray(labels))

    def once() -> Any:
        loss, state = run()
        return jax.block_until_ready(state)
    return once


def ab(call: Callable[[], Any], rounds: int, per_round: int) -> dict[str, float]:
    """Each side's median ms (of its rounds' medians), sides alternating in a fresh order."""
    for _ in range(3):
        call()
    rng = np.random.default_rng(1)
    medians: dict[str, list[float]] = {k: [] for k in SIDES}
    for _ in range(rounds):
        for k in rng.permutation(list(SIDES)):
            linger = SIDES[str(k)]
            with (library.lingering(linger) if linger is not None
                  else contextlib.nullcontext()):
                call()  # the side's threads as its calls leave them
                ts = []
                for _ in range(per_round):
                    t = time.perf_counter()
                    call()
                    ts.append(time.perf_counter() - t)
            medians[str(k)].append(statistics.median(ts))
    return {k: statistics.median(v) * 1e3 for k, v in medians.items()}


def lingered(call: Callable[[], Any], calls: int = 5) -> float:
    """The jobs lingering threads took per call under the rule (``cache_stats``), after the
    team's idle time: 0 where the model's calls never linger."""
    time.sleep(0.03)
    call()
    before = library.cache_stats()["lingered_jobs"]
    for _ in range(calls):
        call()
    return (library.cache_stats()["lingered_jobs"] - before) / calls


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
            med = ab(call, args.rounds if part == "inference" else max(4, args.rounds // 2),
                     per_round)
            rows.append({"part": part, "model": name, "batch": batch, "median_ms": med,
                         "none_over_rule": med["none"] / med["rule"],
                         "lingered_jobs_per_call": lingered(call)})
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
