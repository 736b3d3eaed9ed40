"""The rewrites of :func:`jaxconv.accelerate`, in the order the interpreter asks them.

Each is one object in a module of its own (``base.Rewrite``: ``match`` then ``emit``); the
first that matches an equation computes it, every other equation is bound as written
(16-bit arithmetic in float32: ``widening.py``).
"""

from jaxconv._src.accelerate.rewrites.base import (
    REASONS,
    STRUCTURAL,
    Decision,
    Match,
    Rewrite,
    Scope,
)
from jaxconv._src.accelerate.rewrites.convolution import Convolution
from jaxconv._src.accelerate.rewrites.fused import FusedConvolution
from jaxconv._src.accelerate.rewrites.max_pool import MaxPool
from jaxconv._src.accelerate.rewrites.narrowing import NarrowingConvert
from jaxconv._src.accelerate.rewrites.products import Product, TransposedProduct
from jaxconv._src.accelerate.rewrites.recompute import Recompute
from jaxconv._src.accelerate.rewrites.sums import FactoredSum
from jaxconv._src.accelerate.rewrites.window_sum import SpreadPad, SpreadSum, WindowSum

#: The rewrites of each pass (``transform.PASSES``), in order; within a pass, where two read
#: the same primitive, the earlier one wins (a spread sum before a plain window sum).
#: Beside the widening of 16-bit arithmetic (``widening.py``), on the program as written: the
#: transpose of a pool whose windows do not overlap (its values move unrounded), float32 sums
#: of a product by a factor (the program's own, not the float32 sums widening writes), and the
#: sums that compute a chain of widened values again.
WIDEN: tuple[Rewrite, ...] = (SpreadPad(), SpreadSum(), FactoredSum(), Recompute())
#: The kernels, on a program whose 16-bit values are explicit.
KERNELS: tuple[Rewrite, ...] = (
    TransposedProduct(),
    Convolution(),
    FusedConvolution(),
    MaxPool(),
    WindowSum(),
    Product(),
    NarrowingConvert(),
)
#: every rewrite, in the order the passes ask them
REWRITES: tuple[Rewrite, ...] = (*WIDEN, *KERNELS)

#: each primitive's rewrites, in order (over all passes)
BY_PRIMITIVE: dict[str, tuple[Rewrite, ...]] = {
    name: tuple(r for r in REWRITES if name in r.primitives)
    for name in sorted({n for r in REWRITES for n in r.primitives})}

__all__ = ["BY_PRIMITIVE", "KERNELS", "REASONS", "REWRITES", "STRUCTURAL", "WIDEN", "Decision",
           "Match", "Rewrite", "Scope"]
