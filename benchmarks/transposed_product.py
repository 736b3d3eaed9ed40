"""A dense layer's kernel gradient and its momentum update in a bfloat16 step, as autodiff
writes it (``transpose(dot_general(dy, x))``, the product rounded to bfloat16 between the
two) and under ``jaxconv.accelerate`` (one ``dot_general(x, dy)``), interleaved in one
process with kept host memory (as ``accelerate`` keeps it; where JAX's backends already exist,
glibc's settings as it applies them then):

    python -m benchmarks.transposed_product --out benchmarks/results/transposed-product.json

The shapes are ResNet-50's classifier (batch 8, 2048 -> 1000), ResNet-18's (512 -> 1000) and
the MNIST CNN's first dense layer (batch 128, 3136 -> 256). Prints and writes the medians in
ms and the ratio accelerated / written.
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
from jaxconv._src import host_memory
from jaxconv._src.bench import machine

SHAPES = {"resnet50 fc": (8, 2048, 1000), "resnet18 fc": (8, 512, 1000),
          "mnist_cnn dense": (128, 3136, 256)}


def _update(kernel, momentum, x, dy):
    """The kernel gradient of ``x @ kernel`` (bfloat16) for cotangent ``dy``, into a momentum
    update (float32), as a training step computes it."""
    _, vjp = jax.vjp(lambda k: x @ k.astype(jnp.bfloat16), kernel)
    (grad,) = vjp(dy)
    return 0.9 * momentum + grad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    host_memory.keep_by_default()
    rng = np.random.default_rng(0)
    rows = []
    for name, (batch, fan_in, fan_out) in SHAPES.items():
        x = jnp.asarray(rng.standard_normal((batch, fan_in)), jnp.bfloat16)
        dy = jnp.asarray(rng.standard_normal((batch, fan_out)), jnp.bfloat16)
        kernel = jnp.asarray(rng.standard_normal((fan_in, fan_out)), jnp.float32)
        momentum = jnp.zeros_like(kernel)
        fns = {"written": jax.jit(_update), "accelerate": jax.jit(jaxconv.accelerate(_update))}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for f in fns.values():
            jax.block_until_ready(f(kernel, momentum, x, dy))
        for _ in range(args.reps):
            for k, f in fns.items():
                t = time.perf_counter()
                jax.block_until_ready(f(kernel, momentum, x, dy))
                times[k].append(time.perf_counter() - t)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        row = {"layer": name, "x": [batch, fan_in], "kernel": [fan_in, fan_out],
               "median_ms": {k: round(v, 4) for k, v in med.items()},
               "accelerate_over_written": round(med["accelerate"] / med["written"], 3)}
        print(json.dumps(row))
        rows.append(row)
    machine.write(args.out, machine.result("python -m benchmarks.transposed_product", reps=args.reps,
                                           rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
