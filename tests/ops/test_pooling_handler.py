"""jaxconv.max_pool's forward and argmax on the handler (``native/pooling/max_pool.h``,
``lowering/max_pool.py``): the same values and argmax as XLA's two passes (ties, NaN, -inf,
windows of padding alone, both dtypes, in parts on XLA's pool), its gradients against
lax.reduce_window's and PyTorch's, under every transform, and where it does not run (an
export, another layout). The suite times nothing (``JAXCONV_MEASURE=0``: XLA's argmax, the
rule), so these tests take the handler's verdict (``on_the_handler``), and one times it."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxconv
from jaxconv._src import lowering, pooling
from jaxconv._src.geometry.pooling import pool_problem
from jaxconv._src.lowering import chooser, max_pool
from jaxconv._src.native import library
from tests.ops.test_pooling import check_against_torch_max_pool2d
from tests.support.helpers import TOLERANCE

# the handler's call in a lowered (StableHLO) program
TARGET = f"@{library.MAX_POOL_TARGET}("

# (shape NHWC, window, strides, padding)
CASES = [
    ((2, 9, 10, 3), (3, 3), (2, 2), ((1, 1), (1, 1))),  # ResNet's stem pool
    ((1, 8, 8, 16), (2, 2), (2, 2), "VALID"),
    ((3, 7, 5, 17), (3, 2), (1, 3), ((0, 2), (1, 1))),
    ((1, 6, 5, 5), (4, 4), (3, 2), ((2, 3), (3, 0))),  # pads up to a window's length
    ((1, 4, 4, 2), (2, 2), (1, 1), ((3, 3), (0, 0))),  # windows of padding alone
    ((4, 40, 40, 64), (3, 3), (2, 2), ((1, 1), (1, 1))),  # in parts on XLA's pool
]
IDS = ["stem", "2x2-valid", "3x2-s1x3", "4x4-wide-pads", "padding-only-windows", "parts"]


def _reference(x, window, strides, padding):
    """lax.reduce_window max, as flax.linen.max_pool calls it."""
    if not isinstance(padding, str):
        padding = ((0, 0), *padding, (0, 0))
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1), padding)


def _drawn(shape, dtype, seed=0):
    """Small integers (many ties), with NaN and -inf here and there."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, max(1, flat.size // 50), replace=False)] = np.nan
    flat[rng.choice(flat.size, max(1, flat.size // 50), replace=False)] = -np.inf
    return jnp.asarray(x, dtype)


@pytest.fixture
def on_the_handler(monkeypatch):
    """Every max pool's timed choice taken as the handler's where it applies (the suite times
    nothing: ``chooser.max_pool_why_not``), programs compiled afresh; where the handler is not
    loaded, the test skips."""
    if jax.default_backend() != "cpu" or not library.status().available:
        pytest.skip("the handler's max pool runs on the CPU, with the onednn extra")
    monkeypatch.setattr(chooser, "max_pool_why_not",
                        lambda x, p, *contenders: max_pool.handler_applies(x.dtype, p))
    jax.clear_caches()
    yield
    jax.clear_caches()


def _pool(window, strides, padding):
    return lambda x: jaxconv.max_pool(x, window, strides, padding)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,window,strides,padding", CASES, ids=IDS)
def test_the_handlers_pool_and_argmax_equal_xlas(on_the_handler, shape, window, strides,
                                                 padding, dtype):
    """Bit for bit: each window's maximum (NaN where a tap is NaN, -inf for padding alone) and
    its first maximal tap, a NaN tap never one."""
    x = _drawn(shape, dtype)
    _, p = pool_problem("max_pool", x, window, strides, padding, "NXC")
    y, arg = jax.jit(lambda x: max_pool.max_pool_call(x, p))(x)
    y_ref, arg_ref = jax.jit(lambda x: pooling._forward_and_argmax(x, p))(x)
    assert y.dtype == x.dtype and arg.dtype == jnp.int8 and y.shape == y_ref.shape
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
    np.testing.assert_array_equal(np.asarray(arg), np.asarray(arg_ref))
    np.testing.assert_array_equal(np.asarray(y, np.float32),
                                  np.asarray(_reference(x, window, strides, padding), np.float32))


_ISA_SCRIPT = """
import jax, numpy as np
from jaxconv._src import pooling
from jaxconv._src.geometry.pooling import pool_problem
from jaxconv._src.lowering import max_pool
from jaxconv._src.native import library
from tests.ops.test_pooling_handler import CASES, _drawn
assert library.status().available
print(library.winograd_isa())
for shape, window, strides, padding in CASES:
    for dtype in ("float32", "bfloat16"):
        x = _drawn(shape, dtype)
        _, p = pool_problem("max_pool", x, window, strides, padding, "NXC")
        y, arg = jax.jit(lambda x: max_pool.max_pool_call(x, p))(x)
        y_ref, arg_ref = jax.jit(lambda x: pooling._forward_and_argmax(x, p))(x)
        same = (np.array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32),
                               equal_nan=True) and np.array_equal(arg, arg_ref))
        print(int(same))
"""


@pytest.mark.parametrize("isa", ["avx2", "plain"])
def test_every_vector_isa_of_the_handlers_pool(isa):
    """The pool compiled for AVX2 and for no vector ISA, on this machine (JAXCONV_WINOGRAD_ISA
    narrows the widest for all the handler's vectorised code: runtime/isa.h), bit for bit
    XLA's passes on every case of both dtypes."""
    if jax.default_backend() != "cpu" or not library.status().available:
        pytest.skip("the handler's max pool runs on the CPU, with the onednn extra")
    env = dict(os.environ, JAXCONV_WINOGRAD_ISA=isa, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _ISA_SCRIPT], env=env, capture_output=True,
                         text=True, check=True, timeout=300).stdout.split()
    assert out[0] == isa or (isa, out[0]) == ("avx2", "plain")  # plain: a CPU without AVX2
    assert out[1:] == ["1"] * (2 * len(CASES)), out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,window,strides,padding", CASES, ids=IDS)
def test_gradients_on_the_handler_equal_lax_reduce_windows(on_the_handler, shape, window,
                                                           strides, padding, dtype):
    """The program runs the handler's pool (its custom call in the compiled program), and its
    VJP and JVP are lax.reduce_window's (XLA's select_and_scatter) on finite inputs without
    ties (XLA breaks a tie between overlapping windows by its own order)."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal(shape), dtype)
    ours, ref = jax.jit(_pool(window, strides, padding)), jax.jit(
        lambda x: _reference(x, window, strides, padding))

    def step(x, ct):
        y, vjp = jax.vjp(ours, x)
        return y, vjp(ct)[0]
    rng = np.random.default_rng(2)
    ct = jnp.asarray(rng.standard_normal(ref(x).shape), dtype)
    assert TARGET in jax.jit(step).lower(x, ct).as_text()
    y, dx = jax.jit(step)(x, ct)
    y_ref, vjp_ref = jax.vjp(ref, x)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(vjp_ref(ct)[0], np.float32),
                               rtol=tol, atol=tol)
    t = jnp.asarray(rng.standard_normal(shape), dtype)
    np.testing.assert_array_equal(np.asarray(jax.jvp(ours, (x,), (t,))[1], np.float32),
                                  np.asarray(jax.jvp(ref, (x,), (t,))[1], np.float32))


def test_the_handlers_gradient_equals_torch_max_pool2d(on_the_handler):
    check_against_torch_max_pool2d("NXC", seed=3)


def test_vmap_and_second_order_on_the_handler(on_the_handler):
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 9, 10, 3)), jnp.float32)
    pads = ((1, 1), (1, 1))

    def cube(pool):
        return lambda x: (pool(x) ** 3).sum()
    ours = cube(_pool((3, 3), (2, 2), pads))
    ref = cube(lambda x: _reference(x, (3, 3), (2, 2), pads))
    xs = jnp.stack([x, 2 * x, -x])
    assert TARGET in jax.jit(jax.vmap(jax.grad(ours))).lower(xs).as_text()
    tol = TOLERANCE["float32"]
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(ours)))(xs),
                               jax.vmap(jax.grad(ref))(xs), rtol=tol, atol=tol)
    np.testing.assert_allclose(jax.grad(lambda x: (jax.grad(ours)(x) ** 2).sum())(x),
                               jax.grad(lambda x: (jax.grad(ref)(x) ** 2).sum())(x),
                               rtol=tol, atol=tol)
    check_grads(_pool((3, 3), (2, 2), pads), (x,), order=2, modes=("fwd", "rev"), eps=1e-3,
                atol=1e-2, rtol=1e-2)


def test_an_export_and_other_layouts_keep_xlas_argmax(on_the_handler):
    """An exported program may run where the handler is not registered; an NCX or 1D pool is
    not the handler's: XLA's passes, the same gradient."""
    x = jnp.asarray(np.random.default_rng(5).standard_normal((2, 9, 10, 3)), jnp.float32)
    grad = jax.grad(lambda x: (_pool((3, 3), (2, 2), ((1, 1), (1, 1)))(x) ** 2).sum())
    assert TARGET in jax.jit(grad).lower(x).as_text()
    exported = jax.export.export(jax.jit(grad))(x)
    assert TARGET not in exported.mlir_module()
    np.testing.assert_allclose(exported.call(x), grad(x), rtol=1e-6, atol=1e-6)
    ncx = jax.grad(lambda x: jaxconv.max_pool(x, 3, 2, "SAME", data_format="NCX").sum())
    assert TARGET not in jax.jit(ncx).lower(x).as_text()
    one_d = jax.grad(lambda x: jaxconv.max_pool(x[:, 0], 3, 2).sum())
    assert TARGET not in jax.jit(one_d).lower(x).as_text()
    _, p = pool_problem("max_pool", x, (3, 3), (2, 2), "SAME", "NCX")
    assert "2D NXC" in max_pool.handler_applies(np.dtype(np.float32), p)
    _, p = pool_problem("max_pool", x, (3, 3), (2, 2), "SAME", "NXC")
    assert "float32 and bfloat16" in max_pool.handler_applies(np.dtype(np.float16), p)


def test_the_choice_is_timed_once_per_shape_and_machine(measuring):
    """With timing on, the handler's pass and XLA's, each with the gradient's scatter, are timed
    once for the program's pool (``chooser.max_pool_why_not``), and the program runs the
    winner."""
    if not library.status().available:
        pytest.skip("the handler's max pool runs on the CPU, with the onednn extra")
    jax.clear_caches()
    x = jnp.asarray(np.random.default_rng(6).standard_normal((8, 56, 56, 64)), jnp.float32)
    grad = jax.jit(jax.grad(lambda x: (_pool((3, 3), (2, 2), ((1, 1), (1, 1)))(x) ** 2).sum()))
    text = grad.lower(x).as_text()
    (decision,) = [d for d in measuring.decisions() if d.kernel == "pool"]
    assert decision.source == "measured" and set(decision.times_ms) == {"xla", "handler"}
    assert (TARGET in text) == (decision.verdict == "handler")
    grad.lower(x + 1)  # the same shape: no second timing
    assert len([d for d in measuring.decisions() if d.kernel == "pool"]) == 1
    jax.clear_caches()


def test_explain_names_where_the_argmax_runs(monkeypatch):
    """``explain`` of an accelerated gradient shows the pool's forward-and-argmax row with the
    pass that computes it: XLA's with the reason (here the suite's untimed rule), the handler's
    where it is the choice."""
    x = jnp.zeros((2, 16, 16, 8), jnp.float32)
    grad = jaxconv.accelerate(jax.grad(lambda x: _pool((3, 3), (2, 2), ((1, 1), (1, 1)))(x).sum()))
    (row,) = [r for r in jaxconv.explain(grad, x).rows if r.kernel == "max pool and argmax"]
    assert row.by == "jaxconv" and row.lowering.startswith("XLA's passes: ")
    if jax.default_backend() == "cpu" and library.status().available:
        for module in (chooser, lowering):
            monkeypatch.setattr(module, "max_pool_why_not", lambda x, p, *contenders: None)
        (row,) = [r for r in jaxconv.explain(grad, x).rows if r.kernel == "max pool and argmax"]
        assert row.lowering == "the handler's one pass"
