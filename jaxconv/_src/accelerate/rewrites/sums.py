"""Sums of a product by a factor that the sum does not run over, summed before the product.

Autodiff of a BatchNorm writes, beside the sum of the cotangent ``dy`` (the offset's gradient),
the sum of ``-(dy * k)`` over the same axes, where ``k`` is one value per channel (the scale
over the standard deviation, ``[1, 1, 1, C]``): the mean's gradient. XLA does not move a
per-channel factor out of a sum, and its reductions on the CPU read a materialized operand, so
it wrote ``dy * k`` in float32 to sum it and summed ``dy`` again. Since ``sum(x * k) = sum(x) *
k`` where ``k`` is constant along the summed axes, such a ``reduce_sum`` is computed as the sum
of the other factor times ``k`` (:func:`factored`), and XLA merges that sum with the sum of the
same operand the program already has.

ResNet-18's step with BatchNorm, 8 x 224 x 224, both variants compiled in one process and timed
interleaved (2-core Zen 4; CHANGELOG.md, "Earlier measurements"): bfloat16 264.8
-> 252.0 ms, float32 314.0 -> 292.7 ms (medians). The rule applies where ``accelerate``
evaluates the jaxpr that holds the sum (a nested ``jit`` is inlined where it holds a
convolution, a pool, a product or 16-bit arithmetic).

The product's own readers (the data gradient) still read it: it is then fused into them. The
result differs from the program's in rounding only: the program rounded each product before
summing, ``sum(x) * k`` rounds the sum and then its product (both float32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope


class Factored(NamedTuple):
    """A ``reduce_sum`` of ``negate * other * factor``, ``factor`` of size 1 on the summed
    axes."""

    other: Any
    factor: Any
    negate: bool


def factored(eqn: Any, defined: dict[Any, Any]) -> Factored | None:
    """``eqn``'s operand as a product by a factor that it does not sum over, where it is a
    float32 ``reduce_sum`` of one (through ``neg``s); else None. ``defined``: each variable's
    equation (``Analysis.producer``)."""
    if eqn.primitive.name != "reduce_sum":
        return None
    (operand,) = eqn.invars
    if isinstance(operand, Literal) or operand.aval.dtype != np.float32:
        return None
    axes = set(eqn.params["axes"])
    negate = False
    source = defined.get(operand)
    while source is not None and source.primitive.name == "neg":
        negate = not negate
        inner = source.invars[0]
        source = None if isinstance(inner, Literal) else defined.get(inner)
    if source is None or source.primitive.name != "mul":
        return None
    a, b = source.invars
    for other, factor in ((a, b), (b, a)):
        shape = factor.aval.shape
        if (isinstance(other, Literal) or other.aval.shape != operand.aval.shape
                or len(shape) != operand.aval.ndim or other.aval.dtype != np.float32
                or factor.aval.dtype != np.float32):
            continue
        if axes and all(shape[i] == 1 for i in axes):
            return Factored(other, factor, negate)
    return None


def run(eqn: Any, f: Factored, other: Any, factor: Any) -> Any:
    """``eqn`` (a ``reduce_sum``) as ``sum(other) * factor`` (:func:`factored`'s ``f``, with
    the operands' values)."""
    axes = set(eqn.params["axes"])
    total = eqn.primitive.bind(other, **eqn.params)
    kept = [d for i, d in enumerate(np.shape(factor)) if i not in axes]
    out = lax.mul(total, jnp.broadcast_to(jnp.reshape(factor, kept), np.shape(total)))
    return lax.neg(out) if f.negate else out


class FactoredSum(Rewrite):
    """A float32 sum of a product by a factor it does not sum over, as the factor times the
    sum of the other factor (module docstring)."""

    name = "factored sum"
    primitives = frozenset({"reduce_sum"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        f = factored(eqn, scope.analysis.producer)
        if f is None:
            return "not factored"
        return Match(self, eqn, (f.other, f.factor), f, "the factor times the sum")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        return [run(match.eqn, match.detail, *values)]  # float32 operands: never Wide values
