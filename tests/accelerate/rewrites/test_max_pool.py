"""The max-pool rewrite (``accelerate/rewrites/max_pool.py``): jaxconv's pool and its derivatives
in place of XLA's, with the same first maximum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv
from tests.support import helpers as h


def _prims(fn, *args) -> list[str]:
    return [e.primitive.name for e in h.equations(fn, *args)]


def _pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                             ((0, 0), (1, 1), (1, 1), (0, 0)))


def test_max_pool_and_its_derivatives_are_jaxconvs_with_the_same_first_maximum():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 3, (2, 9, 9, 3)), jnp.float32)  # many ties
    t = h.random(rng, x.shape)

    def f(x):
        return jnp.sum(jnp.sin(_pool(x)) * jnp.arange(5.0)[None, :, None, None])

    for fn in (_pool, jax.grad(f), lambda x: jax.jvp(f, (x,), (t,))):
        got, want = jax.jit(jaxconv.accelerate(fn))(x), fn(x)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a) != 0, np.asarray(b) != 0)  # same maxima
            # overlapping windows' sums may be added in another order (XLA:GPU)
            h.assert_close(a, b, jnp.float32)
    prims = _prims(jaxconv.accelerate(jax.grad(f)), x)
    assert "select_and_scatter_add" not in prims and "jaxconv_max_pool_scatter" in prims
    assert "select_and_gather_add" not in _prims(
        jaxconv.accelerate(lambda x: jax.jvp(f, (x,), (t,))), x)


def test_a_pool_over_channels_nchw_and_a_min_pool():
    rng = np.random.default_rng(1)
    x = h.random(rng, (2, 3, 8, 8))

    def nchw(x):
        return jnp.sum(lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                         "VALID") ** 2)

    def min_pool(x):
        return jnp.sum(lax.reduce_window(x, jnp.inf, lax.min, (1, 1, 2, 2), (1, 1, 2, 2),
                                         "VALID") ** 2)

    for fn, ours in ((nchw, True), (min_pool, False)):
        g = jax.grad(fn)
        np.testing.assert_array_equal(np.asarray(jax.jit(jaxconv.accelerate(g))(x)),
                                      np.asarray(g(x)))
        assert ("jaxconv_max_pool_scatter" in _prims(jaxconv.accelerate(g), x)) is ours
