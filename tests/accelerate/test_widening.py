"""jaxconv.accelerate's 16-bit arithmetic in float32 (``accelerate/widening.py``).

Oracles: the same chain computed in float64 (the widened values must be at least as accurate
as the program as written, within the dtype's bound of float64's), and float32 programs, which
must trace to the same equations as without accelerate.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src.accelerate import widening
from tests.support import helpers as h

NARROW = [jnp.bfloat16, jnp.float16]


def _chain(a, b):
    """relu(a * 1.5 + b) * sigmoid(b) - a: seven element-wise operations and a comparison."""
    return jnp.where(a * 1.5 + b > 0, a * 1.5 + b, 0) * jax.nn.sigmoid(b) - a


def _converts_to(jaxpr: str, dtype) -> int:
    short = {jnp.bfloat16: "bf16", jnp.float16: "f16"}[dtype]
    return len(re.findall(rf"\b{short}\[[^\]]*\] = convert_element_type", jaxpr))


@pytest.mark.parametrize("dtype", NARROW)
def test_element_wise_chains_round_once(dtype):
    """A chain of element-wise operations on a 16-bit float computes in float32 and rounds its
    result once: the value of the chain in float32 rounded, no further from float64's than the
    chain as written, and one rounding in the traced program where there was one per
    operation."""
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((4, 33, 17)), dtype) for _ in range(2))
    got = jax.jit(jaxconv.accelerate(_chain))(a, b)
    assert got.dtype == dtype
    wide = _chain(np.asarray(a, np.float64), np.asarray(b, np.float64))
    once = jax.jit(lambda a, b: _chain(a.astype(jnp.float32), b.astype(jnp.float32)).astype(dtype))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(once(a, b), np.float32))
    err = np.max(np.abs(np.asarray(got, np.float64) - wide))
    written = np.max(np.abs(np.asarray(jax.jit(_chain)(a, b), np.float64) - wide))
    assert err <= written
    h.assert_close(got, wide, dtype)
    after = str(jax.make_jaxpr(jaxconv.accelerate(_chain))(a, b))
    assert _converts_to(after, dtype) == 1
    assert not re.search(r"\b(bf16|f16)\[[^\]]*\] = (mul|add|sub|max|select_n)", after)


def test_float32_programs_trace_as_written():
    """Nothing changes where no 16-bit float is computed on."""
    rng = np.random.default_rng(1)
    a, b = (jnp.asarray(rng.standard_normal((8, 8)), jnp.float32) for _ in range(2))
    before = jax.make_jaxpr(_chain)(a, b)
    after = jax.make_jaxpr(jaxconv.accelerate(_chain))(a, b)
    assert [e.primitive.name for e in after.eqns] == [e.primitive.name for e in before.eqns]


@pytest.mark.parametrize("dtype", NARROW)
def test_casts_keep_the_float32_value(dtype):
    """A cast to the 16-bit dtype and back (flax's parameters, cast for a layer, read by its
    statistics in float32) keeps the float32 value; a cast that leaves the chain (a result)
    rounds."""
    x = jnp.asarray([1.0 + 2.0 ** -12, -3.0 - 2.0 ** -13], jnp.float32)

    def f(x):
        y = x.astype(dtype) * 2
        return y.astype(jnp.float32), y

    wide, narrow = jax.jit(jaxconv.accelerate(f))(x)
    np.testing.assert_array_equal(np.asarray(wide), np.asarray(x) * 2)
    assert narrow.dtype == dtype
    np.testing.assert_array_equal(np.asarray(narrow), np.asarray((x * 2).astype(dtype)))


@pytest.mark.parametrize("dtype", NARROW)
def test_gradients_through_nested_jits_and_custom_rules(dtype):
    """``jax.nn.relu`` (a ``custom_jvp``) and a nested ``jit`` inside a chain: the gradient of the
    accelerated function, and the accelerated gradient, are within the dtype's bound of the
    gradient in float64 (on the same rounded inputs)."""
    rng = np.random.default_rng(2)
    a, b = (jnp.asarray(rng.standard_normal((16, 9)), dtype) for _ in range(2))
    inner = jax.jit(lambda u, v: jnp.tanh(u * v) + u)

    def loss(a, b, wide=jnp.float32):
        return jnp.sum(jax.nn.relu(inner(a, b) - b * 0.5).astype(wide) ** 2)

    with jax.enable_x64(True):
        want = jax.grad(loss, (0, 1))(h.to_f64(a), h.to_f64(b), jnp.float64)
    for got in (jax.jit(jax.grad(jaxconv.accelerate(loss), (0, 1)))(a, b),
                jax.jit(jaxconv.accelerate(jax.grad(loss, (0, 1))))(a, b)):
        for g, w in zip(got, want):
            assert g.dtype == dtype
            h.assert_close(g, w, dtype)


def test_max_pools_of_bfloat16_run_on_float32():
    """A max pool of bfloat16 and its gradient (flax's ``nn.max_pool``) run on float32: the
    same values (a maximum, and the values it selects, round back exactly), no bfloat16 pool
    in the program."""
    import flax.linen as nn

    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 12, 12, 8)), jnp.bfloat16)

    def loss(x):
        y = nn.max_pool(jax.nn.relu(x), (3, 3), (2, 2), padding=((1, 1), (1, 1)))
        return jnp.sum(y.astype(jnp.float32) ** 2)

    grad = jax.grad(loss)
    np.testing.assert_array_equal(np.asarray(jax.jit(jaxconv.accelerate(grad))(x), np.float32),
                                  np.asarray(jax.jit(grad)(x), np.float32))
    after = str(jax.make_jaxpr(jaxconv.accelerate(grad))(x))
    assert re.search(r"f32\[[^\]]*\] = jaxconv_max_pool_scatter", after)
    assert not re.search(r"bf16\[[^\]]*\] = jaxconv_max_pool", after)


def test_a_comparison_reads_the_value_its_neighbours_took():
    """Where a reader has taken a chain's 16-bit value (``jax.nn.relu``, a ``custom_jvp`` whose
    input is rounded), a comparison of the same value (the ReLU's mask in its gradient) reads
    that value too, as written: the program keeps one width of it."""
    x = jnp.ones((4, 8), jnp.bfloat16)

    def loss(x):
        return jnp.sum(jax.nn.relu(x * 2 + 1).astype(jnp.float32))

    jaxpr = jax.make_jaxpr(jaxconv.accelerate(jax.grad(loss)))(x).jaxpr
    made = {v: e for e in jaxpr.eqns for v in e.outvars}
    (gt,) = [e for e in jaxpr.eqns if e.primitive.name == "gt"]
    widen = made[gt.invars[0]]  # the mask reads the rounded value, widened again
    assert widen.primitive.name == "convert_element_type"
    assert widen.invars[0].aval.dtype == jnp.bfloat16


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_sums_of_16_bit_floats_run_in_float32(dtype):
    """A ``reduce_sum`` of a 16-bit float (autodiff's transpose of a broadcast: a bias's
    gradient) sums in float32 and rounds once: within the dtype's bound of float64's sum of the
    same cotangent (16,384 terms: a sum in 16 bits is not). A float32 sum runs as written."""
    import re

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((64, 16, 16, 8)), dtype)
    b = jnp.asarray(rng.standard_normal(8), jnp.float32)

    def loss(b, x):
        return jnp.sum(jnp.sin((x + b.astype(x.dtype)[None, None, None]).astype(jnp.float32)))

    grad = jax.grad(loss)
    got = jax.jit(jaxconv.accelerate(grad))(b, x)
    ct = jnp.cos((x + b.astype(dtype)[None, None, None]).astype(jnp.float32)).astype(dtype)
    ref = np.sum(np.asarray(ct, np.float64), axis=(0, 1, 2))
    h.assert_close(got, ref, dtype)
    before = str(jax.make_jaxpr(grad)(b, x))
    after = str(jax.make_jaxpr(jaxconv.accelerate(grad))(b, x))
    narrow = re.compile(r"\b(bf16|f16)\[[^\]]*\] = reduce_sum")
    if dtype == jnp.float32:
        assert after.count("reduce_sum") == before.count("reduce_sum")
        assert after.count("convert_element_type") == before.count("convert_element_type")
    else:
        assert narrow.search(before) and not narrow.search(after)


def test_the_widening_pass_writes_explicit_converts():
    """The first of accelerate's passes (``transform.PASSES``) is a jaxpr-to-jaxpr pass: 16-bit
    element-wise arithmetic computes on float32 values, with explicit converts where a value
    leaves it (here for the convolution, which reads bfloat16); the kernels pass then reads a
    program with no 16-bit arithmetic left to widen, and its result is accelerate's program."""
    from jax import lax

    from jaxconv._src.accelerate import transform

    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 8, 8, 4)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((3, 3, 4, 4)), jnp.bfloat16)

    def f(x, w):
        h = jnp.maximum(x * 1.5 + 0.5, 0)
        return lax.conv_general_dilated(h, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    widened = transform.passes(jax.make_jaxpr(f)(x, w))
    arithmetic = [e for e in widened.eqns if e.primitive.name in ("mul", "add", "max")]
    assert arithmetic and all(e.outvars[0].aval.dtype == jnp.float32 for e in arithmetic)
    converts = [(e.invars[0].aval.dtype, e.params["new_dtype"]) for e in widened.eqns
                if e.primitive.name == "convert_element_type"]
    assert (jnp.bfloat16, jnp.float32) in converts and (jnp.float32, jnp.bfloat16) in converts
    (conv,) = [e for e in widened.eqns if e.primitive.name == "conv_general_dilated"]
    assert conv.invars[0].aval.dtype == jnp.bfloat16
    assert not any(widening.targets(e) for e in widened.eqns
                   if e.primitive.name != "convert_element_type")
    kernels = jax.make_jaxpr(lambda x, w: transform.evaluate(
        widened.jaxpr, widened.consts, [x, w]))(x, w)
    assert str(kernels) == str(jax.make_jaxpr(jaxconv.accelerate(f))(x, w))

