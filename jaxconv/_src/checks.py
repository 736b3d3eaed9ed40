"""``jaxconv check``: every public op against ``jax.vjp`` on the current backend.

One grouped, strided, dilated, asymmetrically padded 2D problem (the shape of
the hazards the test suite guards) is built in NCX / OIX. The references use
only ``lax.conv_general_dilated`` with explicit padding and ``jax.vjp`` of it,
never jaxconv's geometry:

* forward ops: ``lax.conv_general_dilated`` itself;
* data / weight gradients: ``jax.vjp`` of it w.r.t. ``x`` / ``W``;
* transposed convolutions: ``ct(y, W) = vjp_x(conv(., W))(y)``, and their
  gradients ``jax.vjp`` of ``ct`` w.r.t. its input or its weights.

Each op's layouts are mapped onto that one problem (ConvTranspose IOX weights
*are* the convolution's OIX array; OpenVINO filters are its reshape to
``[G, C, C', *K]``; Ascend TBE tensors are packed with :mod:`jaxconv.tbe`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv
from jaxconv import tbe
from jaxconv._src import lax_refs

HIGHEST = lax.Precision.HIGHEST
TOLERANCE = 1e-5  # max |got - ref| / max |ref|, float32 at Precision.HIGHEST

# The problem: N2, 4 -> 6 channels in 2 groups, 9x7, kernel 3x2, strides (2, 1),
# dilations (1, 2), pads (1, 0) / (0, 1). Every axis has a remainder or a crop.
N, CX, CY, G = 2, 4, 6, 2
SPATIAL, KERNEL = (9, 7), (3, 2)
STRIDES, DILATIONS, PB, PE = (2, 1), (1, 2), (1, 0), (0, 1)
DN = ("NCHW", "OIHW", "NCHW")


@dataclasses.dataclass(frozen=True)
class CheckResult:
    op: str
    family: str
    shape: tuple[int, ...]
    error: float
    seconds: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.error)) and self.error <= TOLERANCE


def _conv(x: jax.Array, w: jax.Array, groups: int = G) -> jax.Array:
    return lax_refs.conv_general_dilated(x, w, STRIDES, list(zip(PB, PE)), rhs_dilation=DILATIONS,
                                    dimension_numbers=DN, feature_group_count=groups,
                                    precision=HIGHEST)


def _ct(y: jax.Array, w: jax.Array, x_shape: tuple[int, ...], groups: int = G) -> jax.Array:
    """The transposed convolution: vjp of the convolution w.r.t. its input."""
    dx: jax.Array = jax.vjp(lambda x: _conv(x, w, groups), jnp.zeros(x_shape, y.dtype))[1](y)[0]
    return dx


def _cases() -> list[tuple[str, str, Callable[[], jax.Array], Callable[[], jax.Array]]]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((N, CX, *SPATIAL)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((CY, CX // G, *KERNEL)), jnp.float32)  # OIX
    w1 = jnp.asarray(rng.standard_normal((CY, CX, *KERNEL)), jnp.float32)  # groups = 1
    y = _conv(x, w)
    dy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    # ConvTranspose output_padding: the rows of x the forward convolution never reads.
    rem = tuple((i + b + e - ((k - 1) * d + 1)) % s
                for i, k, s, d, b, e in zip(SPATIAL, KERNEL, STRIDES, DILATIONS, PB, PE))
    a: dict[str, Any] = dict(strides=STRIDES, dilations=DILATIONS, pads_begin=PB, pads_end=PE,
             data_format="NCX", precision=HIGHEST)
    onednn: dict[str, Any] = dict(a, groups=G)
    ov: dict[str, Any] = dict(strides=STRIDES, dilations=DILATIONS, pads_begin=PB, pads_end=PE,
                              output_padding=rem, precision=HIGHEST)

    def vjp_x(f: Callable[[jax.Array], jax.Array], at: jax.Array) -> jax.Array:
        grad: jax.Array = jax.vjp(f, at)[1](dy)[0]
        return grad

    ct_ref = _ct(dy, w, x.shape)
    # OpenVINO filters: [G, C_OUT, C_IN, *K] (GroupConvolution) and [G, C_IN, C_OUT, *K]
    # (its backprop data) are both this one reshape of the OIX array.
    ov_filters = w.reshape(G, CY // G, CX // G, *KERNEL)
    dw_ref = vjp_x(lambda v: _conv(x, v), w)

    # Ascend TBE: 5HD x / dy; the FRACTAL_Z result unpacked to OIHW.
    para = {"strides": list(STRIDES), "padding": [PB[0], PE[0], PB[1], PE[1]],
            "dilations": [1, 1, *DILATIONS], "groups": G}

    def tbe_dw() -> jax.Array:
        res = jaxconv.conv2d_backprop_filter(tbe.to_5hd(x), tbe.to_5hd(dy), w.shape, para)
        return tbe.from_fractal_z(res, w.shape, G)

    ir = _gcbd_ir(dy.shape, ov_filters.shape, x.shape, rem)

    return [
        ("convolution", "oneDNN", lambda: jaxconv.convolution(x, w, filter_format="OIX", **onednn),
         lambda: y),
        ("convolution_backward_data", "oneDNN",
         lambda: jaxconv.convolution_backward_data(dy, w, SPATIAL, filter_format="OIX", **onednn),
         lambda: vjp_x(lambda v: _conv(v, w), x)),
        ("convolution_backprop_filters", "oneDNN",
         lambda: jaxconv.convolution_backprop_filters(x, dy, w.shape, filter_format="OIX",
                                                      **onednn),
         lambda: dw_ref),
        ("convolution_backward_weights", "oneDNN",
         lambda: jaxconv.convolution_backward_weights(x, dy, w.shape, weights_format="OIX",
                                                      **onednn),
         lambda: dw_ref),
        ("conv_transpose", "oneDNN",
         lambda: jaxconv.conv_transpose(dy, w, filter_format="IOX", output_padding=rem, **onednn),
         lambda: ct_ref),
        ("conv_transpose_backward_data", "oneDNN",
         lambda: jaxconv.conv_transpose_backward_data(x, w, filter_format="IOX",
                                                      output_padding=rem, **onednn),
         lambda: jax.vjp(lambda v: _ct(v, w, x.shape), dy)[1](x)[0]),
        ("conv_transpose_backward_weights", "oneDNN",
         lambda: jaxconv.conv_transpose_backward_weights(dy, x, w.shape, weights_format="IOX",
                                                         output_padding=rem, **onednn),
         lambda: jax.vjp(lambda v: _ct(dy, v, x.shape), w)[1](x)[0]),
        ("conv_transpose_backprop_filters", "oneDNN",
         lambda: jaxconv.conv_transpose_backprop_filters(dy, x, w.shape, filter_format="IOX",
                                                         output_padding=rem, **onednn),
         lambda: jax.vjp(lambda v: _ct(dy, v, x.shape), w)[1](x)[0]),
        ("group_convolution", "OpenVINO",
         lambda: jaxconv.group_convolution(x, ov_filters, strides=STRIDES, dilations=DILATIONS,
                                           pads_begin=PB, pads_end=PE, precision=HIGHEST),
         lambda: y),
        ("convolution_backprop_data", "OpenVINO",
         lambda: jaxconv.convolution_backprop_data(dy, w1, **ov),  # filters [C_IN, C_OUT, *K]
         lambda: _ct(dy, w1, x.shape, 1)),
        ("group_convolution_backprop_data", "OpenVINO",
         lambda: jaxconv.group_convolution_backprop_data(dy, ov_filters, **ov),
         lambda: ct_ref),
        ("from_openvino_ir", "OpenVINO",
         lambda: jaxconv.from_openvino_ir(ir)[0](dy, ov_filters), lambda: ct_ref),
        ("conv2d_backprop_filter", "Ascend TBE", tbe_dw, lambda: dw_ref),
    ]


def _gcbd_ir(data: tuple[int, ...], filters: tuple[int, ...], out: tuple[int, ...],
             rem: tuple[int, ...]) -> str:
    def dims(shape: tuple[int, ...]) -> str:
        return "".join(f"<dim>{d}</dim>" for d in shape)

    def csv(v: tuple[int, ...]) -> str:
        return ",".join(map(str, v))

    return (f'<layer id="1" name="gcbd" type="GroupConvolutionBackpropData">'
            f'<data strides="{csv(STRIDES)}" dilations="{csv(DILATIONS)}" '
            f'pads_begin="{csv(PB)}" pads_end="{csv(PE)}" output_padding="{csv(rem)}"/>'
            f'<input><port id="0">{dims(data)}</port><port id="1">{dims(filters)}</port></input>'
            f'<output><port id="2" precision="FP32">{dims(out)}</port></output></layer>')


def run_checks() -> list[CheckResult]:
    """Runs every check; each op is jitted as a user would call it."""
    results = []
    for op, family, got_fn, ref_fn in _cases():
        t0 = time.perf_counter()
        got = jax.jit(got_fn)()
        got.block_until_ready()
        seconds = time.perf_counter() - t0
        ref = ref_fn()
        if got.shape != ref.shape:
            err = float("inf")
        else:
            err = float(jnp.max(jnp.abs(got - ref)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))
        results.append(CheckResult(op, family, tuple(got.shape), err, seconds))
    return results


def format_table(results: list[CheckResult]) -> str:
    head = (f"{'op':34s} {'family':11s} {'output shape':18s} {'rel. error':>10s} "
            f"{'first call':>10s}  result")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.op:34s} {r.family:11s} {str(r.shape):18s} {r.error:10.1e} "
                     f"{r.seconds * 1e3:8.0f} ms  {'ok' if r.ok else 'FAIL'}")
    return "\n".join(lines)
