"""Measured accuracy of the Winograd lowerings against float64, beside direct convolution.

Every 2D 3x3 stride-1, dilation-1, ungrouped problem of the benchdnn lists (minibatch capped at
2; pads within [0, 2]) runs in float32 four ways: oneDNN's direct convolution
(``lowering="onednn"``), Winograd F(2x2, 3x3), F(3x3, 3x3) and F(4x4, 3x3) (``"winograd_2x2"``,
``"winograd_3x3"``, ``"winograd_4x4"``), for the forward, the data gradient and the weight
gradient, on the same random normal inputs, and each result is compared with PyTorch autograd
in float64:

    error = max |got - ref| / max |ref|

(the measure of ``jaxconv.testing.TOLERANCE``, whose float32 bound is 2e-5). Writes JSON with
every problem's errors and prints the worst and median per method and kernel
(docs/precision.md, "Winograd").

usage: python -m benchmarks.winograd_precision [--out docs/benchmarks/winograd-precision.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax.numpy as jnp
import numpy as np

import jaxconv
from benchmarks.precision import OPS, _torch_reference
from jaxconv._src.bench import benchdnn, machine

LISTS = ["conv_shapes_resnet_50", "conv_shapes_basic", "conv_shapes_mobilenet",
         "conv_shapes_dilated", "conv_shapes_3d"]
METHODS = ("onednn", "winograd_2x2", "winograd_3x3", "winograd_4x4")
RESULTS = pathlib.Path(__file__).parent / "results"


def problems() -> list[benchdnn.Problem]:
    """The lists' 2D 3x3 stride-1 problems Winograd takes, each shape once."""
    seen, found = set(), []
    for name in LISTS:
        for prob in benchdnn.load(name, batch_cap=2):
            if (prob.rank == 2 and tuple(prob.kernel) == (3, 3) and tuple(prob.strides) == (1, 1)
                    and tuple(prob.dilations) == (1, 1) and prob.groups == 1
                    and all(0 <= q <= 2 for q in (*prob.pads_begin, *prob.pads_end))):
                key = (prob.batch, prob.in_channels, prob.out_channels, tuple(prob.input_size),
                       tuple(prob.pads_begin), tuple(prob.pads_end))
                if key not in seen:
                    seen.add(key)
                    found.append(prob)
    return found


def measure(prob: benchdnn.Problem, seed: int = 0) -> dict[str, dict[str, float]]:
    """{method: {op: error}} for one problem (NCX / OIX, float32)."""
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((prob.batch, prob.in_channels, *prob.input_size)).astype(np.float32)
    w0 = rng.standard_normal((prob.out_channels, prob.in_channels, 3, 3)).astype(np.float32)
    dy0 = rng.standard_normal((prob.batch, prob.out_channels, *prob.output_size)).astype(np.float32)
    ref = _torch_reference(*(a.astype(np.float64) for a in (x0, w0, dy0)), prob)
    attrs = dict(strides=1, pads_begin=prob.pads_begin, pads_end=prob.pads_end,
                 data_format="NCX", filter_format="OIX")
    x, w, dy = (jnp.asarray(a) for a in (x0, w0, dy0))
    out = {}
    for method in METHODS:
        got = {"convolution": jaxconv.convolution(x, w, lowering=method, **attrs),
               "convolution_backward_data": jaxconv.convolution_backward_data(
                   dy, w, x.shape, lowering=method, **attrs),
               "convolution_backprop_filters": jaxconv.convolution_backprop_filters(
                   x, dy, w.shape, lowering=method, **attrs)}
        out[method] = {op: float(np.max(np.abs(np.asarray(got[op], np.float64) - ref[op]))
                                 / np.max(np.abs(ref[op]))) for op in OPS}
    return out


def run() -> dict:
    rows = [{"name": p.name, "batch": p.batch, "channels": [p.in_channels, p.out_channels],
             "input": list(p.input_size), "errors": measure(p)} for p in problems()]
    summary = {m: {op: {"worst": max(r["errors"][m][op] for r in rows),
                        "median": float(np.median([r["errors"][m][op] for r in rows]))}
                   for op in OPS} for m in METHODS}
    return {"machine": machine.describe(), "command": "python -m benchmarks.winograd_precision",
            "problems": len(rows), "summary": summary, "rows": rows}


def table(result: dict) -> str:
    lines = ["| method | " + " | ".join(f"{op} worst (median)" for op in OPS) + " |",
             "|---" * (len(OPS) + 1) + "|"]
    for m, ops in result["summary"].items():
        lines.append(f"| {m} | " + " | ".join(
            f"{ops[op]['worst']:.1e} ({ops[op]['median']:.1e})" for op in OPS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.winograd_precision",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS / "winograd-precision.json")
    args = ap.parse_args(argv)
    result = run()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['problems']} problems; max|got - ref| / max|ref| against float64:")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
