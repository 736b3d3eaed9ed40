"""The oneDNN convolution family against jax.vjp and against PyTorch autograd.

A declarative matrix: spatial rank 1/2/3 x data_format NXC/NCX x filter_format
XIO/OIX x groups 1/2/depthwise x geometries (asymmetric pads, strides with a
remainder, dilations, every auto_pad mode). Each case runs
convolution_backprop_filters (the seed) and its alias, convolution_backward_data
and convolution, and compares with

* ``jax.vjp`` of ``jaxconv.convolution`` with the same attributes, and
* PyTorch autograd in float64 on explicitly padded data (pads from an
  independent TF-style SAME formula), the independent oracle.

A dtype table (f32/f16/bf16/f64, preferred_element_type) runs on a subset.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h
from tests.support.cases import CONV_MATRIX as MATRIX
from tests.support.cases import CONV_ROTATED as ROTATED
from tests.support.cases import CONV_WEIGHT_DEFAULT as WEIGHT_DEFAULT
from tests.support.cases import ConvCase as Case

HIGHEST = lax.Precision.HIGHEST


def _ours(case: Case, x, w, dy, **extra):
    a = dict(case.attrs, **extra)
    y = jaxconv.convolution(x, w, **a)
    dx = jaxconv.convolution_backward_data(dy, w, x.shape, **a)
    dw = jaxconv.convolution_backprop_filters(x, dy, w.shape, **a)
    return y, dx, dw


def _vjp_reference(case: Case, x, w, dy, **extra):
    """(y, dx, dW) from jax.vjp of jaxconv.convolution, jitted."""

    @jax.jit
    def run(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: jaxconv.convolution(x, w, **case.attrs, **extra), x, w)
        return (y, *vjp(dy))

    return run(x, w, dy)


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[] if c.id in WEIGHT_DEFAULT else [pytest.mark.slow])
    for c in MATRIX])
def test_backprop_filters_matrix(case: Case):
    """The seed op on the full matrix: against jax.vjp and against torch.

    By default a quarter of it, in which every layout pair meets every rank, groups
    value and geometry (tests/support/cases.py); the whole matrix with ``-m slow``.
    """
    x, w, dy = case.make()
    dw = jaxconv.convolution_backprop_filters(x, dy, w.shape, **case.attrs, precision=HIGHEST)
    assert dw.shape == w.shape and dw.dtype == jnp.float32
    _, vjp = jax.vjp(
        lambda w: jaxconv.convolution(x, w, **case.attrs, precision=HIGHEST), w)
    h.assert_close(dw, jax.jit(vjp)(dy)[0], jnp.float32)
    h.assert_close(dw, case.torch_reference(x, w, dy)[2], jnp.float32)


@pytest.mark.parametrize("ids", [{c.id for c in ROTATED}, WEIGHT_DEFAULT],
                         ids=["forward-and-data", "weight-default"])
def test_the_default_matrices_cover_every_pair_of_factors(ids):
    """Every layout pair meets every rank, groups value and geometry in each default run."""
    cases = [c for c in MATRIX if c.id in ids]
    for factor in ("rank", "groups_name", "geometry"):
        values = {getattr(c, factor) for c in MATRIX}
        met = {(c.data_format, c.filter_format, getattr(c, factor)) for c in cases}
        assert len(met) == 4 * len(values), factor


@pytest.mark.parametrize("case", ROTATED, ids=lambda c: c.id)
def test_forward_and_backward_data_matrix(case: Case):
    x, w, dy = case.make(seed=5)
    y = jaxconv.convolution(x, w, **case.attrs, precision=HIGHEST)
    dx = jaxconv.convolution_backward_data(dy, w, x.shape, **case.attrs, precision=HIGHEST)
    assert y.shape == dy.shape and dx.shape == x.shape
    y_ref, dx_ref, _ = _vjp_reference(case, x, w, dy, precision=HIGHEST)
    h.assert_close(y, y_ref, jnp.float32)
    h.assert_close(dx, dx_ref, jnp.float32)
    y_t, dx_t, _ = case.torch_reference(x, w, dy)
    h.assert_close(y, y_t, jnp.float32)
    h.assert_close(dx, dx_t, jnp.float32)


# The alias under oneDNN's current names: same numbers on a slice of the matrix.
@pytest.mark.parametrize("case", MATRIX[::7], ids=lambda c: c.id)
def test_backward_weights_alias(case: Case):
    x, w, dy = case.make(seed=1)
    a = dict(case.attrs)
    fmt = a.pop("filter_format")
    got = jaxconv.convolution_backward_weights(x, dy, w.shape, weights_format=fmt, **a,
                                               precision=HIGHEST)
    ref = jaxconv.convolution_backprop_filters(x, dy, w.shape, filter_format=fmt, **a,
                                               precision=HIGHEST)
    np.testing.assert_array_equal(got, ref)
    h.assert_close(got, case.torch_reference(x, w, dy)[2], jnp.float32)


# ---- dtypes ----------------------------------------------------------------

DTYPE_CASES = [
    Case(2, "NXC", "XIO", "g2", "stride_dil_remainder"),
    Case(1, "NCX", "OIX", "depthwise", "same_upper"),
    Case(3, "NCX", "XIO", "g1", "same_lower"),
]
DTYPES = ["float32", "float16", "bfloat16", "float64"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DTYPE_CASES, ids=lambda c: c.id)
def test_dtypes(case: Case, dtype: str):
    with jax.enable_x64(dtype == "float64"):
        x, w, dy = case.make(seed=2, dtype=jnp.dtype(dtype))
        y, dx, dw = _ours(case, x, w, dy, precision=HIGHEST)
        for a in (y, dx, dw):
            assert a.dtype == jnp.dtype(dtype)
        refs = case.torch_reference(x, w, dy)
        for got, ref in zip((y, dx, dw), refs):
            h.assert_close(got, ref, dtype)
        # against jax.vjp in the same dtype
        _, dx_ref, dw_ref = _vjp_reference(case, x, w, dy, precision=HIGHEST)
        h.assert_close(dx, dx_ref, dtype)
        h.assert_close(dw, dw_ref, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", DTYPE_CASES, ids=lambda c: c.id)
def test_preferred_element_type_f32(case: Case, dtype: str):
    x, w, dy = case.make(seed=3, dtype=jnp.dtype(dtype))
    y, dx, dw = _ours(case, x, w, dy, precision=HIGHEST, preferred_element_type=jnp.float32)
    refs = case.torch_reference(x, w, dy)
    for got, ref in zip((y, dx, dw), refs):
        assert got.dtype == jnp.float32
        # f32 output of f16/bf16 products: only f32 accumulation error remains.
        h.assert_close(got, ref, "float32")


def test_low_precision_accumulates_in_f32():
    """f16 results are rounded once from an f32 accumulator, not summed in f16."""
    case = Case(1, "NCX", "OIX", "g1", "asym_pads")
    rng = np.random.default_rng(4)
    # A long reduction: batch 64, length 400.
    x = h.random(rng, (64, 4, 400), jnp.float16)
    dy = h.random(rng, (64, 3, 400), jnp.float16)
    a = dict(case.attrs, pads_begin=(1,), pads_end=(1,))
    dw16 = jaxconv.convolution_backprop_filters(x, dy, (3, 4, 3), **a)
    dw32 = jaxconv.convolution_backprop_filters(x.astype(jnp.float32), dy.astype(jnp.float32),
                                                (3, 4, 3), **a, precision=HIGHEST)
    np.testing.assert_array_equal(dw16, dw32.astype(jnp.float16))
