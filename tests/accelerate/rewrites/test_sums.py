"""jaxconv.accelerate's sums of a product by a factor constant along the summed axes
(``accelerate/rewrites/sums.py``).

Oracles: the same sums in float64 (numpy), and flax's BatchNorm differentiated in float64.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src.accelerate.analysis import Analysis
from jaxconv._src.accelerate.rewrites import sums
from tests.support import helpers as h


def _sum_inputs(jaxpr) -> list:
    """The equations that define the operands of ``jaxpr``'s ``reduce_sum``s (None: an
    input)."""
    defined = {v: e for e in jaxpr.eqns for v in e.outvars}
    return [defined.get(e.invars[0]) for e in jaxpr.eqns if e.primitive.name == "reduce_sum"]


# (the summed function, the factor's shape): each sums over axes (0, 1) of a 5 x 7 x 3 array
CASES = {
    "factor right": (lambda x, k: jnp.sum(x * k, axis=(0, 1)), (1, 1, 3)),
    "factor left": (lambda x, k: jnp.sum(k * x, axis=(0, 1)), (1, 1, 3)),
    "negated": (lambda x, k: jnp.sum(-(x * k), axis=(0, 1)), (1, 1, 3)),
    "negated twice": (lambda x, k: jnp.sum(-(-(x * k)), axis=(0, 1)), (1, 1, 3)),
    "scalar-like factor": (lambda x, k: jnp.sum(-(x * k), axis=(0, 1)), (1, 1, 1)),
    "all axes": (lambda x, k: jnp.sum(x * k), (1, 1, 1)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_sum_of_a_product_by_a_factor_is_the_factor_times_the_sum(case):
    fn, factor_shape = CASES[case]
    rng = np.random.default_rng(0)
    x = h.random(rng, (5, 7, 3)) * 4.0
    k = h.random(rng, factor_shape) * 3.0
    got = jax.jit(jaxconv.accelerate(fn))(x, k)
    want = fn(np.asarray(x, np.float64), np.asarray(k, np.float64))
    h.assert_close(got, want, jnp.float32)
    # the sum reads x itself, not the product
    jaxpr = jax.make_jaxpr(jaxconv.accelerate(fn))(x, k).jaxpr
    assert all(e is None or e.primitive.name not in ("mul", "neg") for e in _sum_inputs(jaxpr))


@pytest.mark.parametrize("case", ["varies along a summed axis", "bfloat16"])
def test_other_sums_of_products_run_as_written(case):
    rng = np.random.default_rng(1)
    dtype = jnp.bfloat16 if case == "bfloat16" else jnp.float32
    x = h.random(rng, (5, 7, 3), dtype)
    k = h.random(rng, (1, 7, 3) if case != "bfloat16" else (1, 1, 3), dtype)

    def fn(x, k):
        return jnp.sum(x * k, axis=(0, 1))

    closed = jax.make_jaxpr(fn)(x, k)
    eqn = next(e for e in closed.jaxpr.eqns if e.primitive.name == "reduce_sum")
    assert sums.factored(eqn, Analysis.of(closed.jaxpr).producer) is None
    want = fn(np.asarray(x, np.float64), np.asarray(k, np.float64))
    h.assert_close(jax.jit(jaxconv.accelerate(fn))(x, k), want, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@jax.numpy_dtype_promotion("standard")  # flax promotes a bfloat16 input with its parameters
def test_batchnorm_gradients_sum_the_cotangent_once(dtype):
    """flax's BatchNorm differentiated under accelerate: one sum of the cotangent fewer (the
    mean's gradient, ``sum(-(dy * k))``, is ``-k * sum(dy)``), gradients within the dtype's
    bound of float64's."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((4, 6, 6, 8)) * 3 + 1, dtype)
    c = jnp.asarray(rng.standard_normal((4, 6, 6, 8)), jnp.float32)

    def loss(params, x, c, bn):
        y, _ = bn.apply({"params": params, "batch_stats": stats}, x, mutable=["batch_stats"])
        return jnp.sum(y.astype(c.dtype) * c)

    bn = nn.BatchNorm(use_running_average=False, dtype=dtype)
    variables = bn.init(jax.random.PRNGKey(0), x)
    params, stats = variables["params"], variables["batch_stats"]
    grad = jax.grad(loss, argnums=(0, 1))
    got = jax.jit(jaxconv.accelerate(grad), static_argnums=3)(params, x, c, bn)
    with jax.enable_x64(True):
        bn64 = nn.BatchNorm(use_running_average=False, dtype=jnp.float64,
                            param_dtype=jnp.float64)
        params64 = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
        want = grad(params64, np.asarray(x, np.float64), np.asarray(c, np.float64), bn64)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        h.assert_close(g, w, dtype)

    def sums_compiled(fn):  # XLA merges the two sums of the cotangent into one
        text = jax.jit(fn, static_argnums=3).lower(params, x, c, bn).compile().as_text()
        return text.count(" reduce(")

    assert sums_compiled(jaxconv.accelerate(grad)) == sums_compiled(grad) - 1
