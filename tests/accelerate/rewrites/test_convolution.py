"""The convolution rewrite (``accelerate/rewrites/convolution.py``): each lax pattern it
recognises, against jax.vjp of lax.

The oracle is lax itself (the unaccelerated function: its values and JAX's own derivatives);
the recognised equations must leave no lax convolution behind. Whole models:
tests/accelerate/test_models.py; sharded jit and shard_map: tests/distributed/sharded_ops.py.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax import lax

import jaxconv
from jaxconv._src.accelerate.rewrites import convolution
from tests.support import helpers as h
from tests.ops.test_lax_conv import CASES, HIGHEST
from tests.ops.test_lax_conv_space import _close, _operand, calls


def _prims(fn, *args) -> list[str]:
    return [e.primitive.name for e in h.equations(fn, *args)]


def _grad_fn(kw):
    def loss(x, w):
        y = lax.conv_general_dilated(x, w, **kw)
        return jnp.sum(jnp.sin(y.astype(jnp.float32)))
    return jax.grad(loss, (0, 1))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_drop_in_cases_through_accelerate_equal_lax_and_leave_no_lax_convolution(case):
    _, xs, ws, dn, s, pad, d, g = case
    rng = np.random.default_rng(len(case[0]))
    x, w = h.random(rng, xs), h.random(rng, ws)
    kw = dict(window_strides=s, padding=pad, rhs_dilation=d, dimension_numbers=dn,
              feature_group_count=g, precision=HIGHEST)
    grads = _grad_fn(kw)
    got, want = jax.jit(jaxconv.accelerate(grads))(x, w), grads(x, w)
    for a, b in zip(got, want):
        h.assert_close(a, b, jnp.float32)
    prims = _prims(jaxconv.accelerate(grads), x, w)
    assert "conv_general_dilated" not in prims and prims.count("jaxconv_conv") == 3


# (id, data spec, filter spec, strides, padding, dilation, groups, spatial): the transposes
# autodiff writes for each, recognised as data and weight gradients
PATTERNS = [
    ("1d-stride3-crop", ("NWC", "WIO", "NWC"), (3,), [(0, 0)], (1,), 1, (11,)),
    ("2d-stride2-1x1", ("NHWC", "HWIO", "NHWC"), (2, 2), "VALID", (1, 1), 1, (9, 8)),
    ("2d-dilated-grouped", ("NCHW", "OIHW", "NCHW"), (2, 1), [(2, 1), (0, 2)], (2, 2), 2, (9, 10)),
    ("2d-depthwise", ("NHWC", "HWIO", "NHWC"), (2, 2), "SAME", (1, 1), 4, (8, 8)),
    ("3d-strided", ("NDHWC", "DHWIO", "NDHWC"), (2, 1, 2), "SAME", (1, 2, 1), 1, (5, 6, 5)),
]


@pytest.mark.parametrize("pattern", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_each_gradient_pattern_is_jaxconvs_kernel_and_equals_lax_vjp(pattern):
    name, dn, s, pad, d, g, spatial = pattern
    n, c_in, c_out = len(spatial), 4, 8
    kernel = (3,) * n if "1x1" not in name else (1,) * n
    rng = np.random.default_rng(3)
    lhs_shape = lax.conv_dimension_numbers((1,) * (n + 2), (1,) * (n + 2), dn).lhs_spec
    x = h.random(rng, tuple(np.array([2, c_in, *spatial])[np.argsort(lhs_shape)]))
    rhs_spec = lax.conv_dimension_numbers((1,) * (n + 2), (1,) * (n + 2), dn).rhs_spec
    w = h.random(rng, tuple(np.array([c_out, c_in // g, *kernel])[np.argsort(rhs_spec)]))
    kw = dict(window_strides=s, padding=pad, rhs_dilation=d, dimension_numbers=dn,
              feature_group_count=g, precision=HIGHEST)
    closed = jax.make_jaxpr(_grad_fn(kw))(x, w)
    kinds = [convolution.conv_kind(e.params, e.invars[0].aval, e.invars[1].aval,
                                   e.outvars[0].aval.shape)
             for e in closed.eqns if e.primitive.name == "conv_general_dilated"]
    strided = any(v > 1 for v in s)
    want = ["forward", "data" if strided else "forward", "weight"]
    assert sorted(map(str, kinds)) == sorted(want)
    got = jax.jit(jaxconv.accelerate(_grad_fn(kw)))(x, w)
    for a, b in zip(got, _grad_fn(kw)(x, w)):
        h.assert_close(a, b, jnp.float32)
    kernels = [e.params["kernel"] for e in h.equations(jaxconv.accelerate(_grad_fn(kw)), x, w)
               if e.primitive.name == "jaxconv_conv"]
    assert sorted(map(str, kernels)) == sorted(want)


def test_bfloat16_kernels_within_bfloat16_tolerance():
    """The forward and both transposes jax.vjp writes, in bfloat16, against the same in float32
    from the same operands (one kernel each: the bound of one bfloat16 convolution)."""
    rng = np.random.default_rng(5)
    x, w = h.random(rng, (2, 10, 10, 8), jnp.bfloat16), h.random(rng, (3, 3, 8, 8), jnp.bfloat16)
    ct = h.random(rng, (2, 5, 5, 8), jnp.bfloat16)

    def vjp(x, w, ct, precision=None):
        y, back = jax.vjp(lambda x, w: lax.conv_general_dilated(
            x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=precision), x, w)
        return (y, *back(ct))

    exact = vjp(*(a.astype(jnp.float32) for a in (x, w, ct)), precision=HIGHEST)
    fast = jaxconv.accelerate(vjp)
    assert _prims(fast, x, w, ct).count("jaxconv_conv") == 3
    for a, b in zip(jax.jit(fast)(x, w, ct), exact):
        h.assert_close(a.astype(jnp.float32), b, jnp.bfloat16)


@settings(max_examples=max(30, settings.default.max_examples))
@given(calls())
def test_every_call_lax_accepts_keeps_its_value_and_gradient_under_accelerate(call):
    rng = np.random.default_rng(call["seed"])
    dtype, kw = call["dtype"], call["kwargs"]
    x, w = _operand(rng, call["lhs_shape"], dtype), _operand(rng, call["rhs_shape"], dtype)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, **kw)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = jax.block_until_ready(conv(x, w))
    except (TypeError, ValueError, jax.errors.JaxRuntimeError):
        # lax refuses it, or the backend cannot compile lax's own program (XLA:GPU's cuDNN has
        # no integer convolution of some shapes): nothing to accelerate
        return
    _close(jax.jit(jaxconv.accelerate(conv))(x, w), want, dtype)
    if dtype in ("float32", "bfloat16") and want.size and x.size and w.size:
        ct = _operand(rng, want.shape, dtype)

        def grads(x, w):
            return jax.grad(lambda x, w: jnp.sum((conv(x, w) * ct).astype(jnp.float32)),
                            (0, 1))(x, w)

        for g, r in zip(jax.jit(jaxconv.accelerate(grads))(x, w), grads(x, w)):
            _close(g, r, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("dn", [("NHWC", "HWIO", "NHWC"), ("NCHW", "OIHW", "NCHW")])
def test_stride_1_data_gradients_run_as_data_gradients_of_the_filter(dn, dtype):
    """Autodiff writes a stride-1 convolution's data gradient as a forward convolution of the
    ``rev`` of the filter with its roles swapped: it runs as jaxconv's data-gradient kernel of
    the filter before the ``rev`` (no reversal, no transposed copy of the filter left in the
    program), within the dtype's bound of the gradients in float64; ``explain`` says so."""
    rng = np.random.default_rng(11)
    x = h.random(rng, (2, 10, 9, 6) if dn[0] == "NHWC" else (2, 6, 10, 9), dtype)
    w = h.random(rng, (3, 3, 6, 5) if dn[1] == "HWIO" else (5, 6, 3, 3))

    def loss(x, w, dtype=dtype):
        y = lax.conv_general_dilated(x, w.astype(dtype), (1, 1), ((1, 1), (0, 2)),
                                     dimension_numbers=dn, precision=lax.Precision.HIGHEST)
        return jnp.sum(jnp.sin(y.astype(jnp.float32 if dtype != jnp.float64 else dtype)))

    grads = jax.grad(loss, (0, 1))
    with jax.enable_x64(True):  # the oracle: the same rounded inputs, in float64
        want = jax.grad(loss, (0, 1))(h.to_f64(x), h.to_f64(w.astype(dtype)), jnp.float64)
    for got, ref in zip(jax.jit(jaxconv.accelerate(grads))(x, w), want):
        h.assert_close(got, ref, dtype)
    jaxpr = jax.make_jaxpr(jaxconv.accelerate(grads))(x, w).jaxpr
    made = {v: e for e in jaxpr.eqns for v in e.outvars}
    convs = {str(e.params["kernel"]): e for e in jaxpr.eqns if e.primitive.name == "jaxconv_conv"}
    assert sorted(convs) == ["data", "forward", "weight"]
    filt, path = convs["data"].invars[1], []  # what the data gradient's filter is made by
    while filt in made:
        path.append(made[filt].primitive.name)
        filt = made[filt].invars[0]
    assert filt is jaxpr.invars[1] and "rev" not in path
    if dn[1] == "HWIO":  # the handler's layout: the filter read as it is
        assert set(path) <= {"convert_element_type"}
    assert re.search(r"convolution +data +lax", str(jaxconv.explain(grads, x, w)))


