"""jaxconv.accelerate as a function transformation (``accelerate/transform.py``): its composition
with JAX's transformations, static arguments, export and its errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h
from tests.ops.test_lax_conv import HIGHEST


def _prims(fn, *args) -> list[str]:
    return [e.primitive.name for e in h.equations(fn, *args)]


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
