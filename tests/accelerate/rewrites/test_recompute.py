"""jaxconv.accelerate's sums that compute their shared element-wise chain again
(``accelerate/rewrites/recompute.py``).

Oracles: the program as written, run without accelerate (the same operations on the same
values: equal), and float64 (numpy).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h

AXES = (0, 1, 2)


def _stats(x):
    """A BatchNorm's one-pass statistics of a bfloat16 input, which it also reads doubled:
    the float32 input is read by two sums and a product."""
    f = x.astype(jnp.float32)
    return jnp.sum(f, AXES), jnp.sum(jnp.square(f), AXES), f * 2.0


def _centred(x):
    """The two-pass variance: the centred input is a broadcast's difference."""
    f = x.astype(jnp.float32)
    mean = jnp.mean(f, AXES, keepdims=True)
    return jnp.sum(jnp.square(f - mean), AXES), f - mean


def _masked(x):
    """A leaky ReLU: a ``select_n`` on a mask, which the library fusion does not take in."""
    f = x.astype(jnp.float32)
    g = lax.select(f > 0, f * 3.0, f * 0.5)
    return jnp.sum(g, AXES), g * 2.0


def _tripled(x):
    """A float32 chain that two sums and a product read."""
    f = x.astype(jnp.float32) * 3.0
    return jnp.sum(f, AXES), jnp.sum(jnp.square(f), AXES), f * 2.0


def _alone(x):
    """One sum of a chain that nothing else reads."""
    return jnp.sum(jnp.square(x.astype(jnp.float32)), AXES)


def _barriers(fn, *args) -> int:
    return sum(e.primitive.name == "optimization_barrier" for e in h.equations(fn, *args))


def _x(shape=(4, 6, 6, 8)):
    return h.random(np.random.default_rng(0), shape, jnp.bfloat16) * 3.0


def test_sums_of_a_shared_chain_read_copies_of_its_source():
    x = _x()
    accelerated = jaxconv.accelerate(_stats)
    # one barrier per sum, the second reading the first's copy (XLA would merge two alike)
    assert _barriers(accelerated, x) == 2
    got = jax.jit(accelerated)(x)
    for g, w in zip(got, jax.jit(_stats)(x)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    f64 = np.asarray(x, np.float64)
    for g, w in zip(got, (f64.sum(AXES), (f64 ** 2).sum(AXES), f64 * 2.0)):
        h.assert_close(g, w, jnp.float32)


@pytest.mark.parametrize("fn, dtype, copies", [
    (_centred, jnp.bfloat16, 1), (_masked, jnp.bfloat16, 0), (_tripled, jnp.float32, 0),
    (_alone, jnp.bfloat16, 0)],
    ids=["through a broadcast", "through a mask", "float32 sources", "unshared"])
def test_other_chains_run_as_written(fn, dtype, copies):
    """The centred variance's sum reads its operand as written (the mean's sum, of the shared
    float32 input, reads a copy), and so do a sum of a masked value and a sum of a float32
    chain of float32 values (its copy is no wider than its sources); a chain that nothing
    else reads is fused as it is."""
    x = _x().astype(dtype)
    assert _barriers(jaxconv.accelerate(fn), x) == copies
    for g, w in zip(jax.tree.leaves(jax.jit(jaxconv.accelerate(fn))(x)),
                    jax.tree.leaves(jax.jit(fn)(x))):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_recomputed_sums_compose_with_grad_and_vmap():
    x = _x()

    def loss(x):
        s, q, d = _stats(x)
        return jnp.sum(s * q) + jnp.sum(d)

    # the sums' values are the program's; the gradient's bfloat16 arithmetic runs in float32
    # (accelerate/widening.py), within bfloat16's bound of the program as written
    got = jax.jit(jax.grad(jaxconv.accelerate(loss)))(x)
    h.assert_close(got, jax.jit(jax.grad(loss))(x), jnp.bfloat16)
    batched = jnp.stack([x, x * 2.0])
    got = jax.jit(jax.vmap(jaxconv.accelerate(_stats)))(batched)
    want = jax.jit(jax.vmap(_stats))(batched)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_xla_writes_no_float32_copy():
    """What the rule is for: compiled, no instruction outside a fusion's body writes the
    float32 input (XLA:CPU's library fusions of sums read the bfloat16 one)."""
    x = _x((8, 28, 28, 64))

    def written(fn) -> int:
        text = jax.jit(fn).lower(x).compile().as_text()
        entry = text[text.index("ENTRY"):]
        return len(re.findall(r"= f32\[8,28,28,64\]", entry))

    plain = jax.jit(_stats).lower(x).compile().as_text()
    if "ynn_fusion" not in plain:
        pytest.skip("this XLA:CPU does not sum in library fusions")
    # without the rule: the float32 input (read by both sums) and the doubled result
    assert written(_stats) == 2
    assert written(jaxconv.accelerate(_stats)) == 1  # the doubled result alone
