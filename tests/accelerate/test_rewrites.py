"""accelerate's rewrites (``accelerate/rewrites/``): each one matches the program JAX writes.

One program per rewrite, as JAX's autodiff writes it today. Where JAX changes what it writes
(a transpose rule, a pool's derivative), the rewrite stops matching: the test names the
rewrite and the reasons it gave, where the transformation would have run the program as
written without a word. Each rewrite's own values: ``tests/accelerate/rewrites/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import lowering
from jaxconv._src.accelerate import rewrites
from tests.support import helpers as h

_DN = ("NHWC", "HWIO", "NHWC")


def _random(shape, dtype=jnp.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _convolution():
    def loss(x, w):
        return jnp.sum(jnp.sin(lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                                        dimension_numbers=_DN)))
    return jax.grad(loss, (0, 1)), (_random((2, 9, 9, 3)), _random((3, 3, 3, 4))), 3


def _max_pool():
    def pool(x):
        return jnp.sum(lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                                         "SAME") ** 2)

    def both(x, t):  # the pool, its gradient (a scatter) and its tangent (a gather)
        return jax.grad(pool)(x), jax.jvp(pool, (x,), (t,))[1]
    return both, (_random((2, 8, 8, 3)), _random((2, 8, 8, 3), seed=1)), 4


def _avg_pool(window, strides):
    def loss(x):
        y = lax.reduce_window(x, 0.0, lax.add, (1, *window, 1), (1, *strides, 1), "VALID")
        return jnp.sum(jnp.sin(y))
    return jax.grad(loss), (_random((2, 8, 8, 3)),)


def _window_sum():  # overlapping windows: the pool and its transpose are tap sums
    return (*_avg_pool((3, 3), (1, 1)), 2)


def _spread_sum():  # windows that do not overlap: the transpose repeats the cotangent
    return (*_avg_pool((2, 2), (2, 2)), 1)


def _spread_pad():
    return (*_avg_pool((2, 2), (2, 2)), 1)


def _factored_sum():  # autodiff's gradient of a normalisation's mean
    def loss(x, k):
        centred = x - jnp.mean(x, axis=(0, 1, 2), keepdims=True)
        return jnp.sum(jnp.sin(centred * k))
    return jax.grad(loss), (_random((2, 4, 4, 3)), _random((1, 1, 1, 3), seed=1)), 1


def _recompute():  # a bfloat16 input's float32 statistics, read by two sums and the output
    def stats(x):
        f = x.astype(jnp.float32)
        return jnp.sum(f, (0, 1, 2)), jnp.sum(jnp.square(f), (0, 1, 2)), f * 2.0
    return stats, (_random((2, 6, 6, 8), jnp.bfloat16),), 2


def _transposed_product():  # a dense layer's kernel gradient: transpose(dot(dy, x))
    def loss(w, x):
        return jnp.sum(jnp.sin(x @ w))
    return jax.grad(loss), (_random((16, 8)), _random((4, 16), seed=1)), 1


def _product():  # a bfloat16 dense layer: its forward and both gradients
    def loss(w, x):
        return jnp.sum(jnp.sin((x @ w).astype(jnp.float32)))
    w, x = _random((64, 32), jnp.bfloat16), _random((16, 64), jnp.bfloat16, seed=1)
    if lowering.product_why_not(jax.typeof(x), jax.typeof(w), (((1,), (0,)), ((), ())),
                                None) is not None:
        pytest.skip("oneDNN's bfloat16 matmul is not native here: the product rewrite runs "
                    "nowhere on this machine")
    return jax.value_and_grad(loss, (0, 1)), (w, x), 3


def _fused_chain():  # a convolution, BatchNorm in inference mode as flax writes it, ReLU6
    def block(x, w, mean, scale, shift):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN)
        return jax.nn.relu6((y - mean) * scale + shift)
    c = (1, 1, 1, 4)
    return block, (_random((2, 6, 6, 3)), _random((3, 3, 3, 4), seed=1), _random(c, seed=2),
                   _random(c, seed=3), _random(c, seed=4)), 1


def _narrowing_convert():  # a mixed-precision layer: its float32 filter cast for the convolution
    def layer(x, w):
        return lax.conv_general_dilated(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), (1, 1),
                                        "SAME", dimension_numbers=_DN)
    return layer, (_random((2, 6, 6, 3)), _random((3, 3, 3, 4), seed=1)), 2


#: each rewrite's program and the equations of it the rewrite must match (at least)
CASES: dict[str, Callable[[], tuple[Any, tuple[Any, ...], int]]] = {
    "convolution": _convolution,
    "fused chain": _fused_chain,
    "max pool": _max_pool,
    "window sum": _window_sum,
    "spread sum": _spread_sum,
    "spread pad": _spread_pad,
    "factored sum": _factored_sum,
    "recompute": _recompute,
    "transposed product": _transposed_product,
    "product": _product,
    "narrowing convert": _narrowing_convert,
}


def test_every_rewrite_has_a_program():
    assert sorted(CASES) == sorted(r.name for r in rewrites.REWRITES)


@pytest.mark.parametrize("name", CASES)
def test_each_rewrite_matches_the_program_jax_writes(name):
    fn, args, want = CASES[name]()
    decisions = jaxconv.explain(fn, *args).decisions
    matched = [d for d in decisions if d.matched == name]
    declined = sorted({rewrites.REASONS[key] for d in decisions for r, key in d.reasons
                       if r == name})
    assert len(matched) >= want, (
        f"rewrite {name!r} matched {len(matched)} of the {want} equations JAX wrote for it; "
        f"it declined the others: {declined}")
    # every reason is a key of the one table of reasons
    assert all(key in rewrites.REASONS for d in decisions for _, key in d.reasons)
    # and the program still computes the same values, within the bound of the dtype its
    # operands are computed in
    got, ref = jax.jit(jaxconv.accelerate(fn))(*args), fn(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        h.assert_close(a.astype(jnp.float32), b.astype(jnp.float32), args[0].dtype)


def test_the_first_matching_rewrite_wins():
    """A window sum over a spread pad is the spread sum's, not the tap sum's: the order of
    ``REWRITES`` decides, and the decision says which was asked first."""
    fn, args, _ = _spread_sum()
    (d,) = [d for d in jaxconv.explain(fn, *args).decisions
            if d.eqn.primitive.name == "reduce_window_sum" and d.matched == "spread sum"]
    assert d.reasons == ()  # nothing before it declined
    names = [r.name for r in rewrites.BY_PRIMITIVE["reduce_window_sum"]]
    assert names.index("spread sum") < names.index("window sum")
