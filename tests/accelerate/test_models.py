"""jaxconv.accelerate on models written as flax (linen, nnx) and equinox document them.

No hook and no jaxconv import in the models: each training step is accelerated whole and
checked against the same step unaccelerated (the loss and every gradient or updated
parameter), and its program must hold jaxconv's kernels and none of lax's convolutions or
XLA's max-pool gradient (with the oneDNN extra: oneDNN's custom call in the compiled program).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src.native import library
from tests.support import helpers as h

# batch 4, 16 x 16 RGB images, 10 classes
RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((4, 16, 16, 3)), jnp.float32)
LABELS = jnp.asarray(RNG.integers(0, 10, 4), jnp.int32)


@pytest.fixture(autouse=True)
def _exact_float32():
    """float32 products at full precision (GPUs default to TF32 for convolutions)."""
    with jax.default_matmul_precision("float32"):
        yield


def _cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def _close_trees(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        h.assert_close(a, b, jnp.float32)


def _assert_jaxconvs(fn, *args):
    names = [e.primitive.name for e in h.equations(fn, *args)]
    assert "jaxconv_conv" in names and "jaxconv_max_pool_scatter" in names, sorted(set(names))
    assert not {"conv_general_dilated", "select_and_scatter_add"} & set(names)
    if library.status().available:
        assert "jaxconv_onednn" in jax.jit(fn).lower(*args).compile().as_text()


def test_flax_linen_cnn_with_batchnorm():
    import flax.linen as nn

    class CNN(nn.Module):  # as flax's examples write one
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(16, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train)(x)
            x = nn.max_pool(nn.relu(x), (3, 3), strides=(2, 2), padding="SAME")
            x = nn.relu(nn.Conv(32, (3, 3), strides=(2, 2))(x))
            x = nn.Conv(32, (1, 1), feature_group_count=4)(x)
            return nn.Dense(10)(x.mean(axis=(1, 2)))

    model = CNN()
    variables = model.init(jax.random.key(0), X, train=False)

    def train_step(params, stats, x, labels):
        def loss_fn(params):
            logits, new = model.apply({"params": params, "batch_stats": stats}, x, train=True,
                                      mutable=["batch_stats"])
            return _cross_entropy(logits, labels), new["batch_stats"]
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return loss, grads, stats

    args = (variables["params"], variables["batch_stats"], X, LABELS)
    _close_trees(jax.jit(jaxconv.accelerate(train_step))(*args), jax.jit(train_step)(*args))
    _assert_jaxconvs(jaxconv.accelerate(train_step), *args)


def test_flax_nnx_train_step_updates_the_model_in_place():
    import optax
    from flax import nnx

    class CNN(nnx.Module):  # as flax's nnx MNIST tutorial writes one
        def __init__(self, rngs: nnx.Rngs):
            self.conv1 = nnx.Conv(3, 16, (3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(16, 32, (3, 3), strides=2, rngs=rngs)
            self.linear = nnx.Linear(32, 10, rngs=rngs)

        def __call__(self, x):
            x = nnx.max_pool(nnx.relu(self.conv1(x)), (2, 2), strides=(2, 2))
            x = nnx.relu(self.conv2(x))
            return self.linear(x.mean(axis=(1, 2)))

    def train_step(model, optimizer, x, labels):
        def loss_fn(model):
            return _cross_entropy(model(x), labels)
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def make():
        model = CNN(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)

    (fast, fast_opt), (ref, ref_opt) = make(), make()
    for _ in range(2):  # the second step reads the first's momentum
        loss = nnx.jit(jaxconv.accelerate(train_step))(fast, fast_opt, X, LABELS)
        want = nnx.jit(train_step)(ref, ref_opt, X, LABELS)
        _close_trees(loss, want)
    _close_trees(nnx.state(fast, nnx.Param), nnx.state(ref, nnx.Param))
    assert float(jnp.max(jnp.abs(fast.conv1.kernel[...] - make()[0].conv1.kernel[...]))) > 0

    graphdef, state = nnx.split(fast)

    def loss_of_state(state):
        return _cross_entropy(nnx.merge(graphdef, state)(X), LABELS)
    _assert_jaxconvs(jaxconv.accelerate(jax.grad(loss_of_state)), state)


def test_equinox_cnn():
    import equinox as eqx

    class CNN(eqx.Module):  # as equinox's examples write one (channels first, one example)
        conv1: eqx.nn.Conv2d
        pool: eqx.nn.MaxPool2d
        conv2: eqx.nn.Conv2d
        linear: eqx.nn.Linear

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.conv1 = eqx.nn.Conv2d(3, 8, 3, key=k1)
            self.pool = eqx.nn.MaxPool2d(2, stride=2)
            self.conv2 = eqx.nn.Conv2d(8, 16, 3, stride=2, groups=2, key=k2)
            self.linear = eqx.nn.Linear(16, 10, key=k3)

        def __call__(self, x):
            x = self.pool(jax.nn.relu(self.conv1(x)))
            x = jax.nn.relu(self.conv2(x))
            return self.linear(jnp.mean(x, axis=(1, 2)))

    model = CNN(jax.random.key(1))
    x = jnp.transpose(X, (0, 3, 1, 2))

    @eqx.filter_value_and_grad
    def loss(model, x, labels):
        return _cross_entropy(jax.vmap(model)(x), labels)

    got = eqx.filter_jit(jaxconv.accelerate(loss))(model, x, LABELS)
    want = eqx.filter_jit(loss)(model, x, LABELS)
    _close_trees(eqx.filter(got, eqx.is_array), eqx.filter(want, eqx.is_array))
    params, static = eqx.partition(model, eqx.is_array)
    _assert_jaxconvs(lambda p, x, labels: jaxconv.accelerate(loss)(eqx.combine(p, static), x,
                                                                  labels), params, x, LABELS)
