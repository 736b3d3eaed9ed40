"""jaxconv.accelerate: each lax pattern it recognises against jax.vjp of lax, and its composition.

The oracle is lax itself (the unaccelerated function: its values and JAX's own derivatives);
the recognised equations must leave no lax convolution or XLA max-pool gradient behind.
Whole models: tests/accelerate/test_models.py; sharded jit and shard_map:
tests/distributed/sharded_ops.py.
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
from jaxconv._src.accelerate import patterns
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
    kinds = [patterns.conv_kind(e.params, e.invars[0].aval, e.invars[1].aval,
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


# ------------------------------------------------------------------------------ max pool

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


# ----------------------------------------------------------------------------- composition

def _loss(w, x):
    y = lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 precision=HIGHEST)
    return jnp.sum(jnp.tanh(y) ** 2)


@pytest.fixture
def wx():
    rng = np.random.default_rng(7)
    return h.random(rng, (3, 3, 3, 4)), h.random(rng, (2, 8, 8, 3))


@pytest.mark.parametrize("compose", ["grad-outside", "vmap", "checkpoint-scan", "cond",
                                     "jit-inside", "hessian-vector"])
def test_composes_with_jax_transformations(compose, wx):
    w, x = wx
    acc = jaxconv.accelerate
    if compose == "grad-outside":
        pair = (jax.grad(acc(_loss)), jax.grad(_loss))
    elif compose == "vmap":
        pair = (jax.vmap(acc(jax.grad(_loss)), (None, 0)), jax.vmap(jax.grad(_loss), (None, 0)))
        x = jnp.stack([x, 2 * x])
    elif compose == "checkpoint-scan":
        def f(w, x):
            return lax.scan(lambda c, _: (c + jax.checkpoint(_loss)(w, x), None), 0.0, None,
                            length=2)[0]
        pair = (acc(jax.grad(f)), jax.grad(f))
    elif compose == "cond":
        def f(w, x):
            return lax.cond(x[0, 0, 0, 0] > 0, _loss, lambda w, x: 2 * _loss(w, x), w, x)
        pair = (acc(jax.grad(f)), jax.grad(f))
    elif compose == "jit-inside":
        pair = (acc(jax.jit(jax.grad(_loss))), jax.grad(_loss))
    else:
        def hvp(w, x):
            return jax.jvp(jax.grad(_loss), (w, x), (jnp.ones_like(w), jnp.zeros_like(x)))[1]
        pair = (acc(hvp), hvp)
    ours, ref = pair
    h.assert_close(jax.jit(ours)(w, x), ref(w, x), jnp.float32)
    assert "conv_general_dilated" not in _prims(ours, w, x)


def test_static_arguments_stay_python_values(wx):
    w, x = wx

    def f(w, x, *, scale, train):
        return _loss(w, x) * scale if train else 0.0

    fast = jax.jit(jaxconv.accelerate(f), static_argnames="train")
    h.assert_close(fast(w, x, scale=2.0, train=True), 2 * _loss(w, x), jnp.float32)


def test_export_of_an_accelerated_step_runs_without_jaxconvs_handler(wx):
    from jax import export
    w, x = wx
    exp = export.export(jax.jit(jaxconv.accelerate(jax.grad(_loss))))(w, x)
    assert "custom_call" not in exp.mlir_module()  # no custom call: portable
    h.assert_close(exp.call(w, x), jax.grad(_loss)(w, x), jnp.float32)


def test_not_callable_raises_type_error():
    with pytest.raises(TypeError, match=r"^accelerate: fun must be callable, got int"):
        jaxconv.accelerate(3)


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


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@jax.default_matmul_precision("float32")  # GPUs round float32 products to TF32
def test_a_transposed_product_runs_in_the_layout_its_reader_wants(dtype):
    """Autodiff writes a dense layer's kernel gradient as ``transpose(dot_general(dy, x))``:
    it runs as ``dot_general(x, dy)``, no transpose left (XLA:CPU ran it as a strided loop
    where the bfloat16 rounding stood between it and the product), as accurate as written
    against float64; a product with batch dims, and a transpose of three axes, run as
    written."""
    rng = np.random.default_rng(12)
    x = h.random(rng, (8, 24), dtype)
    w = h.random(rng, (24, 10))

    def loss(w, x):
        return jnp.sum(jnp.square((x @ w.astype(dtype)).astype(jnp.float32))) / 2

    grad = jax.grad(loss)
    jaxpr = jax.make_jaxpr(jaxconv.accelerate(grad))(w, x).jaxpr
    assert "transpose" in {e.primitive.name for e in jax.make_jaxpr(grad)(w, x).jaxpr.eqns}
    assert "transpose" not in {e.primitive.name for e in jaxpr.eqns}
    x64 = h.to_f64(x)
    dy = h.to_f64((x @ w.astype(dtype)).astype(jnp.float32))
    want = x64.T @ dy
    got, written = jax.jit(jaxconv.accelerate(grad))(w, x), grad(w, x)
    assert got.shape == written.shape == w.shape and got.dtype == written.dtype
    if jnp.dtype(dtype).itemsize < 4:  # written, the product is rounded to 16 bits; in
        # float32 both errors are the GEMM's summation order, which differs between CPUs
        err = np.max(np.abs(h.to_f64(got) - want))
        assert err <= np.max(np.abs(h.to_f64(written) - want))
    h.assert_close(got, want, dtype)

    def batched(a, b):  # a batch dim: the transpose stays
        return jnp.transpose(lax.dot_general(a, b, (((2,), (2,)), ((0,), (0,)))), (0, 2, 1))

    a, b = h.random(rng, (2, 5, 4), dtype), h.random(rng, (2, 3, 4), dtype)
    names = [e.primitive.name for e in jax.make_jaxpr(jaxconv.accelerate(batched))(a, b).jaxpr.eqns]
    assert names.count("transpose") == 1
    np.testing.assert_array_equal(jaxconv.accelerate(batched)(a, b), batched(a, b))


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
