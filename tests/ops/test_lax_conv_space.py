"""jaxconv.conv_general_dilated over the whole space of calls lax.conv_general_dilated accepts.

A property test draws calls (dtypes real, complex, integer and bool; 0 to 4 spatial axes;
zero-size batch, channel and spatial extents; any dimension-number permutation; strides, both
dilations; padding strings and pairs, negative ones included; feature or batch groups; single
and paired precisions; preferred_element_type) and checks against lax itself: a call lax
rejects raises the same exception type; one lax accepts gives lax's value, dtype and shape,
``jax.grad`` (real and complex) and ``jax.vmap``.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxconv
from tests.support import helpers as h

HIGHEST, DEFAULT = lax.Precision.HIGHEST, lax.Precision.DEFAULT
DTYPES = ["float32", "bfloat16", "complex64", "int32", "int8", "bool"]


@st.composite
def calls(draw):
    n = draw(st.integers(0, 4))
    small = 3 if n >= 3 else 5
    dtype = draw(st.sampled_from(DTYPES))
    fg, bg = draw(st.sampled_from([(1, 1), (2, 1), (1, 2)]))
    batch = bg * draw(st.integers(0, 2))
    cin_g, cout = draw(st.integers(0, 2)), fg * bg * draw(st.integers(1, 2))
    spatial = [draw(st.integers(0, small)) for _ in range(n)]
    kernel = [draw(st.integers(1, 3)) for _ in range(n)]
    strides = [draw(st.integers(1, 2)) for _ in range(n)]
    lhs_dil = [draw(st.sampled_from([1, 1, 2])) for _ in range(n)]
    rhs_dil = [draw(st.integers(1, 2)) for _ in range(n)]
    if all(d == 1 for d in lhs_dil) and draw(st.booleans()):
        padding = draw(st.sampled_from(["VALID", "SAME", "SAME_LOWER"]))
    else:
        padding = [(draw(st.integers(-1, 2)), draw(st.integers(-1, 2))) for _ in range(n)]
    perms = [draw(st.permutations(range(n + 2))) for _ in range(3)]
    precision = draw(st.sampled_from([None, HIGHEST, (HIGHEST, DEFAULT)]))
    pet = draw(st.sampled_from([None, "float32"])) if dtype in ("float32", "bfloat16") else None
    seed = draw(st.integers(0, 2 ** 16))
    # shapes in the (batch/out-feature, feature/in-feature, *spatial) roles, then permuted
    lhs_roles = [batch, fg * cin_g, *spatial]
    rhs_roles = [cout, cin_g, *kernel]
    lhs_spec, rhs_spec, out_spec = (tuple(p) for p in perms)

    def place(roles, spec):
        shape = [0] * len(roles)
        for role, axis in enumerate(spec):
            shape[axis] = roles[role]
        return tuple(shape)

    return dict(lhs_shape=place(lhs_roles, lhs_spec), rhs_shape=place(rhs_roles, rhs_spec),
                dtype=dtype, seed=seed, kwargs=dict(
                    window_strides=strides, padding=padding, lhs_dilation=lhs_dil,
                    rhs_dilation=rhs_dil,
                    dimension_numbers=lax.ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec),
                    feature_group_count=fg, batch_group_count=bg, precision=precision,
                    preferred_element_type=pet))


def _operand(rng, shape, dtype):
    if dtype == "bool":
        return jnp.asarray(rng.random(shape) > 0.5)
    if dtype in ("int32", "int8"):
        return jnp.asarray(rng.integers(-3, 4, shape), dtype)
    if dtype == "complex64":
        return jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape), dtype)
    return jnp.asarray(rng.standard_normal(shape), dtype)


def _close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                  want.shape, want.dtype)
    if dtype in ("bool", "int32", "int8"):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    elif dtype == "complex64":
        h.assert_close(jnp.real(got), jnp.real(want), jnp.float32)
        h.assert_close(jnp.imag(got), jnp.imag(want), jnp.float32)
    else:
        h.assert_close(got.astype(jnp.float32), want.astype(jnp.float32), dtype)


@settings(max_examples=max(60, settings.default.max_examples))  # ~15 s; the long profile: 300
@given(calls())
def test_every_call_lax_accepts_gives_lax_value_grad_and_vmap(call):
    rng = np.random.default_rng(call["seed"])
    dtype, kw = call["dtype"], call["kwargs"]
    x, w = _operand(rng, call["lhs_shape"], dtype), _operand(rng, call["rhs_shape"], dtype)

    def ours(x, w):
        return jaxconv.conv_general_dilated(x, w, **kw)

    def theirs(x, w):
        return lax.conv_general_dilated(x, w, **kw)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = jax.block_until_ready(theirs(x, w))
    except (TypeError, ValueError) as refused:
        with pytest.raises(type(refused), match=r"^conv_general_dilated: "):
            ours(x, w)
        return
    got = ours(x, w)
    _close(got, want, dtype)
    # vmap over the batch of two calls of the lhs
    xs = jnp.stack([x, x if x.dtype == jnp.bool_ else x * 2])
    _close(jax.vmap(ours, (0, None))(xs, w), jax.vmap(theirs, (0, None))(xs, w), dtype)
    if dtype in ("float32", "complex64") and got.size and x.size and w.size:
        ct = _operand(rng, want.shape, dtype)

        def loss(f):
            return lambda x, w: jnp.real(jnp.sum(f(x, w) * ct))

        for g, r in zip(jax.grad(loss(ours), (0, 1))(x, w), jax.grad(loss(theirs), (0, 1))(x, w)):
            _close(g, r, dtype)
