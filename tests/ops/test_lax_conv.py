"""jaxconv.conv_general_dilated against lax.conv_general_dilated and its jax.vjp: a declarative matrix.

Values must equal lax's; gradients must equal lax's jax.vjp and be built from jaxconv's kernels
(no lax convolution outside the jaxconv_conv primitive) wherever jaxconv has a kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src.native import library
from tests.support import helpers as h

HIGHEST = lax.Precision.HIGHEST

# (id, lhs shape, rhs shape, dimension_numbers, strides, padding, rhs_dilation, groups)
CASES = [
    ("nhwc-same", (2, 9, 8, 4), (3, 3, 4, 6), ("NHWC", "HWIO", "NHWC"), (2, 2), "SAME", (1, 1), 1),
    ("nchw-valid-g2", (2, 4, 9, 8), (6, 2, 3, 2), ("NCHW", "OIHW", "NCHW"), (1, 2), "VALID",
     (2, 1), 2),
    ("nchw-in-nhwc-out", (2, 4, 7, 7), (3, 3, 4, 6), ("NCHW", "HWIO", "NHWC"), (2, 1),
     [(1, 0), (2, 1)], (1, 2), 1),
    ("same-lower-depthwise", (2, 8, 8, 4), (3, 3, 1, 8), ("NHWC", "HWIO", "NHWC"), (2, 2),
     "SAME_LOWER", (1, 1), 4),
    ("default-dn-1d", (2, 3, 11), (4, 3, 3), None, (3,), [(2, 1)], (2,), 1),
    ("ndhwc-3d", (1, 5, 6, 5, 2), (2, 2, 3, 2, 4), ("NDHWC", "DHWIO", "NDHWC"), (1, 2, 1),
     "SAME", (1, 1, 1), 1),
    ("wh-order", (2, 6, 7, 3), (2, 3, 3, 4), ("NWHC", "WHIO", "NHWC"), (1, 1), "VALID", (1, 1), 1),
]


def _args(case):
    _, xs, ws, dn, s, pad, d, g = case
    rng = np.random.default_rng(len(case[0]))
    return h.random(rng, xs), h.random(rng, ws), dict(
        window_strides=s, padding=pad, rhs_dilation=d, dimension_numbers=dn,
        feature_group_count=g, precision=HIGHEST)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_value_and_gradients_equal_lax(case):
    x, w, kw = _args(case)
    got = jaxconv.conv_general_dilated(x, w, **kw)
    ref = lax.conv_general_dilated(x, w, **kw)
    h.assert_close(got, ref, jnp.float32)
    dy = h.random(np.random.default_rng(1), ref.shape)

    def vjp(conv):
        return jax.vjp(lambda x, w: conv(x, w, **kw), x, w)[1](dy)

    for a, b in zip(vjp(jaxconv.conv_general_dilated), vjp(lax.conv_general_dilated)):
        h.assert_close(a, b, jnp.float32)
    assert h.lax_convolutions(lambda x, w, dy: jax.vjp(
        lambda x, w: jaxconv.conv_general_dilated(x, w, **kw), x, w)[1](dy), x, w, dy) == 0


def test_check_grads_order_2():
    x, w, kw = _args(CASES[4])  # 1D, default dimension_numbers: small enough for order 2
    with jax.enable_x64(True):
        x, w = x.astype(jnp.float64), w.astype(jnp.float64)
        h.check_grads(lambda x, w: jaxconv.conv_general_dilated(x, w, **kw), (x, w), order=2)


@pytest.mark.parametrize("extra", [dict(lhs_dilation=(2, 2), padding=[(1, 1), (2, 0)]),
                                   dict(padding=[(-1, 0), (1, 1)])],
                         ids=["lhs-dilation", "negative-padding"])
def test_cases_without_a_kernel_are_lax_itself(extra):
    x, w, kw = _args(CASES[0])
    kw = dict(kw, **extra)
    h.assert_close(jaxconv.conv_general_dilated(x, w, **kw), lax.conv_general_dilated(x, w, **kw),
                   jnp.float32)


def test_batch_group_count_is_lax_itself():
    x, w = jnp.ones((4, 6, 6, 2)), jnp.ones((3, 3, 2, 4))
    kw = dict(window_strides=(1, 1), padding="VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
              batch_group_count=2)
    h.assert_close(jaxconv.conv_general_dilated(x, w, **kw), lax.conv_general_dilated(x, w, **kw),
                   jnp.float32)


_ONEDNN = pytest.mark.skipif(not library.status().available, reason="the onednn extra is not built")


# (extra arguments, the patch's lowering): jaxconv's kernel by an XLA formulation and by
# oneDNN, and two calls handed to lax (which take only lowering="auto")
@pytest.mark.parametrize("extra, lowering", [
    pytest.param({}, "conv", id="jaxconv-kernel-xla"),
    pytest.param({}, "onednn", id="jaxconv-kernel-onednn", marks=_ONEDNN),
    pytest.param(dict(lhs_dilation=(2, 2), padding=[(1, 1), (2, 0)]), "auto", id="handed-to-lax"),
    pytest.param(dict(padding=[(-1, 0), (1, 1)]), "auto", id="negative-padding")])
def test_patching_lax_with_jaxconv_computes_every_call(monkeypatch, lowering, extra):
    """``jax.lax.conv_general_dilated = jaxconv.conv_general_dilated`` (how a program makes
    third-party code use jaxconv): code that looks lax's function up gets jaxconv's values and
    gradients, both for calls jaxconv computes and for the calls it hands to lax, which reach
    lax's own function (held from import time), never jaxconv again."""
    x, w, kw = _args(CASES[0])
    kw = dict(kw, **extra)
    original = lax.conv_general_dilated

    def third_party(x, w):  # looks the function up at call time, as a library would
        return jax.lax.conv_general_dilated(x, w, **kw)

    def loss(f):
        return lambda x, w: (f(x, w) ** 2).sum()

    want = original(x, w, **kw)
    want_grads = jax.grad(loss(lambda x, w: original(x, w, **kw)),
                          argnums=(0, 1))(x, w)
    monkeypatch.setattr(jax.lax, "conv_general_dilated",
                        functools.partial(jaxconv.conv_general_dilated, lowering=lowering))
    h.assert_close(third_party(x, w), want, jnp.float32)
    h.assert_close(jax.jit(third_party)(x, w), want, jnp.float32)
    got_grads = jax.jit(jax.grad(loss(third_party), argnums=(0, 1)))(x, w)
    for got, ref in zip(got_grads, want_grads):
        h.assert_close(got, ref, jnp.float32)
