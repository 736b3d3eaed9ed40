"""A served convolution's BatchNorm folded into its constant filter once, when the program is
traced (``jaxconv/_src/accelerate/rewrites/folded.py``): the values against lax's program at
HIGHEST, the fused call's chain, ``explain``'s label, and where nothing folds."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h
from tests.support.onednn_matrix import needs_onednn


class ConvNorm(nn.Module):
    """A convolution, flax's inference BatchNorm, ReLU6 (MobileNetV2's layer)."""

    features: int
    groups: int = 1
    dtype: Any = None

    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.features, (3, 3), feature_group_count=self.groups, use_bias=False,
                    dtype=self.dtype)(x)
        return nn.relu6(nn.BatchNorm(use_running_average=True, dtype=self.dtype)(y))


def _served(features=8, groups=1, dtype=None):
    rng = np.random.default_rng(features + groups)
    x = h.random(rng, (2, 7, 7, 8)).astype(dtype or jnp.float32)
    model = ConvNorm(features, groups, dtype)
    v = model.init(jax.random.key(0), x)
    stats = {"mean": h.random(rng, (features,)),
             "var": jnp.asarray(rng.uniform(0.5, 1.5, features), jnp.float32)}
    params = jax.tree.map(lambda a: a + jnp.asarray(rng.uniform(0.1, 0.5, a.shape), a.dtype),
                          v["params"])  # scale and offset off 1 and 0
    return model, {"params": params, "batch_stats": {"BatchNorm_0": stats}}, x


def _fused(fn, *args):
    return [e for e in h.equations(jaxconv.accelerate(fn), *args)
            if e.primitive.name == "jaxconv_fused"]


def _labels(fn, *args):
    return [d.label for d in jaxconv.explain(fn, *args).decisions if d.matched == "fused chain"]


def _highest(fn, *args):
    with jax.default_matmul_precision("highest"):
        return fn(*args)


@needs_onednn
@pytest.mark.parametrize("groups", [1, 8])  # a depthwise convolution too
def test_a_served_convolutions_batchnorm_folds_into_its_filter(groups):
    """flax's four BatchNorm post-ops (mean, normalizer, scale, offset) become one channel add,
    the filter scaled once; the values are the model's, and ``grad`` and ``vmap`` over the
    input compose."""
    model, v, x = _served(groups=groups)
    served = functools.partial(model.apply, v)
    (eqn,) = _fused(served, x)
    assert [(op.kind, op.alg) for op in eqn.params["post"]] == [("channel", "add"),
                                                              ("eltwise", "clip")]
    (label,) = _labels(served, x)
    assert "packed once with the first 4 post-ops folded in" in label, label
    serve = jaxconv.accelerate(served)
    h.assert_close(jax.jit(serve)(x), _highest(served, x), jnp.float32)

    def loss(f):
        return lambda x: jnp.sum(jnp.sin(f(x)))
    h.assert_close(jax.jit(jax.grad(loss(serve)))(x), _highest(jax.grad(loss(served)), x),
                   jnp.float32)
    xs = jnp.stack([x, -x])
    h.assert_close(jax.jit(jax.vmap(serve))(xs), _highest(jax.vmap(served), xs), jnp.float32)


@needs_onednn
def test_a_channels_first_filter_folds_along_its_output_axis():
    """NCHW data and an OIHW filter (the filter's output channels first): a shift, a
    normalizer and a scale folded, the bias after them too."""
    rng = np.random.default_rng(3)
    x = h.random(rng, (1, 6, 9, 9))
    w = h.random(rng, (10, 6, 3, 3))
    mean, scale, bias = (h.random(rng, (10,)) for _ in range(3))
    var = jnp.asarray(rng.uniform(0.5, 1.5, 10), jnp.float32)

    def f(x):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
        c = lambda a: a.reshape(1, 10, 1, 1)  # noqa: E731
        return jnp.tanh((y - c(mean)) * (lax.rsqrt(c(var) + 1e-3) * c(scale)) + c(bias))
    (eqn,) = _fused(f, x)
    assert [(op.kind, op.alg) for op in eqn.params["post"]] == [("channel", "add"),
                                                              ("eltwise", "tanh")]
    h.assert_close(jax.jit(jaxconv.accelerate(f))(x), _highest(f, x), jnp.float32)


def test_nothing_folds_off_float32_without_constants_or_without_a_product():
    """A bfloat16 model, variables as arguments, and a chain whose only constant is a shift:
    the chain as before."""
    with jax.numpy_dtype_promotion("standard"):  # flax's BatchNorm mixes the dtype and float32
        model, v, x = _served(dtype=jnp.bfloat16)
        labels = _labels(functools.partial(model.apply, v), x)
    assert labels and not any("folded" in s for s in labels), labels
    model, v, x = _served()
    labels = _labels(model.apply, v, x)
    assert labels and not any("folded" in s for s in labels), labels
    w = h.random(np.random.default_rng(4), (3, 3, 8, 8))
    mean = h.random(np.random.default_rng(5), (8,))

    def shifted(x, s):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y - mean.reshape(1, 1, 1, 8)) * s.reshape(1, 1, 1, 8)
    s = jnp.full((8,), 2.0)
    labels = _labels(shifted, x, s)
    assert labels and not any("folded" in t for t in labels), labels
    (eqn,) = _fused(shifted, x, s)
    assert [op.alg for op in eqn.params["post"]] == ["sub", "mul"]
    h.assert_close(jax.jit(jaxconv.accelerate(shifted))(x, s), _highest(shifted, x, s),
                   jnp.float32)
