"""What the examples share: synthetic images, the command line, the line printed per epoch.

The images' class is where a bright square sits, under noise: learnable in a few epochs by any
CNN, generated in memory (nothing to download). Each example imports this module (``python
examples/NAME.py`` puts this folder on ``sys.path``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence

import numpy as np


def synthetic_images(n: int, image: int, channels: int = 3, classes: int = 10,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (N, H, W, C) float32 and their labels (N,) int32: class ``c`` lights the
    ``c``-th cell of a grid over the image, under standard-normal noise of half its height."""
    rng = np.random.default_rng(seed)
    grid = int(np.ceil(np.sqrt(classes)))
    cell = max(1, image // grid)
    masks = np.zeros((classes, image, image, 1), np.float32)
    for c in range(classes):
        r, q = divmod(c, grid)
        masks[c, r * cell:(r + 1) * cell, q * cell:(q + 1) * cell] = 2.0
    labels = rng.integers(0, classes, n).astype(np.int32)
    x = 0.5 * rng.standard_normal((n, image, image, channels)).astype(np.float32)
    return x + masks[labels], labels


def batches(x: np.ndarray, labels: np.ndarray, batch: int,
            rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch dropped: one compiled shape)."""
    order = rng.permutation(len(x))
    for i in range(0, len(x) - batch + 1, batch):
        idx = order[i:i + batch]
        yield x[idx], labels[idx]


def parse_args(doc: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """The examples' options: epochs, the training and held-out set sizes, batch, image side."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train", type=int, default=2048, help="training images")
    ap.add_argument("--test", type=int, default=512, help="held-out images")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=32)
    return ap.parse_args(argv)


def report(epoch: int, epochs: int, losses: Sequence[float], accuracy: float,
           seconds: float) -> dict[str, float]:
    """Prints the epoch's line (mean training loss, held-out accuracy, time) and returns both."""
    result = {"loss": float(np.mean(losses)), "accuracy": float(accuracy)}
    print(f"epoch {epoch}/{epochs}: loss {result['loss']:.4f}, held-out accuracy "
          f"{result['accuracy']:.3f}, {seconds:.1f} s ({len(losses)} steps)", flush=True)
    return result