def _conv_transpose(x, k):  # flax's ConvTranspose: the kernel as given, input dilation 2
    return lax.conv_general_dilated(x, k, (1, 1), [(2, 2), (2, 2)], lhs_dilation=(2, 2),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))


@pytest.mark.parametrize("faster", ["lax", "jaxconv"])
def test_a_transposed_convolution_runs_as_written_where_that_timed_faster(measuring, monkeypatch,
                                                                           faster):
    """A transposed convolution the program wrote with its own filter is timed in its context
    against jaxconv's data-gradient kernel of the reversed filter, on the equation's operands;
    the faster one runs (the rule, untimed: jaxconv's), and explain gives the reason."""
    timed = []

    def fake(c, seconds):
        if not c.method.startswith("as written"):  # the kernel's own choice: the rule stays
            return {m: [1.0] * 7 for m in c.calls}
        timed.append((c.method, c.shapes, tuple(c.calls)))
        with jax.ensure_compile_time_eval():  # each candidate computes the equation
            a, b = (h.random(np.random.default_rng(5), s) for s in c.shapes)
            for call in c.calls.values():
                h.assert_close(jax.jit(call)(a, b), _conv_transpose(a, b), jnp.float32)
        other = "jaxconv" if faster == "lax" else "lax"
        return {faster: [1.0] * 7, other: [2.0] * 7}
    monkeypatch.setattr(measuring, "_sample_times", fake)
    rng = np.random.default_rng(6)
    x, k = h.random(rng, (1, 4, 4, 16)), h.random(rng, (4, 4, 16, 8))
    prims = _prims(jaxconv.accelerate(_conv_transpose), x, k)
    assert timed and timed[0][1] == ((1, 4, 4, 16), (4, 4, 16, 8))
    assert ("conv_general_dilated" in prims) == (faster == "lax")
    assert ("jaxconv_conv" in prims) == (faster == "jaxconv")
    h.assert_close(jax.jit(jaxconv.accelerate(_conv_transpose))(x, k), _conv_transpose(x, k),
                   jnp.float32)
    reasons = {key for d in jaxconv.explain(_conv_transpose, x, k).decisions for _, key in d.reasons}
    assert ("written faster" in reasons) == (faster == "lax")
