"""Train a ResNet with BatchNorm (flax linen, optax) on the CPU, with jaxconv.

The usual script, as written without jaxconv, plus two lines: ``import jaxconv`` at the top
(before JAX computes anything: it keeps the memory XLA:CPU frees between steps) and the
training step wrapped in ``jaxconv.accelerate`` (every convolution, its gradients and the max
pool through jaxconv's kernels). The model, the arrays and ``model.init`` come first, as
usual. Synthetic data (``common.py``); one line per epoch.

    python examples/flax_linen_resnet.py                  # 3 epochs, 32 x 32 images
    python examples/flax_linen_resnet.py --epochs 1 --train 64 --image 16   # a smoke run
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxconv  # before the first computation: docs/training.md, "Host memory"
from common import batches, parse_args, report, synthetic_images


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm, and the shortcut (a 1x1 projection where the
    shape changes)."""

    features: int
    strides: int = 1

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
        y = nn.Conv(self.features, (3, 3), self.strides, padding=1, use_bias=False)(x)
        y = nn.relu(norm()(y))
        y = nn.Conv(self.features, (3, 3), padding=1, use_bias=False)(y)
        y = norm(scale_init=nn.initializers.zeros)(y)
        if x.shape != y.shape:
            x = nn.Conv(self.features, (1, 1), self.strides, use_bias=False)(x)
            x = norm()(x)
        return nn.relu(x + y)


class ResNet(nn.Module):
    """A small ResNet: a 3x3 stem, a max pool, one BasicBlock per stage."""

    stages: Sequence[int] = (16, 32, 64)
    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        x = nn.Conv(self.stages[0], (3, 3), padding=1, use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
        for i, features in enumerate(self.stages):
            x = BasicBlock(features, strides=1 if i == 0 else 2)(x, train)
        return nn.Dense(self.num_classes)(x.mean(axis=(1, 2)))


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    args = parse_args(__doc__, argv)

    x_train, y_train = synthetic_images(args.train, args.image, seed=0)
    x_test, y_test = synthetic_images(args.test, args.image, seed=1)
    model = ResNet()
    variables = model.init(jax.random.key(0), jnp.asarray(x_train[:1]), train=False)
    params, batch_stats = variables["params"], variables["batch_stats"]
    tx = optax.sgd(0.05, momentum=0.9)
    opt_state = tx.init(params)

    def train_step(params, batch_stats, opt_state, x, labels):
        def loss_fn(params):
            logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, x,
                                          train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, updates["batch_stats"]
        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), batch_stats, opt_state, loss

    # the one change to the step: jaxconv.accelerate inside jax.jit (the state donated)
    train_step = jax.jit(jaxconv.accelerate(train_step), donate_argnums=(0, 1, 2))

    @jax.jit
    def accuracy(params, batch_stats, x, labels):
        logits = model.apply({"params": params, "batch_stats": batch_stats}, x, train=False)
        return jnp.mean(jnp.argmax(logits, -1) == labels)

    rng = np.random.default_rng(0)
    result: dict[str, float] = {}
    for epoch in range(1, args.epochs + 1):
        start, losses = time.perf_counter(), []
        for x, labels in batches(x_train, y_train, args.batch, rng):
            params, batch_stats, opt_state, loss = train_step(params, batch_stats, opt_state,
                                                              x, labels)
            losses.append(loss)
        losses = jax.device_get(losses)  # waits for the last step (dispatch is asynchronous)
        seconds = time.perf_counter() - start
        held_out = accuracy(params, batch_stats, x_test, y_test)
        result = report(epoch, args.epochs, losses, held_out, seconds)
    return result


if __name__ == "__main__":
    main()
