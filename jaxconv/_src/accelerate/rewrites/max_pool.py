"""The max-pool rewrite: ``reduce_window_max`` and its two derivatives as :func:`jaxconv.max_pool`'s.

``reduce_window_max`` is the pool's forward; ``select_and_gather_add`` (the JVP's tangent at
each window's maximum) its gather and ``select_and_scatter_add`` (its transpose) its scatter,
on the axes the window moves over (``geometry.pooling.window_problem``). On 16-bit operands
the widening pass has them on the float32 values (``widening.py``): a maximum and the values it
selects round back exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from jaxconv._src import pooling
from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope
from jaxconv._src.geometry.pooling import window_problem

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
        p = window_problem(eqn.params, x)
        if isinstance(p, str):
            return p
        return Match(self, eqn, tuple(eqn.invars), p, f"jaxconv's {_KINDS[name][1]}")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        return [_KINDS[match.eqn.primitive.name][0](*values, match.detail)]
