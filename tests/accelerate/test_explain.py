"""jaxconv.explain (``accelerate/explain.py``): each convolution and pool of a program, and what
accelerate's rewrites make of it (the transformation's own decisions)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src.accelerate import rewrites, transform
from tests.accelerate.test_models import LABELS, X, _cross_entropy


@pytest.fixture(autouse=True)
def _exact_float32():
    with jax.default_matmul_precision("float32"):
        yield


@pytest.mark.parametrize("measure", [False, True], ids=["rows", "measured"])
def test_explain_lists_each_convolution_and_the_fix_for_lax(measure):
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.max_pool(nn.relu(nn.Conv(8, (3, 3), strides=(2, 2))(x)), (2, 2), (2, 2))
            return nn.Dense(10)(x.mean(axis=(1, 2)))

    net = Net()
    params = net.init(jax.random.key(0), X)["params"]

    def step(params, x, labels):
        return jax.grad(lambda p: _cross_entropy(net.apply({"params": p}, x), labels))(params)

    plain = jaxconv.explain(jax.jit(step), params, X, LABELS)
    kinds = sorted((r.kernel, r.by) for r in plain.rows if r.op == "convolution")
    assert kinds == [("forward", "lax"), ("weight", "lax")], plain  # no data gradient of x
    assert any("lax convolutions have a jaxconv kernel" in n for n in plain.notes), plain.notes
    assert any(r.lowering == "XLA's select_and_scatter" for r in plain.rows)

    fast = jaxconv.explain(jax.jit(jaxconv.accelerate(step)), params, X, LABELS,
                           measure=measure, reps=2)
    convs = [r for r in fast.rows if r.op == "convolution"]
    assert sorted(r.kernel for r in convs) == ["forward", "weight"]
    assert all(r.by == "jaxconv" and r.lowering for r in convs), fast
    # the suite times nothing (JAXCONV_MEASURE=0): every choice is the rule's
    assert all(r.chosen == "rule" for r in convs), fast
    assert not any("lax convolutions have" in n or "select_and_scatter" in n
                   for n in fast.notes), fast.notes
    text = repr(fast)
    assert "weight" in text and "jaxconv" in text
    if measure:
        t = fast.timing
        cpu = {"faults"} if jax.default_backend() == "cpu" else set()
        assert set(t) == {"step", "convolutions", "pools", "rest"} | cpu and t["step"] > 0
        assert all(r.ms is not None and r.ms > 0 for r in fast.rows)
        assert all(r.layout.endswith(("(rule)", "(alone)")) for r in convs
                   if r.lowering == "onednn"), fast
        assert "step" in text


def _grad_of_conv_pool_dense(dtype):
    def loss(w, d, x):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = lax.reduce_window(jax.nn.relu(y), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                              "VALID")
        return jnp.sum((y.reshape(y.shape[0], -1) @ d).astype(jnp.float32) ** 2)
    rng = np.random.default_rng(0)
    args = (jnp.asarray(rng.standard_normal((3, 3, 4, 8)), dtype),
            jnp.asarray(rng.standard_normal((4 * 4 * 8, 5)), dtype),
            jnp.asarray(rng.standard_normal((2, 8, 8, 4)), dtype))
    return jax.grad(loss, (0, 1)), args


def test_explain_prints_the_decisions_the_transformation_made():
    """explain's rewrite lines are the decisions accelerate's own evaluation recorded, equation
    for equation: the same rewrite names and reasons, never a second opinion."""
    fn, args = _grad_of_conv_pool_dense(jnp.float32)
    shown = jaxconv.explain(fn, *args)
    closed = jax.make_jaxpr(fn)(*args)
    record: transform.Record = {}
    widened = transform.passes(closed, record=record)
    jax.make_jaxpr(lambda *a: transform.evaluate(widened.jaxpr, widened.consts, a,
                                                 record=record))(*args)
    assert [(d.matched, d.reasons) for d in shown.decisions] == [
        (d.matched, d.reasons) for d in record.values()]
    summary = {name: matched for name, matched, _ in shown.rewrites()}
    assert summary["convolution"] == 2 and summary["max pool"] == 2, shown  # no dx
    assert "rewrite convolution: 2 matched" in str(shown)
    # float32 products stay XLA's: the product rewrite declines them, and says why
    declined = dict((name, why) for name, _, why in shown.rewrites())["product"]
    assert declined == {rewrites.REASONS["product"]: 3}, shown
    lax_rows = [r for r in shown.rows if r.op == "convolution"]
    assert all(r.lowering.startswith("accelerate runs jaxconv's") for r in lax_rows), shown


def test_explain_gives_the_reason_a_convolution_stays_lax():
    x, w = jnp.ones((2, 8, 8, 3), jnp.int32), jnp.ones((3, 3, 3, 4), jnp.int32)

    def f(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    (row,) = jaxconv.explain(f, x, w).rows
    assert row.by == "lax" and row.lowering == rewrites.REASONS["dtype"]
