"""Matrix products on oneDNN's matmul (``jaxconv/_src/matmul.py``) and the dense layers
``jaxconv.accelerate`` runs through them: bfloat16 ones where oneDNN computes bfloat16
natively, float32 ones where the handler's sgemm in parts timed faster than XLA's product (the
suite times nothing, so the float32 tests take that verdict: ``float32_on_onednn``).

Oracles: numpy's float64 product of the same (rounded) operands, per-dtype tolerances
(``jaxconv.testing``), and ``jax.test_util.check_grads`` to order 2 in float64 (which runs the
primitive's transposes and batching rules through XLA's product). Where oneDNN computes
bfloat16 natively (AVX-512 BF16, AMX) the bfloat16 programs hold the handler's custom call,
and the tests say so; elsewhere the same tests check XLA's product under the primitive.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src import matmul as mm
from jaxconv._src.lowering import chooser
from jaxconv._src.lowering import onednn as onednn_lowering
from jaxconv._src.native import library
from tests.support import helpers as h

TARGET = "jaxconv_onednn_matmul"
#: the four layouts of a product: the contracting axis of a and of b
CONTRACTING = [(1, 0), (1, 1), (0, 0), (0, 1)]


def _operands(contracting, m, k, n, dtype, seed=0):
    ca, cb = contracting
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k) if ca == 1 else (k, m))
    b = rng.standard_normal((k, n) if cb == 0 else (n, k))
    return jnp.asarray(a, dtype), jnp.asarray(b, dtype)


def _reference(a, b, contracting):
    ca, cb = contracting
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a64 if ca == 1 else a64.T) @ (b64 if cb == 0 else b64.T)


def _calls(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count(TARGET)


@pytest.fixture
def float32_on_onednn(monkeypatch):
    """Every float32 product's timed choice taken as the handler's (the suite times nothing:
    ``chooser._float32_product``); where the handler is not loaded, the test skips."""
    if jax.default_backend() != "cpu" or not library.status().available:
        pytest.skip("the handler's float32 products run on the CPU, with the onednn extra")
    monkeypatch.setattr(chooser, "_float32_product", lambda *args: None)


@pytest.mark.parametrize("contracting", CONTRACTING)
@pytest.mark.parametrize(("dtype", "out"), [(jnp.bfloat16, None), (jnp.bfloat16, jnp.float32),
                                            (jnp.float32, None)])
@pytest.mark.parametrize(("m", "k", "n"), [(128, 392, 64), (7, 1, 300), (1, 33, 5)])
def test_values_against_float64(contracting, dtype, out, m, k, n):
    """Each layout, dtype and result dtype against numpy's float64 product, jitted; bfloat16 on
    oneDNN where it computes bfloat16 natively, float32 always through XLA."""
    a, b = _operands(contracting, m, k, n, dtype)

    def fn(a, b):
        return mm.matmul(a, b, contracting, out)

    with jax.default_matmul_precision("float32"):  # GPUs round float32 products to TF32
        got = jax.jit(fn)(a, b)
    assert got.shape == (m, n)
    assert got.dtype == np.dtype(out or dtype)
    h.assert_close(np.asarray(got, np.float64), _reference(a, b, contracting), out or dtype)
    native = onednn_lowering.native_bfloat16() and dtype == jnp.bfloat16
    assert _calls(fn, a, b) == (1 if native else 0)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("contracting", CONTRACTING)
@pytest.mark.parametrize(("m", "k", "n"), [
    (1, 1280, 1000),   # a serving batch's classifier: parts of its 1000 columns
    (8, 3136, 250),    # the MNIST CNN's first dense layer at batch 8, an odd last part
    (600, 700, 40),    # float32: parts of its 600 rows (m > n); bfloat16: on the team
    (1, 33, 5),        # below a work unit: whole on the calling thread
])
@pytest.mark.parametrize(("dtype", "out"), [(jnp.float32, None), (jnp.bfloat16, jnp.float32),
                                            (jnp.bfloat16, None)])
def test_products_on_the_handler_in_parts(float32_on_onednn, dtype, out, threads, contracting,
                                          m, k, n):
    """A product on the handler in parts of the result's rows or columns on XLA's pool
    (float32: oneDNN's sgemm; bfloat16 of at most 16 rows or columns: a matmul primitive per
    part), planned for 2 and 3 threads, against numpy's float64 product of the same operands,
    in each layout of its operands."""
    if dtype == jnp.bfloat16 and not onednn_lowering.native_bfloat16():
        pytest.skip("oneDNN computes bfloat16 natively on AVX-512 BF16 or AMX only")
    a, b = _operands(contracting, m, k, n, dtype, seed=11)

    def fn(a, b):
        return mm.matmul(a, b, contracting, out)

    assert _calls(fn, a, b) == 1
    with library.planned_pool_threads(threads):
        got = jax.jit(fn)(a, b)
    assert got.shape == (m, n) and got.dtype == np.dtype(out or dtype)
    h.assert_close(np.asarray(got, np.float64), _reference(a, b, contracting), out or dtype)


@pytest.mark.parametrize("contracting", CONTRACTING)
def test_derivatives_to_order_2(contracting):
    """``check_grads`` to order 2, forward and reverse, in float64 (the transposes are products
    of the same primitive, in the layouts of their operands)."""
    with jax.enable_x64(True):
        a, b = _operands(contracting, 5, 6, 4, jnp.float64, seed=1)
        h.check_grads(lambda a, b: mm.matmul(a, b, contracting), (a, b), order=2)


@pytest.mark.parametrize("contracting", CONTRACTING)
def test_bfloat16_gradients_against_float64(contracting):
    """The vjp of a bfloat16 product (its two transposes, on oneDNN where native) against
    float64's ``ct op(B)^T`` and ``op(A)^T ct``, laid out as their operands; a float32
    cotangent of a float32 result gives bfloat16 gradients."""
    a, b = _operands(contracting, 24, 40, 16, jnp.bfloat16, seed=2)
    ct = jnp.asarray(np.random.default_rng(3).standard_normal((24, 16)), jnp.float32)
    _, vjp = jax.vjp(lambda a, b: mm.matmul(a, b, contracting, jnp.float32), a, b)
    da, db = jax.jit(vjp)(ct)
    assert (da.dtype, db.dtype) == (jnp.bfloat16, jnp.bfloat16)
    ca, cb = contracting
    a64, b64, c64 = (np.asarray(v, np.float64) for v in (a, b, ct))
    op_b = b64 if cb == 0 else b64.T
    op_a = a64 if ca == 1 else a64.T
    want_a, want_b = c64 @ op_b.T, op_a.T @ c64
    h.assert_close(np.asarray(da, np.float64), want_a if ca == 1 else want_a.T, jnp.bfloat16)
    h.assert_close(np.asarray(db, np.float64), want_b if cb == 0 else want_b.T, jnp.bfloat16)


@pytest.mark.parametrize("contracting", CONTRACTING)
@pytest.mark.parametrize("axes", [(0, None), (None, 0), (2, None), (None, 2), (0, 1)])
def test_vmap(contracting, axes):
    """vmap with either operand batched at any axis (folded into its free axis: one product)
    or both (XLA's batched product), against numpy per example."""
    a, b = _operands(contracting, 6, 10, 3, jnp.bfloat16, seed=4)
    rng = np.random.default_rng(5)
    batch = 4

    def stacked(x, axis):
        if axis is None:
            return x
        xs = jnp.asarray(rng.standard_normal((batch, *x.shape)), x.dtype)
        return jnp.moveaxis(xs, 0, axis)

    ab = stacked(a, axes[0]), stacked(b, axes[1])
    got = jax.jit(jax.vmap(lambda a, b: mm.matmul(a, b, contracting, jnp.float32), axes))(*ab)
    assert got.shape == (batch, 6, 3)
    for i in range(batch):
        ai = ab[0] if axes[0] is None else jnp.take(ab[0], i, axis=axes[0])
        bi = ab[1] if axes[1] is None else jnp.take(ab[1], i, axis=axes[1])
        h.assert_close(np.asarray(got[i], np.float64), _reference(ai, bi, contracting),
                       jnp.float32)


@pytest.mark.parametrize(("a_shape", "b_shape", "dtypes", "contracting", "error", "match"), [
    ((2, 3, 4), (4, 5), (jnp.float32,) * 2, (1, 0), TypeError, r"^matmul: a and b must be mat"),
    ((2, 3), (3, 4), (jnp.float32, jnp.bfloat16), (1, 0), TypeError, r"^matmul: a and b must sh"),
    ((2, 3), (3, 4), (jnp.int32,) * 2, (1, 0), TypeError, r"^matmul: a and b must share one f"),
    ((2, 3), (3, 4), (jnp.float32,) * 2, (1, 1), ValueError, r"^matmul: contracting .* \(1, 1\)"),
    ((2, 3), (3, 4), (jnp.float32,) * 2, (2, 0), ValueError, r"^matmul: contracting"),
])
def test_bad_input(a_shape, b_shape, dtypes, contracting, error, match):
    a, b = jnp.zeros(a_shape, dtypes[0]), jnp.zeros(b_shape, dtypes[1])
    with pytest.raises(error, match=match):
        mm.matmul(a, b, contracting)


def _mlp_loss(params, x, dtype=jnp.bfloat16):
    """Two dense layers with biases computing in ``dtype`` (flax's ``Dense(dtype=...)`` as
    written: the kernel cast, ``x @ W + b``), the loss in float32 (float64 for float64)."""
    hidden = x
    for w, bias in params:
        hidden = jax.nn.relu(hidden @ w.astype(dtype) + bias.astype(dtype)[None])
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return jnp.sum(hidden.astype(wide) ** 2)


def _mlp(seed=6):
    """The MLP's parameters and a batch of 32, of small integers that its bfloat16 forward
    computes exactly (x and the first kernel in {-1, 0, 1}: sums of at most 96; the second
    kernel two entries of +-1 a column: sums below 256, bfloat16's exact integers). So the
    float64 oracle and the bfloat16 program differ by each gradient product's own rounding,
    not by roundings that a ReLU's mask compounds, and the table's bound applies."""
    rng = np.random.default_rng(seed)
    w2 = np.zeros((64, 10))
    for col in range(10):
        w2[rng.choice(64, 2, replace=False), col] = rng.choice([-1.0, 1.0], 2)
    params = [(jnp.asarray(rng.integers(-1, 2, (96, 64)), jnp.float32),
               jnp.asarray(rng.integers(-2, 3, 64), jnp.float32)),
              (jnp.asarray(w2, jnp.float32), jnp.asarray(rng.integers(-2, 3, 10), jnp.float32))]
    return params, jnp.asarray(rng.integers(-1, 2, (32, 96)), jnp.bfloat16)


def _float64_grad(params, x):
    """The MLP's gradient in float64 (the oracle)."""
    with jax.enable_x64(True):
        return jax.grad(_mlp_loss)(jax.tree.map(lambda v: np.asarray(v, np.float64), params),
                                   np.asarray(x, np.float64), jnp.float64)


def _assert_bfloat16_close(got, want):
    """Each leaf within bfloat16's bound of the float64 oracle (a bfloat16 forward's activations
    are rounded where float64's are not), each of a scale where the bound can fail."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.max(np.abs(np.asarray(w))) >= 1
        h.assert_close(np.asarray(g, np.float64), np.asarray(w, np.float64), jnp.bfloat16)


def test_accelerate_runs_bfloat16_dense_layers_on_the_matmul():
    """``accelerate(grad(loss))`` of a bfloat16 MLP: the two forwards, the two kernel gradients
    and the one data gradient autodiff needs on oneDNN's matmul (where native), the gradients
    within bfloat16's bound of float64's (the program as written computes them through XLA's
    float32 products, rounded)."""
    params, x = _mlp()
    grad = jax.grad(_mlp_loss)
    _assert_bfloat16_close(jax.jit(jaxconv.accelerate(grad))(params, x), _float64_grad(params, x))
    calls = _calls(jaxconv.accelerate(grad), params, x)
    assert calls == (5 if onednn_lowering.native_bfloat16() else 0)
    assert _calls(grad, params, x) == 0


def test_float32_products_run_as_written_where_xla_is_the_choice():
    """Where XLA's product is the choice for a float32 product (the rule, which the suite's
    untimed choices keep), accelerate leaves it as written: no jaxconv_matmul, no custom
    call."""
    params, x = _mlp()

    def grad(params, x):
        return jax.grad(_mlp_loss)(params, x, jnp.float32)

    x32 = x.astype(jnp.float32)
    assert _calls(jaxconv.accelerate(grad), params, x32) == 0
    assert "jaxconv_matmul" not in str(jax.make_jaxpr(jaxconv.accelerate(grad))(params, x32))


def test_accelerate_runs_float32_dense_layers_on_the_handler_where_it_is_the_choice(
        float32_on_onednn):
    """Where the handler's float32 product is the choice, ``accelerate(grad(loss))`` of a
    float32 MLP runs its two forwards, two kernel gradients and one data gradient there, and
    ``vmap`` of the accelerated loss too: gradients and per-example losses within float32's
    bound of float64's."""
    params, x = _mlp(10)
    x32 = x.astype(jnp.float32)

    def loss(params, x):
        return _mlp_loss(params, x, jnp.float32)

    grad = jax.grad(loss)
    with jax.enable_x64(True):
        params64 = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
        want = jax.grad(_mlp_loss)(params64, np.asarray(x32, np.float64), jnp.float64)
    got = jax.jit(jaxconv.accelerate(grad))(params, x32)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        h.assert_close(np.asarray(g, np.float64), np.asarray(w, np.float64), jnp.float32)
    assert _calls(jaxconv.accelerate(grad), params, x32) == 5
    xs = jnp.stack([x32, _mlp(12)[1].astype(jnp.float32)])
    per_example = jax.jit(jax.vmap(jaxconv.accelerate(loss), (None, 0)))(params, xs)
    with jax.enable_x64(True):
        want = [_mlp_loss(params64, np.asarray(xs[i], np.float64), jnp.float64) for i in range(2)]
    h.assert_close(np.asarray(per_example, np.float64), np.asarray(want), jnp.float32)


