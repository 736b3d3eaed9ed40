"""Do oneDNN's threads and XLA's compete? A oneDNN call beside an independent XLA computation.

The ``onednn`` extra's oneDNN (``onednn-cpu-gomp``) runs its primitives on OpenMP threads; XLA
runs the rest of a compiled program on its own thread pool. A build of oneDNN with the
threadpool runtime could run on XLA's pool instead, but PyPI has none, so the two pools are
measured: in one jitted program, a oneDNN weight gradient and an independent XLA computation
(a matrix product, on XLA's pool) must not take longer than the two programs run one after
the other. The same is measured with the convolution on XLA's own (``lowering="vjp"``: JAX's
transpose rule's convolution), for comparison.

Times are medians of interleaved samples (a fresh random order each repetition, calls per
sample autoranged to >= 20 ms).

usage: python -m benchmarks.onednn_threads [--reps 9] [--out benchmarks/results/onednn_threads.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv
from jaxconv._src.bench.run import _time_n, calls_per_sample, cpu_model
from jaxconv._src.bench.timing import settle
from jaxconv._src.native import library

RESULTS = pathlib.Path(__file__).parent / "results"
# a resnet_50 res3 weight gradient (N8, 28x28, 128 -> 128, 3x3) and a 768^3 matrix product:
# each about 20 ms on two cores, so that either alone keeps both cores busy
X, DY, W = (8, 28, 28, 128), (8, 28, 28, 128), (3, 3, 128, 128)
M = 768


def programs(lowering: str) -> dict[str, Callable]:
    rng = np.random.default_rng(0)
    x, dy = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in (X, DY))
    a, b = (jnp.asarray(rng.standard_normal((M, M)), jnp.float32) for _ in range(2))

    def conv(x: jax.Array, dy: jax.Array) -> jax.Array:
        return jaxconv.convolution_backprop_filters(x, dy, W, pads_begin=1, pads_end=1,
                                                    lowering=lowering)

    def xla(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.tanh(a @ b) @ b

    f_conv, f_xla = jax.jit(conv), jax.jit(xla)
    f_both = jax.jit(lambda x, dy, a, b: (conv(x, dy), xla(a, b)))
    assert ("jaxconv_onednn" in f_both.lower(x, dy, a, b).as_text()) == (lowering == "onednn")
    return {"conv": lambda: f_conv(x, dy), "xla": lambda: f_xla(a, b),
            "apart": lambda: (f_conv(x, dy), f_xla(a, b)), "together": lambda: f_both(x, dy, a, b)}


def measure(lowering: str, reps: int) -> dict[str, float]:
    fns = programs(lowering)
    calls = {k: calls_per_sample(fn) for k, fn in fns.items()}
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = np.random.default_rng(0)
    for _ in range(reps):
        for k in order.permutation(list(fns)):
            settle(fns[k], calls[k])
            times[k].append(_time_n(fns[k], calls[k]) / calls[k])
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {**{f"{k}_ms": v for k, v in med.items()},
            "together_over_apart": med["together"] / med["apart"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.onednn_threads", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS / "onednn_threads.json")
    args = ap.parse_args(argv)
    rows = {low: measure(low, args.reps) for low in ("onednn", "vjp")
            if low != "onednn" or library.status().available}
    result = {"meta": {"jax": jax.__version__, "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                       "platform": platform.platform(), "onednn": library.status().line(),
                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                       "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"), "reps": args.reps},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for low, r in rows.items():
        print(f"{low:9s} conv {r['conv_ms']:7.2f} ms, xla {r['xla_ms']:7.2f} ms, apart "
              f"{r['apart_ms']:7.2f} ms, together {r['together_ms']:7.2f} ms: together/apart "
              f"{r['together_over_apart']:.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
