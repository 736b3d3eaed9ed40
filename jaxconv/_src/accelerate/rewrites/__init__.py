"""The rewrites of :func:`jaxconv.accelerate`, in the order the interpreter asks them.

Each is one object in a module of its own (``base.Rewrite``: ``match`` then ``emit``); the
first that matches an equation computes it, every other equation is bound as written
(16-bit arithmetic in float32: ``widening.py``).
"""

from jaxconv._src.accelerate.rewrites.base import REASONS, Decision, Match, Rewrite, Scope
from jaxconv._src.accelerate.rewrites.convolution import Convolution
from jaxconv._src.accelerate.rewrites.max_pool import MaxPool
from jaxconv._src.accelerate.rewrites.products import Product, TransposedProduct
from jaxconv._src.accelerate.rewrites.recompute import Recompute
from jaxconv._src.accelerate.rewrites.sums import FactoredSum
from jaxconv._src.accelerate.rewrites.window_sum import SpreadPad, SpreadSum, WindowSum

#: The rewrites, in order: where two read the same primitive, the earlier one wins (a spread
#: sum before a plain window sum; a factored sum before a recomputed one).
REWRITES: tuple[Rewrite, ...] = (
    SpreadPad(),
    SpreadSum(),
    FactoredSum(),
    Recompute(),
    TransposedProduct(),
    Convolution(),
    MaxPool(),
    WindowSum(),
    Product(),
)

#: each primitive's rewrites, in order
BY_PRIMITIVE: dict[str, tuple[Rewrite, ...]] = {
    name: tuple(r for r in REWRITES if name in r.primitives)
    for name in sorted({n for r in REWRITES for n in r.primitives})}

__all__ = ["BY_PRIMITIVE", "REASONS", "REWRITES", "Decision", "Match", "Rewrite", "Scope"]
