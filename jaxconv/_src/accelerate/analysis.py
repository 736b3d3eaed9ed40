"""What the rewrites of :func:`jaxconv.accelerate` read of a jaxpr: computed once per jaxpr.

Each rewrite's ``match`` (``rewrites/``) looks at one equation and at this: who produces each
variable and how many equations read it, the filters autodiff reversed, the 2D products, the
interior pads that spread a cotangent, and which variables a convolution or a product reads.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from jax.extend.core import Jaxpr, Literal

from jaxconv._src.accelerate.widening import PRODUCTS


@dataclasses.dataclass(frozen=True)
class Analysis:
    """One jaxpr, as the rewrites read it."""

    #: each variable's equation
    producer: dict[Any, Any]
    #: each variable's readers (a result of the jaxpr counts as one)
    readers: collections.Counter[Any]
    #: the variables ``rev`` equations define: their operand and the reversed axes
    reversed_filters: dict[Any, tuple[Any, tuple[int, ...]]]
    #: the 2D ``dot_general`` equations (no batch dims, one free dim a side), by result
    products: dict[Any, Any]
    #: the ``pad`` equations that spread an array with zeros between its elements, by result
    spread_pads: dict[Any, Any]
    #: the variables a convolution or a matrix product reads
    product_operands: frozenset[Any]
    #: the jaxpr's results
    results: frozenset[Any]
    #: each variable's reading equations, in order
    reading: dict[Any, list[Any]]

    @classmethod
    def of(cls, jaxpr: Jaxpr) -> Analysis:
        """The analysis of ``jaxpr``'s own equations (a nested jaxpr has one of its own)."""
        eqns = jaxpr.eqns
        reading: dict[Any, list[Any]] = {}
        for e in eqns:
            for v in e.invars:
                if not isinstance(v, Literal):
                    reading.setdefault(v, []).append(e)
        results = frozenset(v for v in jaxpr.outvars if not isinstance(v, Literal))
        readers: collections.Counter[Any] = collections.Counter(
            v for e in eqns for v in e.invars if not isinstance(v, Literal))
        readers.update(v for v in jaxpr.outvars if not isinstance(v, Literal))
        return cls(
            producer={v: e for e in eqns for v in e.outvars},
            readers=readers,
            reversed_filters={e.outvars[0]: (e.invars[0], tuple(e.params["dimensions"]))
                              for e in eqns if e.primitive.name == "rev"},
            products={e.outvars[0]: e for e in eqns if _is_2d_product(e)},
            spread_pads={e.outvars[0]: e for e in eqns if _spreads(e)},
            product_operands=frozenset(v for e in eqns if e.primitive.name in PRODUCTS
                                       for v in e.invars if not isinstance(v, Literal)),
            results=results,
            reading=reading,
        )


def _is_2d_product(e: Any) -> bool:
    if e.primitive.name != "dot_general":
        return False
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    lhs, rhs = (v.aval for v in e.invars)
    return not lb and not rb and lhs.ndim - len(lc) == 1 and rhs.ndim - len(rc) == 1


def _spreads(e: Any) -> bool:
    return (e.primitive.name == "pad" and any(c[2] for c in e.params["padding_config"])
            and isinstance(e.invars[1], Literal) and e.invars[1].val == 0)
