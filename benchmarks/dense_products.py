"""A bfloat16 dense layer's three products (forward, data gradient, kernel gradient) as XLA
computes them (``jax.vjp`` of ``x @ W``: the baseline), under ``jaxconv.accelerate``
(``jaxconv_matmul``, oneDNN's bfloat16 matmul where oneDNN computes bfloat16 natively) and by
torch (``x @ W``, ``dy @ W^T``, ``x^T @ dy`` in bfloat16, the products autograd runs for a
``torch.nn.Linear`` under ``torch.autocast``), interleaved in one process:

    python -m benchmarks.dense_products --out docs/benchmarks/dense-products-zen4.json

The shapes are ``benchmarks/transposed_product.py``'s: the ResNet classifiers (batch 8, 2048
and 512 -> 1000) and the MNIST CNN's first dense layer (batch 128, 3136 -> 256). Prints and
writes each method's fastest and median call in ms and its ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv
from benchmarks.transposed_product import SHAPES
from jaxconv._src import host_memory
from jaxconv._src.bench import machine


def _products(x: jax.Array, w: jax.Array, dy: jax.Array) -> Any:
    """y = x W and the vjp's dx and dW for cotangent dy."""
    y, vjp = jax.vjp(lambda x, w: x @ w, x, w)
    return y, *vjp(dy)


def _torch(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> Callable[[], Any] | None:
    try:
        import torch
    except ImportError:
        return None
    xt, wt, dyt = (torch.from_numpy(np.asarray(v, np.float32)).to(torch.bfloat16)
                   for v in (x, w, dy))
    wt_t = wt.t().contiguous()  # a Linear's weight: out x in

    def run() -> Any:
        return xt @ wt_t.t(), dyt @ wt_t, xt.t() @ dyt
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args(argv)
    rows = []
    host_memory.keep_by_default()  # as accelerate keeps it, for every method alike
    for i, (name, (batch, fan_in, fan_out)) in enumerate(SHAPES.items()):
        rng = np.random.default_rng(i)
        x, w, dy = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
                    for s in ((batch, fan_in), (fan_in, fan_out), (batch, fan_out)))
        xla, ours = jax.jit(_products), jax.jit(jaxconv.accelerate(_products))
        fns: dict[str, Callable[[], Any]] = {"baseline": lambda: xla(x, w, dy),
                                             "accelerate": lambda: ours(x, w, dy)}
        peer = _torch(np.asarray(x, np.float32), np.asarray(w, np.float32),
                      np.asarray(dy, np.float32))
        if peer is not None:
            fns["torch"] = peer
        times: dict[str, list[float]] = {k: [] for k in fns}
        for f in fns.values():
            jax.block_until_ready(f())
        order = list(fns)
        for _ in range(args.reps):
            random.shuffle(order)
            for k in order:
                t = time.perf_counter()
                jax.block_until_ready(fns[k]())
                times[k].append(time.perf_counter() - t)
        fastest = {k: 1e3 * min(v) for k, v in times.items()}
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        row = {"layer": name, "x": [batch, fan_in], "kernel": [fan_in, fan_out],
               "fastest_ms": {k: round(v, 4) for k, v in fastest.items()},
               "median_ms": {k: round(v, 4) for k, v in med.items()},
               "over_baseline": {k: round(v / fastest["baseline"], 3)
                                 for k, v in fastest.items()}}
        print(json.dumps(row))
        rows.append(row)
    machine.write(args.out, machine.result("python -m benchmarks.dense_products", reps=args.reps,
                                           rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
