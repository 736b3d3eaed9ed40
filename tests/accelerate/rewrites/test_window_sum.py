"""The window-sum rewrites (``accelerate/rewrites/window_sum.py``): tap sums, and the
cotangent repeated over a pool whose windows do not overlap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h


def _prims(fn, *args) -> list[str]:
    return [e.primitive.name for e in h.equations(fn, *args)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape,window,padding", [
    ((2, 9, 8, 3), (1, 2, 2, 1), ((0, 0), (0, 0), (0, 0), (0, 0))),
    ((2, 10, 7, 3), (1, 3, 2, 1), ((0, 0), (1, 2), (0, 1), (0, 0))),
    ((3, 11, 4), (1, 1, 4), ((0, 0), (0, 0), (3, 2))),
    ((2, 5, 6, 7, 2), (1, 2, 3, 2, 1), ((0, 0), (1, 0), (2, 1), (0, 1), (0, 0)))])
def test_the_transpose_of_a_pool_whose_windows_do_not_overlap_repeats_the_cotangent(
        dtype, shape, window, padding):
    """Autodiff writes a window sum's transpose as a window sum over the cotangent spread by an
    interior pad; where the windows do not overlap (strides equal to the window) it runs as the
    cotangent repeated and shifted into place: the same values bit for bit, no interior pad and
    no window sum left in the program."""
    rng = np.random.default_rng(5)
    x = h.random(rng, shape, dtype)

    def pool(x):
        return lax.reduce_window(x, jnp.zeros((), dtype), lax.add, window, window, padding)

    y, transpose = jax.vjp(pool, x)
    ct = h.random(rng, y.shape, dtype)
    want = transpose(ct)[0]
    got = jax.jit(jaxconv.accelerate(lambda c: transpose(c)[0]))(ct)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))

    def kinds(fn):  # the primitives, and whether a pad spreads its operand
        return {(e.primitive.name, e.primitive.name == "pad"
                 and any(c[2] for c in e.params["padding_config"]))
                for e in jax.make_jaxpr(fn)(ct).jaxpr.eqns}

    before = kinds(lambda c: transpose(c)[0])
    after = kinds(jaxconv.accelerate(lambda c: transpose(c)[0]))
    assert {("reduce_window_sum", False), ("pad", True)} <= before
    assert not {("reduce_window_sum", False), ("pad", True)} & after


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window,strides,padding", [
    ((2, 2), (2, 2), "VALID"), ((3, 3), (2, 2), ((1, 1), (1, 1))), ((3, 2), (1, 2), "SAME"),
    ((2, 3), (2, 3), ((1, 0), (2, 1)))])
def test_average_pools_and_their_gradients_are_tap_sums(dtype, window, strides, padding):
    """``reduce_window_sum`` (flax's ``nn.avg_pool``, and its transpose under ``grad``) runs as
    the sum of its taps, in float32 for bfloat16: the same values and gradients as lax's."""
    import flax.linen as nn

    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 9, 8, 3)), dtype)

    def loss(x):
        y = nn.avg_pool(x, window, strides=strides, padding=padding)
        return jnp.sum(jnp.sin(y.astype(jnp.float32)))

    fn = jax.value_and_grad(loss)
    acc = jaxconv.accelerate(fn)
    with jax.numpy_dtype_promotion("standard"):  # flax's avg_pool divides by an int
        want, got = jax.jit(fn)(x), jax.jit(acc)(x)
        before, after = str(jax.make_jaxpr(fn)(x)), str(jax.make_jaxpr(acc)(x))
    h.assert_close(got[0], want[0], dtype)
    h.assert_close(got[1].astype(jnp.float32), want[1].astype(jnp.float32), dtype)
    assert before.count("reduce_window_sum") == 2  # the pool and its transpose
    assert "reduce_window_sum" not in after