def test_a_float32_products_choice_is_timed_and_explained(measuring):
    """With timed choices on, a float32 product's choice between XLA's product and the
    handler's is timed once (a "product" decision, kept for the next trace), and ``explain``
    notes it."""
    if not library.status().available:
        pytest.skip("the handler's float32 products need the onednn extra")
    rng = np.random.default_rng(13)
    v = jnp.asarray(rng.standard_normal((1, 512)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((512, 300)), jnp.float32)

    def dense(v, w):
        return v @ w

    explained = jaxconv.explain(jaxconv.accelerate(dense), v, w)
    (decision,) = [d for d in measuring.decisions() if d.kernel == "product"]
    assert decision.problem == "float32 [1, 512] x [512, 300], contracting [1, 0]"
    assert decision.verdict in ("xla", "onednn") and set(decision.times_ms) == {"xla", "onednn"}
    assert any(note.startswith(f"float32 product timed, {decision.verdict} kept")
               for note in explained.notes), explained.notes
    assert _calls(jaxconv.accelerate(dense), v, w) == (decision.verdict == "onednn")
    h.assert_close(np.asarray(jax.jit(jaxconv.accelerate(dense))(v, w), np.float64),
                   np.asarray(v, np.float64) @ np.asarray(w, np.float64), jnp.float32)
    assert len([d for d in measuring.decisions() if d.kernel == "product"]) == 1


def test_grad_of_accelerate_and_vmap_of_it():
    """``grad(accelerate(loss))`` differentiates jaxconv's matmul (its transposes bind it
    again) and ``vmap`` batches it: gradients and per-example losses within bfloat16's bound
    of float64's."""
    params, x = _mlp(7)
    outer = jax.jit(jax.grad(jaxconv.accelerate(_mlp_loss)))(params, x)
    _assert_bfloat16_close(outer, _float64_grad(params, x))
    xs = jnp.stack([x, _mlp(9)[1]])  # two independent examples
    per_example = jax.jit(jax.vmap(jaxconv.accelerate(_mlp_loss), (None, 0)))(params, xs)
    with jax.enable_x64(True):
        params64 = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
        want = [_mlp_loss(params64, np.asarray(xs[i], np.float64), jnp.float64) for i in range(2)]
    _assert_bfloat16_close(list(per_example), want)
    text = str(jax.make_jaxpr(jax.grad(jaxconv.accelerate(_mlp_loss)))(params, x))
    assert ("jaxconv_matmul" in text) == onednn_lowering.native_bfloat16()


def test_a_bias_gradient_sums_the_rounded_value_a_product_reads():
    """Where a product reads a 16-bit value (a dense layer's data and kernel gradients read its
    output's cotangent), its bias gradient sums that rounded value in float32, and XLA writes
    the cotangent once, in bfloat16: the sum reads a ``convert`` of the bfloat16 value, not a
    float32 value the chain kept."""
    params, x = _mlp(8)
    jaxpr = jax.make_jaxpr(jaxconv.accelerate(jax.grad(_mlp_loss)))(params, x).jaxpr
    made = {v: e for e in jaxpr.eqns for v in e.outvars}
    sums = [e for e in jaxpr.eqns if e.primitive.name == "reduce_sum"
            and e.invars[0].aval.shape == (32, 64)]
    assert sums, "no bias gradient of the hidden layer"
    for s in sums:
        widen = made[s.invars[0]]
        assert widen.primitive.name == "convert_element_type"
        assert widen.invars[0].aval.dtype == jnp.bfloat16
    assert re.search(r"f32\[64\] = reduce_sum", str(jaxpr))
