"""Train a CNN written in flax.nnx (optax through nnx.Optimizer) on the CPU, with jaxconv.

The usual nnx script plus two lines: ``import jaxconv`` at the top (before JAX computes
anything: it keeps the memory XLA:CPU frees between steps) and ``jaxconv.accelerate`` inside
``nnx.jit`` (the model and optimizer are updated in place, as under ``nnx.jit`` alone).
Synthetic data (``common.py``); one line per epoch.

    python examples/flax_nnx_cnn.py
    python examples/flax_nnx_cnn.py --epochs 1 --train 64 --image 16   # a smoke run
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxconv  # before the first computation: docs/training.md, "Host memory"
from common import batches, parse_args, report, synthetic_images


class CNN(nnx.Module):
    """Two convolutions with BatchNorm, max pools, a dense classifier."""

    def __init__(self, channels: int, classes: int, *, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(channels, 32, (3, 3), rngs=rngs)
        self.bn1 = nnx.BatchNorm(32, rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, (3, 3), strides=2, rngs=rngs)
        self.bn2 = nnx.BatchNorm(64, rngs=rngs)
        self.head = nnx.Linear(64, classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.max_pool(nnx.relu(self.bn1(self.conv1(x))), (2, 2), (2, 2))
        x = nnx.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(axis=(1, 2)))


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    args = parse_args(__doc__, argv)

    x_train, y_train = synthetic_images(args.train, args.image, seed=0)
    x_test, y_test = synthetic_images(args.test, args.image, seed=1)
    model = CNN(3, 10, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    def train_step(model: CNN, optimizer: nnx.Optimizer, x, labels):
        def loss_fn(model: CNN):
            logits = model(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    # the one change to the step: jaxconv.accelerate inside nnx.jit
    train_step = nnx.jit(jaxconv.accelerate(train_step))

    @nnx.jit
    def accuracy(model: CNN, x, labels):
        return jnp.mean(jnp.argmax(model(x), -1) == labels)

    rng = np.random.default_rng(0)
    result: dict[str, float] = {}
    for epoch in range(1, args.epochs + 1):
        model.train()
        start, losses = time.perf_counter(), []
        for x, labels in batches(x_train, y_train, args.batch, rng):
            losses.append(train_step(model, optimizer, x, labels))
        losses = jax.device_get(losses)  # waits for the last step (dispatch is asynchronous)
        seconds = time.perf_counter() - start
        model.eval()
        result = report(epoch, args.epochs, losses, accuracy(model, x_test, y_test), seconds)
    return result


if __name__ == "__main__":
    main()
