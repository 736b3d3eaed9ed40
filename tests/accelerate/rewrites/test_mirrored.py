"""A written transposed convolution computed mirrored (``accelerate/rewrites/mirrored.py``):
its input and result reversed, its filter read in its own layout; served (its filter a
constant of the program), never mirrored: its filter reversed and packed once
(``accelerate/rewrites/convolution.py``).

Oracle: lax's ``conv_general_dilated`` as written at HIGHEST (a dilated kernel spelled out with
zeros: XLA:CPU may abort on a dilated transposed convolution, docs/semantics.md), and JAX's
own derivatives of it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src.accelerate.rewrites import mirrored
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support.onednn_matrix import needs_onednn

HIGHEST = lax.Precision.HIGHEST

# (id, dimension numbers, input shape, kernel's spatial shape, input dilation, padding,
#  kernel dilation): each filter outweighs its input and result (the mirror applies)
CASES = [
    ("dcgan-4x4-s2", ("NHWC", "HWIO", "NHWC"), (1, 4, 4, 32), (4, 4), (2, 2), [(2, 2), (2, 2)],
     (1, 1)),
    ("uneven-pads", ("NHWC", "HWIO", "NHWC"), (2, 3, 4, 24), (3, 3), (2, 2), [(1, 2), (2, 0)],
     (1, 1)),
    ("nchw-oihw-s3-dilated", ("NCHW", "OIHW", "NCHW"), (1, 24, 3, 3), (3, 2), (3, 2),
     [(0, 1), (2, 2)], (1, 2)),
    ("hwoi", ("NHWC", "HWOI", "NHWC"), (1, 3, 3, 32), (3, 3), (2, 2), [(1, 1), (1, 1)], (1, 1)),
    ("iohw", ("NCHW", "IOHW", "NCHW"), (1, 32, 3, 3), (2, 2), (2, 2), [(1, 1), (0, 1)], (1, 1)),
    ("1d", ("NWC", "WIO", "NWC"), (1, 5, 40), (5,), (2,), [(3, 4)], (1,)),
    ("3d", ("NDHWC", "DHWIO", "NDHWC"), (1, 2, 3, 2, 16), (2, 3, 2), (2, 1, 2),
     [(1, 1), (0, 2), (1, 0)], (1, 1, 1)),
]
_OUT = 8  # the result's channels


def _filter_shape(dn, in_channels: int, kernel) -> tuple[int, ...]:
    spec = dn[1]
    sizes = dict(zip((c for c in spec if c not in "IO"), kernel), I=in_channels, O=_OUT)
    return tuple(sizes[c] for c in spec)


def _written(dn, lhs_dilation, padding, rhs_dilation):
    def f(x, k):
        return lax.conv_general_dilated(x, k, (1,) * len(padding), padding, lhs_dilation,
                                        rhs_dilation, dn, precision=HIGHEST)
    return f


def _oracle(dn, lhs_dilation, padding, rhs_dilation):
    """As written, with a dilated kernel's zeros spelled out (no kernel dilation for XLA)."""
    def f(x, k):
        spec = dn[1]
        axes = [i for i, c in enumerate(spec) if c not in "IO"]
        for axis, d in zip(axes, rhs_dilation):
            if d > 1:
                widths = [(0, 0, 0)] * k.ndim
                widths[axis] = (0, 0, d - 1)
                k = lax.pad(k, jnp.zeros((), k.dtype), widths)
        return lax.conv_general_dilated(x, k, (1,) * len(padding), padding, lhs_dilation,
                                        None, dn, precision=HIGHEST)
    return f


def _case(case):
    _, dn, xs, kernel, lhs_dilation, padding, rhs_dilation = case
    rng = np.random.default_rng(len(case[0]))
    c = xs[dn[0].index("C")]
    x, k = h.random(rng, xs), h.random(rng, _filter_shape(dn, c, kernel))
    return dn, x, k, lhs_dilation, padding, rhs_dilation


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_mirror_computes_the_written_transposed_convolution(case):
    dn, x, k, lhs_dilation, padding, rhs_dilation = _case(case)
    want = _oracle(dn, lhs_dilation, padding, rhs_dilation)(x, k)
    eqn = jax.make_jaxpr(_written(dn, lhs_dilation, padding, rhs_dilation))(x, k).eqns[0]
    p = mirrored.problem(eqn.params, x.shape, k.shape, want.shape)
    assert not isinstance(p, str), p
    assert mirrored.mirrors(p)
    got = jax.jit(lambda a, b: mirrored.data_pattern(eqn.params, a, b, p))(x, k)
    assert got.shape == want.shape
    h.assert_close(got, want, jnp.float32)


