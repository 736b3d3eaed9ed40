"""The oneDNN ConvTranspose family against jax.vjp and against PyTorch autograd.

A declarative matrix: spatial rank 1/2/3 x groups 1/2/depthwise x geometries
(asymmetric pads, strides, dilations, output_padding, every auto_pad mode),
with the eight (data_format x weights_format) layouts rotating through it, and
every layout on a fixed problem. Each case runs conv_transpose,
conv_transpose_backward_data, conv_transpose_backward_weights (seed 001) and
conv_transpose_backprop_filters (seed 002) and compares with

* ``jax.vjp`` of ``jaxconv.conv_transpose`` with the same attributes, and
* ``torch.nn.functional.conv_transpose{1,2,3}d`` autograd in float64, its pads
  and output size computed independently in ``tests/support/helpers.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h
from tests.support import oracles
from tests.support.cases import CONV_TRANSPOSE_EVERY_LAYOUT as EVERY_LAYOUT
from tests.support.cases import CONV_TRANSPOSE_FORMATS as FORMATS
from tests.support.cases import CONV_TRANSPOSE_KERNEL as KERNEL
from tests.support.cases import CONV_TRANSPOSE_MATRIX as MATRIX
from tests.support.cases import CONV_TRANSPOSE_SPATIAL as SPATIAL
from tests.support.cases import (
    ConvTransposeCase as Case,
)

HIGHEST = lax.Precision.HIGHEST


def _vjp_reference(case: Case, x, w, dy):
    @jax.jit
    def run(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: jaxconv.conv_transpose(
            x, w, **case.attrs, filter_format=case.weights_format, precision=HIGHEST), x, w)
        return (y, *vjp(dy))

    return run(x, w, dy)


def _other_format(fmt: str) -> str:
    return FORMATS[(FORMATS.index(fmt) + 1) % 4]


@pytest.mark.parametrize("case", MATRIX + EVERY_LAYOUT, ids=lambda c: c.id)
def test_matrix_against_vjp_and_torch(case: Case):
    x, w, dy = case.make()
    a = dict(case.attrs, precision=HIGHEST)
    fmt = case.weights_format
    y = jaxconv.conv_transpose(x, w, **a, filter_format=fmt)
    dx = jaxconv.conv_transpose_backward_data(dy, w, **a, filter_format=fmt)
    dw = jaxconv.conv_transpose_backward_weights(x, dy, w.shape, **a, weights_format=fmt)
    # seed 002 under another format of the same weights
    other = _other_format(fmt)
    other_shape = h.convt_filter_from_iox(h.convt_filter_to_iox(np.zeros(w.shape), fmt),
                                          other).shape
    dw_other = jaxconv.conv_transpose_backprop_filters(x, dy, other_shape, **a,
                                                       filter_format=other)
    assert y.shape == dy.shape and dx.shape == x.shape and dw.shape == w.shape

    y_ref, dx_ref, dw_ref = _vjp_reference(case, x, w, dy)
    for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        h.assert_close(got, ref, jnp.float32)

    y_t, dx_t, dw_t = case.torch_reference(x, w, dy)
    for got, ref in ((y, y_t), (dx, dx_t), (dw, dw_t)):
        h.assert_close(got, ref, jnp.float32)
    h.assert_close(h.convt_filter_to_iox(np.asarray(dw_other), other),
                   h.convt_filter_to_iox(dw_t, fmt), jnp.float32)


# ---- output_shape (forward only; its vjp against torch) ---------------------

OUTPUT_SHAPE_CASES = [
    # (id, rank, attrs, output_shape): explicit keeps pads_begin as the crop offset;
    # sizes past the end of the full result are zero-filled.
    ("explicit-crop", 2, dict(strides=(2, 1), pads_begin=(1, 2), pads_end=(7, 7)), (6, 3)),
    ("explicit-zero-tail", 1, dict(strides=(2,), dilations=(2,), pads_begin=(1,)), (19,)),
    ("valid-tail", 3, dict(strides=(1, 2, 2), auto_pad="valid"), (6, 9, 11)),
    ("same_upper", 2, dict(strides=(2, 3), auto_pad="same_upper", output_padding=(1, 0)),
     (10, 12)),
    ("same_lower", 1, dict(strides=(3,), dilations=(2,), auto_pad="same_lower"), (20,)),
]


@pytest.mark.parametrize("cid,rank,attrs,output_shape", OUTPUT_SHAPE_CASES,
                         ids=[c[0] for c in OUTPUT_SHAPE_CASES])
def test_output_shape_against_torch(cid, rank, attrs, output_shape):
    rng = np.random.default_rng(7)
    g, ic, ocg = 2, 4, 3
    x = h.random(rng, (2, ic, *SPATIAL[rank]))
    w = h.random(rng, (ic, ocg, *KERNEL[rank]))
    a = dict(attrs, groups=g, data_format="NCX", filter_format="IOX", precision=HIGHEST)
    y, vjp = jax.vjp(lambda x, w: jaxconv.conv_transpose(x, w, output_shape, **a), x, w)
    assert y.shape[2:] == output_shape
    dy = h.random(rng, y.shape)
    dx, dw = vjp(dy)
    # independent pads_begin: explicit -> pads_begin, valid -> 0, same_* -> split of
    # total = S*(I-1) + DK - O + output_padding, extra at the end for same_upper.
    mode = attrs.get("auto_pad", "explicit")
    n = rank
    s = attrs.get("strides", (1,) * n)
    d = attrs.get("dilations", (1,) * n)
    opad = attrs.get("output_padding", (0,) * n)
    if mode == "explicit":
        pb = attrs["pads_begin"]
    elif mode == "valid":
        pb = (0,) * n
    else:
        pb = []
        for i, k, si, di, o, op in zip(SPATIAL[rank], KERNEL[rank], s, d, output_shape, opad):
            total = max(0, si * (i - 1) + (k - 1) * di + 1 - o + op)
            pb.append(total // 2 if mode == "same_upper" else total - total // 2)
    y_t, dx_t, dw_t = oracles.conv_transpose_all(
        h.to_f64(x), h.to_f64(w), h.to_f64(dy), strides=s, dilations=d, pads_begin=pb,
        out_size=output_shape, groups=g)
    h.assert_close(y, y_t, jnp.float32)
    h.assert_close(dx, dx_t, jnp.float32)
    h.assert_close(dw, dw_t, jnp.float32)


# ---- dtypes ------------------------------------------------------------------

DTYPE_CASES = [Case(2, "NXC", "XOI", "g2", "stride_dil_outpad"),
               Case(1, "NCX", "IOX", "depthwise", "same_upper")]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", DTYPE_CASES, ids=lambda c: c.id)
def test_dtypes(case: Case, dtype: str):
    with jax.enable_x64(dtype == "float64"):
        x, w, dy = case.make(seed=2, dtype=jnp.dtype(dtype))
        a = dict(case.attrs, precision=HIGHEST)
        fmt = case.weights_format
        got = (jaxconv.conv_transpose(x, w, **a, filter_format=fmt),
               jaxconv.conv_transpose_backward_data(dy, w, **a, filter_format=fmt),
               jaxconv.conv_transpose_backward_weights(x, dy, w.shape, **a, weights_format=fmt))
        for g, ref in zip(got, case.torch_reference(x, w, dy)):
            assert g.dtype == jnp.dtype(dtype)
            h.assert_close(g, ref, dtype)
        # f32 results from low-precision inputs
        if dtype in ("float16", "bfloat16"):
            dw32 = jaxconv.conv_transpose_backward_weights(
                x, dy, w.shape, **a, weights_format=fmt, preferred_element_type=jnp.float32)
            assert dw32.dtype == jnp.float32
            h.assert_close(dw32, case.torch_reference(x, w, dy)[2], "float32")
