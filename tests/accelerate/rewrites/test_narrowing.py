"""The narrowing rewrite (``accelerate/rewrites/narrowing.py``): a float32 -> bfloat16 cast that
only convolutions and products read, rounded by integer operations: XLA's values, bit for bit,
on the values where rounding is delicate (ties, the largest finite, subnormals, infinities,
NaNs) and on random bit patterns.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv
from jaxconv._src.rounding import round_to_bfloat16
from tests.support import helpers as h

_DN = ("NHWC", "HWIO", "NHWC")


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


def test_the_rounding_is_xlas_bit_for_bit():
    f32 = np.finfo(np.float32)
    special = np.array([
        0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, f32.max, -f32.max, f32.tiny, f32.tiny / 3,
        -f32.tiny / 7, f32.smallest_subnormal, 3.4e38, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8,
        1.0 + 2.0**-8 + 2.0**-20, 255.5, 256.5, 257.5,
    ], np.float32)
    patterns = np.random.default_rng(0).integers(0, 2**32, 200_000, dtype=np.uint64)
    x = np.concatenate([special, patterns.astype(np.uint32).view(np.float32)])
    got = jax.jit(round_to_bfloat16)(x)
    want = jax.jit(lambda v: v.astype(jnp.bfloat16))(x)
    nan = np.isnan(x)
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan])
    assert np.isnan(np.asarray(got, np.float32)[nan]).all()
    assert np.array_equal(np.signbit(np.asarray(got, np.float32)[nan]), np.signbit(x[nan]))


def _layer(x, w):
    return lax.conv_general_dilated(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), (1, 1),
                                    "SAME", dimension_numbers=_DN)


def _matched(fn, *args) -> int:
    return sum(d.matched == "narrowing convert" for d in jaxconv.explain(fn, *args).decisions)


def test_a_cast_only_kernels_read_is_rounded_by_integers():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 7, 6, 5)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 5, 4)), jnp.float32)
    assert _matched(_layer, x, w) == 2  # the input's cast and the filter's
    # the casts are exact (the test above); the convolutions' sums are jaxconv's and lax's
    h.assert_close(jax.jit(jaxconv.accelerate(_layer))(x, w).astype(jnp.float32),
                   jax.jit(_layer)(x, w).astype(jnp.float32), jnp.bfloat16)

    def read_elsewhere(x, w):  # the filter's cast is read by a transpose too (widening gives an
        # element-wise reader the float32 value: that would leave the cast to the kernel alone)
        wb = w.astype(jnp.bfloat16)
        y = lax.conv_general_dilated(x.astype(jnp.bfloat16), wb, (1, 1), "SAME",
                                     dimension_numbers=_DN)
        return y, jnp.transpose(wb)

    assert _matched(read_elsewhere, x, w) == 1  # the input's only
    assert _matched(lambda x: x.astype(jnp.bfloat16), x) == 0  # a result of the program


def test_the_rounding_differentiates_as_the_cast():
    """``grad`` of an accelerated function reads the cast's derivative, not the integer
    operations' (which have none)."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((2, 7, 6, 5)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 5, 4)), jnp.float32)

    def loss(x, w):
        return jnp.sum(_layer(x, w).astype(jnp.float32) ** 2)

    got = jax.jit(jax.grad(jaxconv.accelerate(loss), (0, 1)))(x, w)
    want = jax.jit(jax.grad(loss, (0, 1)))(x, w)
    for g, r in zip(got, want):
        h.assert_close(g, r, jnp.bfloat16)
    t = jnp.asarray(rng.standard_normal(7), jnp.float32)
    _, tangent = jax.jvp(round_to_bfloat16, (t,), (t,))
    assert np.array_equal(_bits(tangent), _bits(t.astype(jnp.bfloat16)))


def test_a_constants_cast_is_rounded_once_when_traced():
    """A served model's float32 variable closed over and cast to bfloat16 is rounded when the
    program is traced: the program holds the bfloat16 constant, not a rounding per call (and a
    fused chain's convolution reads it packed); the values are the per-call rounding's, bit for
    bit."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 7, 6, 5)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 5, 4)), jnp.float32)
    served = jaxconv.accelerate(lambda x: jax.nn.relu(_layer(x, w)))
    labels = [d.label for d in jaxconv.explain(lambda x: jax.nn.relu(_layer(x, w)), x).decisions
              if d.matched == "narrowing convert"]
    assert sorted(labels) == ["rounded by integer operations",
                              "rounded by integer operations (a constant: once, when traced)"]
    jaxpr = jax.make_jaxpr(served)(x)
    rounded = [c for c in jaxpr.consts if getattr(c, "dtype", None) == jnp.bfloat16]
    assert len(rounded) == 1 and np.array_equal(_bits(rounded[0]), _bits(w.astype(jnp.bfloat16)))
    args = jaxconv.accelerate(lambda x, w: jax.nn.relu(_layer(x, w)))
    assert np.array_equal(_bits(jax.jit(served)(x)), _bits(jax.jit(args)(x, w)))
