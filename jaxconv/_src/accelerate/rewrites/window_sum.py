"""The window-sum rewrites: ``reduce_window_sum`` (an average pool) as the sum of its taps, and
its transpose over a pool whose windows do not overlap as the cotangent repeated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import lax_refs, pooling
from jaxconv._src.accelerate import widening
from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope
from jaxconv._src.geometry.pooling import window_why
from jaxconv._src.kernel import Array

#: the most taps a window sum is unrolled into (its slices and adds are one fused loop)
WINDOW_SUM_MAX_TAPS = 64


def _sum_why(params: dict[str, Any], x: Any) -> str | None:
    why = window_why(params, x)
    if why is not None:
        return why
    return "window size" if math.prod(params["window_dimensions"]) > WINDOW_SUM_MAX_TAPS else None


def tap_sum(params: dict[str, Any], x: Array) -> Array:
    """``reduce_window_sum`` of ``x`` without dilations as the sum of its taps, each a strided
    slice of the padded operand, in float32 for 16-bit floats (one rounding at the end)."""
    window, strides = tuple(params["window_dimensions"]), tuple(params["window_strides"])
    wide = pooling.wide(x)
    xp = lax_refs.pad(wide, jnp.zeros((), wide.dtype),
                      [(lo, hi, 0) for lo, hi in params["padding"]])
    out = [(n - k) // s + 1 for n, k, s in zip(xp.shape, window, strides)]
    acc = None
    for tap in np.ndindex(*window):
        piece = lax.slice(xp, tap, [t + (o - 1) * s + 1 for t, o, s in zip(tap, out, strides)],
                          strides)
        acc = piece if acc is None else acc + piece
    assert acc is not None
    return acc.astype(x.dtype)


class WindowSum(Rewrite):
    """``reduce_window_sum`` without dilations (an average pool's sum, and its transpose where
    :class:`SpreadSum` does not take it) as :func:`tap_sum`: one loop that XLA fuses. Measured
    on XLA:CPU only, whose own reduce_window is several times slower in float32 and bfloat16
    (CHANGELOG.md, "Earlier measurements"); other backends run the same program, not timed."""

    name = "window sum"
    primitives = frozenset({"reduce_window_sum"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        why = _sum_why(eqn.params, eqn.invars[0].aval)
        return why if why is not None else Match(self, eqn, tuple(eqn.invars),
                                                 label="a sum of its taps")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        return [tap_sum(match.eqn.params, values[0])]


# The transpose of a window sum is a window sum over the cotangent spread by an interior pad:
#     l = reduce_window_sum(pad(ct, 0, (lo, hi, s - 1) per axis), window w, strides 1)
# Where each axis's window w equals its spread s (a pool whose windows do not overlap:
# flax's ``nn.avg_pool`` with strides equal to the window), each window of the padded
# cotangent holds exactly one of its elements: output p reads ct[ceil((p - lo) / s)] where
# 0 <= that index < n, else 0. That is ct repeated s times along the axis (up[r] = ct[r // s])
# shifted by d = s - 1 - lo: l[p] = up[p + d], one pad (or crop) of the repeated array, the
# same values bit for bit (a sum of one element and zeros). XLA fuses the repeat into the
# reader, where it wrote the padded array and summed w taps of it (the MNIST CNN's step:
# CHANGELOG.md, "Earlier measurements"; measured on XLA:CPU).


def spread_sum(pad: Any, ct: Array, out_shape: Sequence[int]) -> Array:
    """The window sum ``Analysis.spread_pad`` found over ``pad``'s result, from ``ct`` (the
    array ``pad`` spreads): ``ct`` repeated along each axis, shifted into place."""
    crops = []
    for axis, (lo, _, interior) in enumerate(pad.params["padding_config"]):
        s, n = interior + 1, ct.shape[axis]
        if s > 1:
            shape = (*ct.shape[:axis + 1], s, *ct.shape[axis + 1:])
            kept = tuple(a for a in range(ct.ndim + 1) if a != axis + 1)
            ct = lax.reshape(lax.broadcast_in_dim(ct, shape, kept),
                             (*ct.shape[:axis], n * s, *ct.shape[axis + 1:]))
        d = s - 1 - lo
        crops.append((-d, out_shape[axis] - n * s + d, 0))
    zero = jnp.asarray(pad.invars[1].val, ct.dtype)  # the pad's own zero (a -0.0 stays one)
    return lax_refs.pad(ct, zero, crops)  # the crops: a slice


class SpreadSum(Rewrite):
    """The transpose of a pool whose windows do not overlap (a window sum over the cotangent
    spread by an interior pad: ``Analysis.spread_pad``) as the cotangent repeated
    (:func:`spread_sum`)."""

    name = "spread sum"
    primitives = frozenset({"reduce_window_sum"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        pad = scope.analysis.spread_pad(eqn)
        if pad is None:
            return "no spread"
        return Match(self, eqn, (pad.invars[0],), pad, "the cotangent repeated")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        """The values move without arithmetic: a :class:`widening.Wide` cotangent's float32
        value moves, and rounds as the cotangent does (the widening pass asks this rewrite)."""
        (ct,), pad, out_shape = values, match.detail, match.eqn.outvars[0].aval.shape
        if isinstance(ct, widening.Wide):
            return [widening.Wide(spread_sum(pad, ct.wide, out_shape), ct.dtype)]
        return [spread_sum(pad, ct, out_shape)]


class SpreadPad(Rewrite):
    """An interior pad whose every reader is a window sum :class:`SpreadSum` takes: not
    computed at all (its result is never read)."""

    name = "spread pad"
    primitives = frozenset({"pad"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        if eqn.outvars[0] not in scope.analysis.spread_pads:
            return "no spread"
        if not scope.analysis.only_spread(eqn):
            return "read elsewhere"
        return Match(self, eqn, (), label="not computed: the window sums repeat its operand")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        return []
