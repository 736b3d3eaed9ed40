"""Each Winograd tile against oneDNN's direct kernel and XLA's own program (``jax.vjp`` of the
forward, the baseline) on the 3x3 stride-1 layers of ResNet-18 and ResNet-50, per kernel,
interleaved in one process (float32 or ``--dtype bfloat16``, NHWC and HWIO as flax writes
them, pads of 1):

    python -m benchmarks.winograd_tiles --out docs/benchmarks/winograd-tiles-zen4.json

Per layer and kernel it prints and writes the fastest and the median call of each method in
ms and each one's fastest over the baseline's. ``--filters N`` rotates N filters (and as
many gradients), so that a call reads operands another call left out of the cache, as layers
interleaved in a model do (``--filters 8``: 75 MB of 512 x 512 filters). Needs the ``onednn``
extra built (``jaxconv build-onednn``); docs/lowerings.md, "Winograd".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv
from jaxconv._src.bench import machine

# name: (batch, output size, channels); every layer maps C -> C channels.
LAYERS = {
    "resnet18 56x56 64": (8, 56, 64), "resnet18 28x28 128": (8, 28, 128),
    "resnet18 14x14 256": (8, 14, 256), "resnet18 7x7 512": (8, 7, 512),
    "resnet50 40x40 64": (8, 40, 64), "resnet50 20x20 128": (8, 20, 128),
    "resnet50 10x10 256": (8, 10, 256), "resnet50 5x5 512": (8, 5, 512),
}
METHODS = ("baseline", "onednn", "winograd_2x2", "winograd_3x3", "winograd_4x4")
ATTRS = dict(strides=1, pads_begin=(1, 1), pads_end=(1, 1), data_format="NXC",
             filter_format="XIO")


def _kernels(method: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> dict:
    """The forward, data and weight gradient of ``method`` (the baseline: XLA's convolution
    and autodiff's transposes of it), each jitted."""
    fwd = {"lowering": "conv" if method == "baseline" else method}
    grad = {"lowering": "vjp" if method == "baseline" else method}
    return {
        "forward": jax.jit(lambda x, w: jaxconv.convolution(x, w, **fwd, **ATTRS)),
        "data": jax.jit(lambda dy, w: jaxconv.convolution_backward_data(
            dy, w, x_shape, **grad, **ATTRS)),
        "weight": jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(
            x, dy, w_shape, **grad, **ATTRS)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--filters", type=int, default=1)
    ap.add_argument("--layers", nargs="+", choices=sorted(LAYERS), default=list(LAYERS))
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                    help="the methods to time (the baseline always)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dtype = jnp.dtype(args.dtype)
    methods = ("baseline", *(m for m in METHODS if m in args.methods and m != "baseline"))
    rng = np.random.default_rng(0)
    rows = []
    for name in args.layers:
        n, size, c = LAYERS[name]
        x_shape, w_shape = (n, size, size, c), (3, 3, c, c)
        x = jnp.asarray(rng.standard_normal(x_shape), dtype)
        ws = [jnp.asarray(0.05 * rng.standard_normal(w_shape), dtype)
              for _ in range(args.filters)]
        dys = [jnp.asarray(rng.standard_normal(x_shape), dtype)
               for _ in range(args.filters)]
        fns = {m: _kernels(m, x_shape, w_shape) for m in methods}

        def operands(kernel: str, i: int) -> tuple[jax.Array, jax.Array]:
            w, dy = ws[i % args.filters], dys[i % args.filters]
            return {"forward": (x, w), "data": (dy, w), "weight": (x, dy)}[kernel]

        for by_kernel in fns.values():
            for kernel, f in by_kernel.items():
                jax.block_until_ready(f(*operands(kernel, 0)))
        times = {(m, k): [] for m in methods for k in fns[m]}
        for rep in range(args.reps):
            for i, m in enumerate(methods):
                for kernel, f in fns[m].items():
                    a = operands(kernel, rep * len(methods) + i)
                    t = time.perf_counter()
                    jax.block_until_ready(f(*a))
                    times[m, kernel].append(time.perf_counter() - t)
        for kernel in ("forward", "data", "weight"):
            fastest = {m: 1e3 * min(times[m, kernel]) for m in methods}
            row = {"layer": name, "kernel": kernel, "x": list(x_shape), "w": list(w_shape),
                   "fastest_ms": {m: round(v, 4) for m, v in fastest.items()},
                   "median_ms": {m: round(1e3 * statistics.median(times[m, kernel]), 4)
                                 for m in methods},
                   "over_baseline": {m: round(fastest[m] / fastest["baseline"], 3)
                                     for m in methods}}
            print(json.dumps(row))
            rows.append(row)
    machine.write(args.out, machine.result(
        "python -m benchmarks.winograd_tiles", reps=args.reps, filters=args.filters,
        dtype=args.dtype, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
