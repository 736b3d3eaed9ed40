"""The max-pool rewrite: ``reduce_window_max`` and its two derivatives as :func:`jaxconv.max_pool`'s.

``reduce_window_max`` is the pool's forward; ``select_and_gather_add`` (the JVP's tangent at
each window's maximum) its gather and ``select_and_scatter_add`` (its transpose) its scatter,
on the axes the window moves over. On 16-bit operands they run on the float32 values
(``widening.pool_dtype``): a maximum and the values it selects round back exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from jaxconv._src import pooling
from jaxconv._src.accelerate import widening
from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope
from jaxconv._src.geometry.pooling import PoolProblem, pool_of_shape

_OP = "accelerate"


def window_why(params: dict[str, Any], x: Any) -> str | None:
    """Why a ``reduce_window``-family equation over ``x`` is no window jaxconv computes: not
    floating, or dilated; else None."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return "dtype"
    ones = (1,) * x.ndim
    if (tuple(params.get("base_dilation", ones)) != ones
            or tuple(params.get("window_dilation", ones)) != ones):
        return "pool dilation"
    return None


def pool_of(params: dict[str, Any], x: Any) -> PoolProblem | str:
    """The max pool a ``reduce_window``-family equation over ``x`` computes, or why none."""
    why = window_why(params, x)
    if why is not None:
        return why
    if x.ndim < 3:
        return "not 1 to 3 spatial axes"
    window, strides = params["window_dimensions"], params["window_strides"]
    padding = [tuple(p) for p in params["padding"]]
    moved = {a for a in range(x.ndim)
             if window[a] != 1 or strides[a] != 1 or padding[a] != (0, 0)}
    if not moved & {0, x.ndim - 1}:
        layout, spatial = "NXC", range(1, x.ndim - 1)
    elif not moved & {0, 1}:
        layout, spatial = "NCX", range(2, x.ndim)
    else:
        return "pool axes"
    try:
        p = pool_of_shape(_OP, tuple(x.shape), tuple(window[a] for a in spatial),
                          tuple(strides[a] for a in spatial),
                          tuple(padding[a] for a in spatial), layout)
    except (TypeError, ValueError):
        return "pool padding"
    return p


#: each primitive's pooling function (``pooling.py``) and its label
_KINDS: dict[str, tuple[Callable[..., Any], str]] = {"reduce_window_max": (pooling.pool, "max pool"),
          "select_and_scatter_add": (pooling.scatter, "max pool gradient"),
          "select_and_gather_add": (pooling.gather, "max pool tangent")}


class MaxPool(Rewrite):
    """A max pool (``>=`` selection), its gradient or its tangent as jaxconv's."""

    name = "max pool"
    primitives = frozenset(_KINDS)

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        name = eqn.primitive.name
        if name != "reduce_window_max" and eqn.params["select_prim"] is not lax.ge_p:
            return "pool select"
        x = eqn.invars[-1].aval  # the pooled operand: the last (the forward's only) one
        p = pool_of(eqn.params, x)
        if isinstance(p, str):
            return p
        return Match(self, eqn, tuple(eqn.invars), p, f"jaxconv's {_KINDS[name][1]}")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        run = _KINDS[match.eqn.primitive.name][0]
        pooled = widening.pool_dtype(match.eqn, values)
        if pooled is not None:  # on the float32 values (its reasons do not depend on the width)
            return [widening.Wide(run(*map(widening.float32, values), match.detail), pooled)]
        return [run(*(widening.narrow(v) for v in values), match.detail)]
