"""Measured accuracy of jaxconv's ops in float16, bfloat16 and float32 against float64.

For benchdnn problems (minibatch capped at 2), each op runs on inputs rounded to the dtype, and
is compared with PyTorch autograd in float64 on the same rounded inputs:

    error = max |got - ref| / max |ref|

Configurations: float32 at Precision.HIGHEST and DEFAULT; float16 / bfloat16 with float32
accumulation (the default: result rounded to the dtype), with a float32 result
(``preferred_element_type=float32``), and accumulating in the dtype itself
(``preferred_element_type=<dtype>``). Writes JSON and prints the table of docs/precision.md.

usage: python -m benchmarks.precision [--per-list 4] [--out benchmarks/results/precision.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv
from jaxconv._src.bench import benchdnn

LISTS = ["conv_shapes_resnet_50", "conv_shapes_mobilenet", "conv_shapes_mobilenet_dw",
         "conv_shapes_3d", "conv_shapes_dilated", "deconv_shapes_2d"]
CONFIGS = {  # name -> (dtype, precision, preferred_element_type)
    "float32 HIGHEST": (jnp.float32, lax.Precision.HIGHEST, None),
    "float32 DEFAULT": (jnp.float32, None, None),
    "float16 (f32 accumulation)": (jnp.float16, None, None),
    "float16 -> float32 result": (jnp.float16, None, jnp.float32),
    "float16 accumulation": (jnp.float16, None, jnp.float16),
    "bfloat16 (f32 accumulation)": (jnp.bfloat16, None, None),
    "bfloat16 -> float32 result": (jnp.bfloat16, None, jnp.float32),
    "bfloat16 accumulation": (jnp.bfloat16, None, jnp.bfloat16),
}
OPS = ("convolution", "convolution_backward_data", "convolution_backprop_filters")
RESULTS = pathlib.Path(__file__).parent / "results"


def _torch_reference(x, w, dy, prob):
    import torch
    import torch.nn.functional as F
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[prob.rank]
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    pad = []
    for b, e in zip(reversed(prob.pads_begin), reversed(prob.pads_end)):
        pad += [b, e]
    y = conv(F.pad(xt, pad), wt, stride=prob.strides, dilation=prob.dilations, groups=prob.groups)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return {"convolution": y.detach().numpy(), "convolution_backward_data": xt.grad.numpy(),
            "convolution_backprop_filters": wt.grad.numpy()}


def measure(prob: benchdnn.Problem, seed: int = 0) -> dict[str, dict[str, float]]:
    """{config: {op: error}} for one problem (NCX / OIX)."""
    rng = np.random.default_rng(seed)
    g = prob.groups
    x0 = rng.standard_normal((prob.batch, prob.in_channels, *prob.input_size))
    w0 = rng.standard_normal((prob.out_channels, prob.in_channels // g, *prob.kernel))
    dy0 = rng.standard_normal((prob.batch, prob.out_channels, *prob.output_size))
    attrs = dict(strides=prob.strides, dilations=prob.dilations, pads_begin=prob.pads_begin,
                 pads_end=prob.pads_end, groups=g, data_format="NCX", filter_format="OIX")
    out = {}
    for name, (dtype, precision, pet) in CONFIGS.items():
        x, w, dy = (jnp.asarray(a, dtype) for a in (x0, w0, dy0))
        ref = _torch_reference(*(np.asarray(a.astype(jnp.float32), np.float64) for a in (x, w, dy)),
                               prob)
        kw = dict(attrs, precision=precision, preferred_element_type=pet)
        got = {"convolution": jaxconv.convolution(x, w, **kw),
               "convolution_backward_data": jaxconv.convolution_backward_data(dy, w, x.shape, **kw),
               "convolution_backprop_filters": jaxconv.convolution_backprop_filters(
                   x, dy, w.shape, **kw)}
        errs = {}
        for op in OPS:
            a = np.asarray(got[op].astype(jnp.float32), np.float64)
            if not np.all(np.isfinite(a)):
                errs[op] = float("inf")
                continue
            errs[op] = float(np.max(np.abs(a - ref[op])) / max(np.max(np.abs(ref[op])), 1e-300))
        out[name] = errs
    return out


def run(per_list: int | None, lists=LISTS) -> dict:
    rows = []
    for lst in lists:
        probs = benchdnn.load(lst, batch_cap=2)
        for prob in probs[:per_list] if per_list else probs:
            # (a deconv line's fields describe the convolution it transposes: the same ops)
            rows.append({"list": lst, "name": prob.name, "errors": measure(prob)})
    worst = {c: {op: max(r["errors"][c][op] for r in rows) for op in OPS} for c in CONFIGS}
    return {"rows": rows, "worst": worst}


def table(result: dict) -> str:
    lines = ["| configuration | " + " | ".join(OPS) + " |", "|---" * (len(OPS) + 1) + "|"]
    for c, errs in result["worst"].items():
        lines.append(f"| {c} | " + " | ".join(f"{errs[op]:.1e}" for op in OPS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-list", type=int, default=4, help="problems per list (0: all)")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS / "precision.json")
    args = ap.parse_args(argv)
    result = run(args.per_list or None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{len(result['rows'])} problems; worst max|got - ref| / max|ref| per configuration:")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
