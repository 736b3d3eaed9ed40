"""A dense layer's products through XLA (the baseline), under ``jaxconv.accelerate`` and by
torch, interleaved in one process. Two parts:

* training (the default): a bfloat16 layer's three products (forward, data gradient, kernel
  gradient) as XLA computes them (``jax.vjp`` of ``x @ W``), under ``accelerate``
  (``jaxconv_matmul``, oneDNN's bfloat16 matmul where oneDNN computes bfloat16 natively) and
  by torch (``x @ W``, ``dy @ W^T``, ``x^T @ dy`` in bfloat16, the products autograd runs for
  a ``torch.nn.Linear`` under ``torch.autocast``), at ``benchmarks/transposed_product.py``'s
  shapes: the ResNet classifiers (batch 8, 2048 and 512 -> 1000) and the MNIST CNN's first
  dense layer (batch 128, 3136 -> 256);

      python -m benchmarks.dense_products --out docs/benchmarks/dense-products-zen4.json

* ``--serving``: a float32 layer's forward at batch 1 and 8 (``x @ W``; accelerate's
  timed choice between XLA's product and the handler's sgemm in parts on XLA's pool, as a
  served model runs it) against torch's ``torch.nn.functional.linear`` under
  ``torch.inference_mode`` (its weight out x in, as a ``Linear`` holds it), at the
  classifiers of ResNet-18, ResNet-50 and MobileNetV2 and the MNIST CNN's two dense layers;
  each sample back-to-back calls for 20 ms after a lead-in (``timing.interleaved``).

      python -m benchmarks.dense_products --serving --out docs/benchmarks/dense-serving.json

Prints and writes each method's fastest and median call in ms and its ratio to the
baseline's, and for ``--serving`` which product accelerate's program holds.
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
from jaxconv._src.bench import machine, timing


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


#: ``--serving``'s layers: (fan in, fan out)
SERVING = {"resnet18 fc": (512, 1000), "resnet50 fc": (2048, 1000),
           "mobilenet_v2 fc": (1280, 1000), "mnist_cnn dense": (3136, 256),
           "mnist_cnn dense_1": (256, 10)}


def _torch_linear(x: np.ndarray, w: np.ndarray) -> Callable[[], Any] | None:
    try:
        import torch
    except ImportError:
        return None
    xt = torch.from_numpy(x.copy())
    wt = torch.from_numpy(np.ascontiguousarray(w.T))  # a Linear's weight: out x in

    def run() -> Any:
        with torch.inference_mode():
            return torch.nn.functional.linear(xt, wt)
    return run


def _timed(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[float]]:
    """Each call's times (s), in a fresh random order each repetition, after an untimed call
    of each."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        jax.block_until_ready(f())
    order = list(fns)
    for _ in range(reps):
        random.shuffle(order)
        for k in order:
            t = time.perf_counter()
            jax.block_until_ready(fns[k]())
            times[k].append(time.perf_counter() - t)
    return times


def _row(times: dict[str, list[float]], **fields: Any) -> dict[str, Any]:
    fastest = {k: 1e3 * min(v) for k, v in times.items()}
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return {**fields, "fastest_ms": {k: round(v, 4) for k, v in fastest.items()},
            "median_ms": {k: round(v, 4) for k, v in med.items()},
            "over_baseline": {k: round(v / fastest["baseline"], 3)
                              for k, v in fastest.items()}}


def training(reps: int) -> list[dict[str, Any]]:
    rows = []
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
        rows.append(_row(_timed(fns, reps), layer=name, x=[batch, fan_in],
                         kernel=[fan_in, fan_out]))
        print(json.dumps(rows[-1]))
    return rows


def serving(reps: int) -> list[dict[str, Any]]:
    rows = []
    for i, (name, (fan_in, fan_out)) in enumerate(SERVING.items()):
        for batch in (1, 8):
            rng = np.random.default_rng(i)
            x = rng.standard_normal((batch, fan_in)).astype(np.float32)
            w = rng.standard_normal((fan_in, fan_out)).astype(np.float32)
            xj, wj = jnp.asarray(x), jnp.asarray(w)

            def dense(x: jax.Array, w: jax.Array) -> jax.Array:
                return x @ w
            xla, ours = jax.jit(dense), jax.jit(jaxconv.accelerate(dense))
            held = "handler" if "jaxconv_onednn_matmul" in ours.lower(xj, wj).as_text() else "xla"
            fns: dict[str, Callable[[], Any]] = {"baseline": lambda: xla(xj, wj),
                                                 "accelerate": lambda: ours(xj, wj)}
            peer = _torch_linear(x, w)
            if peer is not None:
                fns["torch"] = peer
            gap = float(np.max(np.abs(np.asarray(ours(xj, wj), np.float64)
                                      - x.astype(np.float64) @ w.astype(np.float64))))
            # samples of back-to-back calls after a lead-in (timing.interleaved): torch's
            # OpenMP workers spin for milliseconds after its call, on the cores the next
            # contender's threads need
            rows.append(_row(timing.interleaved(fns, reps, seed=i), layer=name,
                             x=[batch, fan_in], kernel=[fan_in, fan_out], accelerate_runs=held,
                             accelerate_max_abs_error=gap))
            print(json.dumps(rows[-1]))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--serving", action="store_true",
                    help="float32 forwards at batch 1 and 8 (default: bfloat16 training)")
    args = ap.parse_args(argv)
    host_memory.keep_by_default()  # as accelerate keeps it, for every method alike
    rows = serving(args.reps) if args.serving else training(args.reps)
    command = "python -m benchmarks.dense_products" + (" --serving" if args.serving else "")
    machine.write(args.out, machine.result(command, reps=args.reps, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
