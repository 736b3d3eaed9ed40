"""Where ``lowering="onednn"`` beats today's CPU choice: the measurements behind the CPU table.

For the benchdnn problems of the chosen lists, and each kernel (weight gradient, data
gradient, forward), times interleaved in one process: jaxconv with ``lowering="auto"`` as the
CPU table chose before oneDNN (``--without-onednn`` semantics: the table's XLA formulation),
jaxconv with ``lowering="onednn"``, and PyTorch (``torch.ops.aten.convolution_backward`` with
the one output's mask; ``F.conv*`` for the forward; the faster of NCHW and channels-last).

    python -m benchmarks.onednn_choice --per-list 2 --out docs/benchmarks/onednn_choice.json

Prints one row per problem and kernel, and writes the JSON (medians in ms; ratios).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv
from jaxconv._src.bench import benchdnn
from jaxconv._src.kernel import Kernel
from jaxconv._src.native import library

LISTS = ["conv_shapes_resnet_50", "conv_shapes_mobilenet", "conv_shapes_mobilenet_dw",
         "conv_shapes_3d", "conv_shapes_dilated", "deconv_shapes_2d", "deconv_shapes_3d"]


def _callables(prob: benchdnn.Problem, kernel: Kernel) -> tuple[dict, tuple]:
    rng = np.random.default_rng(0)
    n, g = prob.batch, prob.groups
    x = jnp.asarray(rng.standard_normal((n, *prob.input_size, prob.in_channels)), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((n, *prob.output_size, prob.out_channels)), jnp.float32)
    w_shape = (*prob.kernel, prob.in_channels // g, prob.out_channels)
    w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32)
    attrs = dict(strides=prob.strides, dilations=prob.dilations, pads_begin=prob.pads_begin,
                 pads_end=prob.pads_end, groups=g)

    def make(lowering: str):
        if kernel is Kernel.WEIGHT:
            return jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(
                x, dy, w_shape, **attrs, lowering=lowering))
        if kernel is Kernel.DATA:
            return jax.jit(lambda dy, w: jaxconv.convolution_backward_data(
                dy, w, prob.input_size, **attrs, lowering=lowering))
        return jax.jit(lambda x, w: jaxconv.convolution(x, w, **attrs, lowering=lowering))

    args = {Kernel.WEIGHT: (x, dy), Kernel.DATA: (dy, w), Kernel.FORWARD: (x, w)}[kernel]
    return {"auto": make("auto"), "onednn": make("onednn")}, args


def _torch(prob: benchdnn.Problem, kernel: Kernel, args: tuple):
    import torch

    g, r = prob.groups, prob.rank
    x = torch.randn(prob.batch, prob.in_channels, *prob.input_size)
    w = torch.randn(prob.out_channels, prob.in_channels // g, *prob.kernel)
    dy = torch.randn(prob.batch, prob.out_channels, *prob.output_size)
    if list(prob.pads_begin) != list(prob.pads_end):
        return None
    pad = list(prob.pads_begin)
    mask = {Kernel.WEIGHT: [False, True, False], Kernel.DATA: [True, False, False]}.get(kernel)
    fmt = {1: torch.contiguous_format, 2: torch.channels_last, 3: torch.channels_last_3d}[r]
    best = []
    for layout in (torch.contiguous_format, fmt):
        xl, wl, dyl = (t.contiguous(memory_format=layout) for t in (x, w, dy))

        def run(xl=xl, wl=wl, dyl=dyl):
            with torch.no_grad():
                if mask is None:
                    return torch.ops.aten.convolution(xl, wl, None, list(prob.strides), pad,
                                                      list(prob.dilations), False, [0] * r, g)
                return torch.ops.aten.convolution_backward(
                    dyl, xl, wl, None, list(prob.strides), pad, list(prob.dilations), False,
                    [0] * r, g, mask)
        best.append(run)
    return best


def _time(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lists", nargs="+", default=LISTS)
    ap.add_argument("--per-list", type=int, default=3)
    ap.add_argument("--batch-cap", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kernels", nargs="+", default=["weight", "data", "forward"])
    ap.add_argument("--out", default="benchmarks/results/onednn_choice.json")
    args = ap.parse_args(argv)
    status = library.status()
    print(status.line())
    if not status.available:
        return 1
    rows = []
    for name in args.lists:
        for prob in benchdnn.load(name, batch_cap=args.batch_cap)[:args.per_list]:
            if prob.transposed:
                continue
            for kname in args.kernels:
                kernel = Kernel(kname)
                fns, a = _callables(prob, kernel)
                calls = {k: (lambda f=f: f(*a)) for k, f in fns.items()}
                torch_runs = _torch(prob, kernel, a)
                for i, run in enumerate(torch_runs or []):
                    calls[f"torch{i}"] = run
                for f in calls.values():  # compile and warm up
                    jax.block_until_ready(f())
                times: dict[str, list[float]] = {k: [] for k in calls}
                for _ in range(args.reps):  # interleaved
                    for k, f in calls.items():
                        times[k] += _time(f, 1)
                med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
                torch_ms = min((v for k, v in med.items() if k.startswith("torch")), default=None)
                row = dict(list=name, problem=prob.name, kernel=kname, auto_ms=med["auto"],
                           onednn_ms=med["onednn"], torch_ms=torch_ms,
                           auto_over_onednn=med["auto"] / med["onednn"],
                           onednn_over_torch=(med["onednn"] / torch_ms) if torch_ms else None)
                rows.append(row)
                print(f"{name:26s} {prob.name[:28]:28s} {kname:8s} auto {med['auto']:9.2f} "
                      f"onednn {med['onednn']:9.2f} torch {torch_ms or float('nan'):9.2f} ms "
                      f"auto/onednn {row['auto_over_onednn']:6.2f}")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(onednn=status.line(), rows=rows), indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
