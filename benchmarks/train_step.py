"""One full training step (forward + backward + SGD) of real blocks: lax's convolution vs jaxconv's.

Each block is built from benchdnn shapes (``jaxconv/_src/bench/shapes``) and written once, taking its
convolution as an argument; the two contenders run the same parameters, data and loss:

* ``lax``: ``jax.lax.conv_general_dilated`` (what ``flax.nnx.Conv`` and ``eqx.nn.Conv`` call),
  and for the decoder's transposed convolution ``jax.lax.conv_transpose``;
* ``jaxconv``: ``jaxconv.conv_general_dilated`` (what ``jaxconv.flax.Conv`` calls), and
  ``jaxconv.conv_transpose`` (what the ConvTranspose layers call);
* ``jaxconv_vmap``: the same convolutions in equinox's style: the block is written for one
  example and the loss maps it over the batch with ``jax.vmap`` inside the gradient (the
  batching rule folds the mapped axis back into the convolutions' batch, so the step should
  cost what ``jaxconv``'s does);
* ``torch``: PyTorch, when installed: the same block as ``torch.nn`` modules holding the same
  parameters, the same batch, target and loss, forward + backward + ``torch.optim.SGD``, in
  its faster memory format (``benchmarks/train_step_torch.py``).

The step is ``jax.jit(value_and_grad(loss))`` plus an SGD update, timed interleaved in one
process (a fresh random order each repetition, calls per sample autoranged to >= 20 ms,
medians). One step of every contender from the same parameters must agree (``loss_gap``,
``param_gap``: the largest difference from the first contender's). Writes JSON and a plot;
``speedup`` is lax's step time over jaxconv's (> 1: jaxconv faster), ``torch_ratio`` torch's
over jaxconv's (>= 1: jaxconv no slower than PyTorch), and ``vmap_ratio`` jaxconv's batched
step time over its equinox-style one (1: as fast). ``page_faults_per_step`` and
``system_ms_per_step`` say how much of each contender's step was the kernel handing out fresh
memory (XLA:CPU allocates each execution's temporaries anew; glibc's settings, recorded in
``meta.malloc_env``, decide whether those are new pages: docs/performance.md, "Host memory").

usage: python -m benchmarks.train_step [--reps 5] [--batch 8] [--keep-freed-memory]
                                       [--out benchmarks/results/train_step.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import resource
import statistics
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv
from benchmarks.train_step_torch import torch_step
from jaxconv._src import host_memory
from jaxconv._src.bench.run import _time_n, calls_per_sample, cpu_model, geomean
from jaxconv._src.bench.timing import settle

RESULTS = pathlib.Path(__file__).parent / "results"
Conv = Callable[..., jax.Array]


def _conv2d(conv: Conv, x: jax.Array, w: jax.Array, stride: int = 1, groups: int = 1) -> jax.Array:
    k = w.shape[0]
    pad = [((k - 1) // 2, k // 2)] * (x.ndim - 2)
    dn = ("NHWC", "HWIO", "NHWC") if x.ndim == 4 else ("NDHWC", "DHWIO", "NDHWC")
    return conv(x, w, (stride,) * (x.ndim - 2), pad, dimension_numbers=dn,
                feature_group_count=groups)


def _init(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, jax.Array]:
    return {k: jnp.asarray(rng.standard_normal(s) / math.sqrt(math.prod(s[:-1])), jnp.float32)
            for k, s in shapes.items()}


# Each block: (description, parameter shapes, input shape, forward(conv, convT, params, x)).
def mobilenet_v2_inverted_residual(batch: int) -> tuple:
    # mobilenet_dw list: 56x56, 144 channels, depthwise 3x3 (expand 24 -> 144 -> project 24)
    c, e, hw = 24, 144, 56
    shapes = {"expand": (1, 1, c, e), "dw": (3, 3, 1, e), "project": (1, 1, e, c)}

    def fwd(conv, convt, p, x):
        h = jax.nn.relu6(_conv2d(conv, x, p["expand"]))
        h = jax.nn.relu6(_conv2d(conv, h, p["dw"], groups=e))
        return x + _conv2d(conv, h, p["project"])
    return "MobileNetV2 inverted residual (56x56, 24->144->24, depthwise 3x3)", shapes, \
        (batch, hw, hw, c), fwd


def resnext_bottleneck(batch: int) -> tuple:
    # ResNeXt-50 32x4d conv3 stage: 28x28, 256 -> 256 (3x3, 32 groups) -> 512
    cin, mid, cout, hw, g = 512, 256, 512, 28, 32
    shapes = {"a": (1, 1, cin, mid), "b": (3, 3, mid // g, mid), "c": (1, 1, mid, cout)}

    def fwd(conv, convt, p, x):
        h = jax.nn.relu(_conv2d(conv, x, p["a"]))
        h = jax.nn.relu(_conv2d(conv, h, p["b"], groups=g))
        return jax.nn.relu(x + _conv2d(conv, h, p["c"]))
    return "ResNeXt bottleneck (28x28, 512->256 g32 3x3->512)", shapes, (batch, hw, hw, cin), fwd


def resnet50_bottleneck(batch: int) -> tuple:
    # resnet_50 res3 (res3b_branch2a/2b/2c): 28x28, 512 -> 128 -> 128 (3x3) -> 512
    cin, mid, hw = 512, 128, 28
    shapes = {"a": (1, 1, cin, mid), "b": (3, 3, mid, mid), "c": (1, 1, mid, cin)}

    def fwd(conv, convt, p, x):
        h = jax.nn.relu(_conv2d(conv, x, p["a"]))
        h = jax.nn.relu(_conv2d(conv, h, p["b"]))
        return jax.nn.relu(x + _conv2d(conv, h, p["c"]))
    return "ResNet-50 bottleneck (28x28, 512->128->128->512)", shapes, (batch, hw, hw, cin), fwd


def unet3d_level(batch: int) -> tuple:
    # 3D U-Net encoder level (conv_shapes_3d scale): 16^3, 32 -> 32 -> 32, 3x3x3
    c, s = 32, 16
    shapes = {"a": (3, 3, 3, c, c), "b": (3, 3, 3, c, c)}

    def fwd(conv, convt, p, x):
        h = jax.nn.relu(_conv2d(conv, x, p["a"]))
        return jax.nn.relu(_conv2d(conv, h, p["b"]))
    return "3D U-Net level (16^3, 32 channels, two 3x3x3)", shapes, \
        (max(1, batch // 4), s, s, s, c), fwd


def deconv_decoder(batch: int) -> tuple:
    # a decoder stage: ConvTranspose 2x2 stride 2 (28 -> 56, 128 -> 64), then a 3x3 conv
    cin, cout, hw = 128, 64, 28
    shapes = {"up": (2, 2, cout, cin), "conv": (3, 3, cout, cout)}  # up: XOI (oneDNN order)

    def fwd(conv, convt, p, x):
        h = jax.nn.relu(convt(x, p["up"]))
        return jax.nn.relu(_conv2d(conv, h, p["conv"]))
    return "Transposed-conv decoder stage (28->56, 128->64, then 3x3)", shapes, \
        (batch, hw, hw, cin), fwd


def _lax_convt(x: jax.Array, w_xoi: jax.Array) -> jax.Array:
    # the gradient of a stride-2 convolution whose (K, K, O, I) filter maps O -> I channels
    return lax.conv_transpose(x, w_xoi, (2, 2), "VALID",
                              dimension_numbers=("NHWC", "HWIO", "NHWC"), transpose_kernel=True)


def _jaxconv_convt(x: jax.Array, w_xoi: jax.Array) -> jax.Array:
    # the same transposed convolution: jaxconv's ConvTranspose with XOI weights
    return jaxconv.conv_transpose(x, w_xoi, strides=2, filter_format="XOI")


BLOCKS = {"mobilenet_v2": mobilenet_v2_inverted_residual, "resnext": resnext_bottleneck,
          "resnet50": resnet50_bottleneck, "unet3d": unet3d_level, "decoder": deconv_decoder}
#: name -> (convolution, transposed convolution, whether the block runs per example under vmap)
CONTENDERS = {"lax": (lax.conv_general_dilated, _lax_convt, False),
              "jaxconv": (jaxconv.conv_general_dilated, _jaxconv_convt, False),
              "jaxconv_vmap": (jaxconv.conv_general_dilated, _jaxconv_convt, True)}
#: every contender the benchmark times: the JAX ones, and PyTorch's nn modules
NAMES = (*CONTENDERS, "torch")
LR = 1e-3


def make_step(fwd: Callable, conv: Conv, convt: Conv, per_example: bool = False,
              lr: float = LR) -> Callable:
    def model(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        if not per_example:
            return fwd(conv, convt, p, x)
        # equinox's idiom: the block sees one example (a batch of one), vmapped over the batch
        return jax.vmap(lambda xi: fwd(conv, convt, p, xi[None])[0])(x)

    def loss(p: dict[str, jax.Array], x: jax.Array, target: jax.Array) -> jax.Array:
        return jnp.mean((model(p, x) - target) ** 2)

    @jax.jit
    def step(p: dict[str, jax.Array], x: jax.Array,
             target: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x, target)
        return jax.tree.map(lambda a, g: a - lr * g, p, grads), value
    return step


def measure(name: str, batch: int, reps: int,
            contenders: tuple[str, ...] = NAMES) -> dict[str, Any]:
    desc, shapes, x_shape, fwd = BLOCKS[name](batch)
    rng = np.random.default_rng(0)
    params = _init(rng, shapes)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    target = jnp.asarray(rng.standard_normal(jax.eval_shape(
        lambda p, x: fwd(*CONTENDERS["lax"][:2], p, x), params, x).shape), jnp.float32)
    # every contender as a zero-argument step, and what one step from `params` gives
    steps: dict[str, Callable] = {}
    first_step: dict[str, tuple[float, dict[str, np.ndarray]]] = {}
    torch_layout = None
    for k in contenders:
        if k == "torch":
            made = torch_step(name, {n: np.asarray(v) for n, v in params.items()}, np.asarray(x),
                              np.asarray(target), LR)
            if made is None:
                continue  # torch not installed
            steps[k], info = made
            first_step[k], torch_layout = (info["loss"], info["params"]), info["layout"]
            continue
        step = make_step(fwd, *CONTENDERS[k])
        new, value = step(params, x, target)
        first_step[k] = (float(value), {n: np.asarray(v) for n, v in new.items()})
        steps[k] = lambda s=step: s(params, x, target)
    # same parameters, same loss: one step of each must agree with the first contender's
    ref_loss, ref_params = first_step[next(iter(first_step))]
    loss_gap = max(abs(ref_loss - v) for v, _ in first_step.values())
    param_gap = max(float(np.max(np.abs(ref_params[n] - new[n]))) for _, new in first_step.values()
                    for n in ref_params)
    calls = {k: calls_per_sample(fn) for k, fn in steps.items()}
    order = np.random.default_rng(0)
    times: dict[str, list[float]] = {k: [] for k in steps}
    # what the process asked of the kernel per step: minor page faults (fresh memory: XLA:CPU
    # allocates each execution's temporaries anew) and system CPU time, summed over the reps
    faults = {k: 0 for k in steps}
    sys_s = {k: 0.0 for k in steps}
    for _ in range(reps):
        for k in order.permutation(list(steps)):
            settle(steps[k], calls[k])
            before = resource.getrusage(resource.RUSAGE_SELF)
            times[k].append(_time_n(steps[k], calls[k]) / calls[k])
            after = resource.getrusage(resource.RUSAGE_SELF)
            faults[k] += after.ru_minflt - before.ru_minflt
            sys_s[k] += after.ru_stime - before.ru_stime
    med = {k: statistics.median(v) for k, v in times.items()}
    n_steps = {k: reps * calls[k] for k in steps}
    return {"block": name, "description": desc, "input": list(x_shape),
            "median_ms": {k: v * 1e3 for k, v in med.items()},
            "speedup": _ratio(med, "lax", "jaxconv"), "torch_ratio": _ratio(med, "torch", "jaxconv"),
            "vmap_ratio": _ratio(med, "jaxconv", "jaxconv_vmap"), "torch_layout": torch_layout,
            "loss_gap": loss_gap, "param_gap": param_gap,
            "page_faults_per_step": {k: faults[k] / n_steps[k] for k in steps},
            "system_ms_per_step": {k: sys_s[k] / n_steps[k] * 1e3 for k in steps}}


def _ratio(med: dict[str, float], num: str, den: str) -> float:
    return med[num] / med[den] if num in med and den in med else math.nan


def plot(rows: list[dict[str, Any]], path: pathlib.Path, backend: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = [r["block"] for r in rows]
    ax.bar(names, [r["speedup"] for r in rows], color="tab:blue")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("lax step time / jaxconv step time")
    ax.set_title(f"one training step (fwd + bwd + SGD), {backend}, float32", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", nargs="+", choices=sorted(BLOCKS), default=list(BLOCKS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--contenders", nargs="+", choices=list(NAMES), default=list(NAMES),
                    help="which steps to time (default: all; the first is the reference of the gaps)")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS / "train_step.json")
    ap.add_argument("--keep-freed-memory", action="store_true",
                    help="call jaxconv.keep_freed_memory() first (freed memory kept in the process)")
    args = ap.parse_args(argv)
    if args.keep_freed_memory and not jaxconv.keep_freed_memory():
        raise SystemExit("--keep-freed-memory: needs Linux with glibc")
    rows = [measure(b, args.batch, args.reps, tuple(args.contenders)) for b in args.blocks]
    result = {"meta": {"jax": jax.__version__, "backend": jax.default_backend(),
                       "contenders": args.contenders, "cpu": cpu_model(),
                       "cpu_count": os.cpu_count(), "platform": platform.platform(),
                       "batch": args.batch, "reps": args.reps,
                       # glibc's allocator settings decide how much of a step is page faults
                       "malloc_env": {k: v for k, v in os.environ.items()
                                      if k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))},
                       "keeps_freed_memory": host_memory.keeps_freed_memory()
                       or args.keep_freed_memory,
                       "keep_freed_memory_called": args.keep_freed_memory},
              "geomean_speedup": geomean(r["speedup"] for r in rows),
              "geomean_torch_ratio": geomean(r["torch_ratio"] for r in rows),
              "geomean_vmap_ratio": geomean(r["vmap_ratio"] for r in rows), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(rows, args.out.with_suffix(".png"), jax.default_backend())
    print(f"{'block':14s} {'lax ms':>9s} {'jaxconv ms':>11s} {'vmap ms':>9s} {'torch ms':>9s} "
          f"{'speed-up':>9s} {'torch/ours':>10s} {'vmap ratio':>10s} {'loss gap':>9s}  "
          f"page faults per step")
    for r in rows:
        m = {k: r["median_ms"].get(k, math.nan) for k in NAMES}
        print(f"{r['block']:14s} {m['lax']:9.2f} {m['jaxconv']:11.2f} {m['jaxconv_vmap']:9.2f} "
              f"{m['torch']:9.2f} {r['speedup']:9.2f} {r['torch_ratio']:10.2f} "
              f"{r['vmap_ratio']:10.2f} {r['loss_gap']:9.1e}  "
              + " ".join(f"{k} {v:.0f}" for k, v in r["page_faults_per_step"].items()))
    print(f"geomean speed-up {result['geomean_speedup']:.2f}, torch/jaxconv "
          f"{result['geomean_torch_ratio']:.2f}, vmap ratio {result['geomean_vmap_ratio']:.2f}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