@pytest.mark.parametrize("case", CASES[:2] + CASES[3:4], ids=[c[0] for c in CASES[:2] + CASES[3:4]])
def test_accelerate_reverses_the_activations_not_the_filter_and_differentiates(case):
    """Under accelerate the equation becomes jaxconv's kernel between two reversals of
    activations, with no copy of the filter; the values and both derivatives are lax's."""
    dn, x, k, lhs_dilation, padding, rhs_dilation = _case(case)
    f = _written(dn, lhs_dilation, padding, rhs_dilation)
    prims = [e.primitive.name for e in h.equations(jaxconv.accelerate(f), x, k)]
    assert prims.count("jaxconv_conv") == 1 and prims.count("rev") == 2
    assert "transpose" not in prims and "conv_general_dilated" not in prims
    h.assert_close(jax.jit(jaxconv.accelerate(f))(x, k), f(x, k), jnp.float32)

    def loss(fn):
        return lambda a, b: jnp.sum(jnp.sin(fn(a, b)))
    got = jax.jit(jax.grad(loss(jaxconv.accelerate(f)), (0, 1)))(x, k)
    want = jax.grad(loss(f), (0, 1))(x, k)
    for a, b in zip(got, want):
        h.assert_close(a, b, jnp.float32)
    # forward mode, and vmap over a leading axis of both operands
    tx, tk = h.random(np.random.default_rng(2), x.shape), h.random(np.random.default_rng(3), k.shape)
    got_t = jax.jvp(jaxconv.accelerate(f), (x, k), (tx, tk))[1]
    h.assert_close(got_t, jax.jvp(f, (x, k), (tx, tk))[1], jnp.float32)
    xs, ks = jnp.stack([x, tx]), jnp.stack([k, tk])
    h.assert_close(jax.jit(jax.vmap(jaxconv.accelerate(f)))(xs, ks), jax.vmap(f)(xs, ks),
                   jnp.float32)
    text = str(jaxconv.explain(f, x, k))
    assert "mirrored (its filter read in place)" in text, text


@pytest.mark.parametrize("dn, kernel, padding, groups, why", [
    (("NHWC", "HWIO", "NHWC"), (3, 3), [(1, 1), (1, 1)], 2, "groups"),
    (("NHWC", "OHWI", "NHWC"), (3, 3), [(1, 1), (1, 1)], 1, "layout"),
    (("NCHW", "OIHW", "NHWC"), (3, 3), [(1, 1), (1, 1)], 1, "layout"),
    (("NHWC", "HWIO", "NHWC"), (3, 3), [(3, 1), (1, 1)], 1, "pad range"),
])
def test_no_mirror_and_why(dn, kernel, padding, groups, why):
    xs = (1, 4, 4, 8) if dn[0] == "NHWC" else (1, 8, 4, 4)
    k = jnp.zeros(_filter_shape(dn, 8 // groups, kernel))
    f = lambda a, b: lax.conv_general_dilated(a, b, (1, 1), padding, (2, 2), None, dn,  # noqa: E731
                                              feature_group_count=groups)
    x = jnp.zeros(xs)
    eqn = jax.make_jaxpr(f)(x, k).eqns[0]
    assert mirrored.problem(eqn.params, x.shape, k.shape, eqn.outvars[0].aval.shape) == why


@pytest.mark.parametrize("case", CASES[:1] + CASES[2:3], ids=[c[0] for c in CASES[:1] + CASES[2:3]])
def test_a_bfloat16_mirror_is_within_bfloat16s_bound_of_float64(case):
    """bfloat16 operands: the mirrored kernel's result (float32 sums, rounded once) is within
    bfloat16's bound of the float64 oracle (the same operands, widened)."""
    dn, x, k, lhs_dilation, padding, rhs_dilation = _case(case)
    xb, kb = x.astype(jnp.bfloat16), k.astype(jnp.bfloat16)
    with jax.enable_x64():
        want = _oracle(dn, lhs_dilation, padding, rhs_dilation)(
            jnp.asarray(h.to_f64(xb)), jnp.asarray(h.to_f64(kb)))
    f = _written(dn, lhs_dilation, padding, rhs_dilation)
    prims = [e.primitive.name for e in h.equations(jaxconv.accelerate(f), xb, kb)]
    assert prims.count("jaxconv_conv") == 1 and prims.count("rev") == 2
    got = jax.jit(jaxconv.accelerate(f))(xb, kb)
    assert got.dtype == jnp.bfloat16
    h.assert_close(got, np.asarray(want), jnp.bfloat16)


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_served_transposed_convolution_is_not_mirrored_its_filter_is_packed(case, dtype):
    """Its filter closed over (a constant of the program): no reversal of the filter or of the
    activations in the program, one data-gradient call per convolution that reads the filter
    packed where oneDNN runs it (``explain`` says so), lax's values, and ``grad`` and ``vmap``
    over the input as lax's."""
    dn, x, k, lhs_dilation, padding, rhs_dilation = _case(case)
    x, k = x.astype(dtype), k.astype(dtype)
    f = _written(dn, lhs_dilation, padding, rhs_dilation)

    def served(a):
        return f(a, k)
    serve = jaxconv.accelerate(served)
    prims = [e.primitive.name for e in h.equations(serve, x)]
    assert "rev" not in prims and "conv_general_dilated" not in prims, prims
    (call,) = [e for e in h.equations(serve, x) if e.primitive.name == "jaxconv_fused"]
    assert call.params["kernel"] == "data" and call.params["constant"]
    told = jaxconv.explain(served, x)
    assert any("packed once" in d.label for d in told.decisions), told
    on_onednn = sum(r.count for r in jaxconv.explain(serve, x).rows
                    if r.lowering.startswith("onednn"))
    assert bool(call.params["packed"]) == (on_onednn == 1)
    before = library.cache_stats()["packed_reads"]
    got = jax.jit(serve)(x)
    assert library.cache_stats()["packed_reads"] >= before + on_onednn
    want = _oracle(dn, lhs_dilation, padding, rhs_dilation)
    h.assert_close(got, want(x.astype(jnp.float32), k.astype(jnp.float32)), jnp.dtype(dtype))

    def loss(fn):
        return lambda a: jnp.sum(jnp.sin(fn(a).astype(jnp.float32)))
    h.assert_close(jax.jit(jax.grad(loss(serve)))(x), jax.grad(loss(served))(x), jnp.dtype(dtype))
    xs = jnp.stack([x, -x])
    h.assert_close(jax.jit(jax.vmap(serve))(xs), jax.vmap(served)(xs), jnp.dtype(dtype))
