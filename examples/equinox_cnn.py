"""Train a CNN written in equinox (optax) on the CPU, with jaxconv.

The usual equinox script plus two lines: ``import jaxconv`` at the top (before JAX computes
anything: it keeps the memory XLA:CPU frees between steps) and ``jaxconv.accelerate`` inside
``eqx.filter_jit``. Equinox layers take one example, channels first: the loss maps the model
over the batch with ``jax.vmap``. Synthetic data (``common.py``); one line per epoch.

    python examples/equinox_cnn.py
    python examples/equinox_cnn.py --epochs 1 --train 64 --image 16   # a smoke run
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxconv  # before the first computation: docs/training.md, "Host memory"
from common import batches, parse_args, report, synthetic_images


class CNN(eqx.Module):
    """Two convolutions, a max pool, a linear classifier (one example, channels first)."""

    conv1: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    conv2: eqx.nn.Conv2d
    head: eqx.nn.Linear

    def __init__(self, channels: int, classes: int, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(channels, 32, 3, padding=1, key=k1)
        self.pool = eqx.nn.MaxPool2d(2, stride=2)
        self.conv2 = eqx.nn.Conv2d(32, 64, 3, stride=2, padding=1, key=k2)
        self.head = eqx.nn.Linear(64, classes, key=k3)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.pool(jax.nn.relu(self.conv1(x)))
        x = jax.nn.relu(self.conv2(x))
        return self.head(x.mean(axis=(1, 2)))


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    args = parse_args(__doc__, argv)

    x_train, y_train = synthetic_images(args.train, args.image, seed=0)
    x_test, y_test = synthetic_images(args.test, args.image, seed=1)
    to_nchw = lambda x: np.ascontiguousarray(x.transpose(0, 3, 1, 2))  # noqa: E731
    x_train, x_test = to_nchw(x_train), to_nchw(x_test)
    model = CNN(3, 10, jax.random.key(0))
    optim = optax.adam(3e-3)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    def train_step(model: CNN, opt_state, x, labels):
        def loss_fn(model: CNN):
            logits = jax.vmap(model)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    # the one change to the step: jaxconv.accelerate inside eqx.filter_jit
    train_step = eqx.filter_jit(jaxconv.accelerate(train_step))

    @eqx.filter_jit
    def accuracy(model: CNN, x, labels):
        return jnp.mean(jnp.argmax(jax.vmap(model)(x), -1) == labels)

    rng = np.random.default_rng(0)
    result: dict[str, float] = {}
    for epoch in range(1, args.epochs + 1):
        start, losses = time.perf_counter(), []
        for x, labels in batches(x_train, y_train, args.batch, rng):
            model, opt_state, loss = train_step(model, opt_state, x, labels)
            losses.append(loss)
        losses = jax.device_get(losses)  # waits for the last step (dispatch is asynchronous)
        seconds = time.perf_counter() - start
        result = report(epoch, args.epochs, losses, accuracy(model, x_test, y_test), seconds)
    return result


if __name__ == "__main__":
    main()
