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

#: the equations that read a 16-bit value as it is (a sum of it then sums that value too:
#: ``widening.py``)
PRODUCTS = frozenset({"conv_general_dilated", "dot_general"})


@dataclasses.dataclass(frozen=True)
class Analysis:
    """One jaxpr, as the rewrites read it."""

    #: each variable's equation
    producer: dict[Any, Any]
    #: the variables ``rev`` equations define: their operand and the reversed axes
    reversed_filters: dict[Any, tuple[Any, tuple[int, ...]]]
    #: the 2D ``dot_general`` equations (no batch dims, one free dim a side), by result
    products: dict[Any, Any]
    #: the ``pad`` equations that spread an array with zeros between its elements, by result
    spread_pads: dict[Any, Any]
    #: the variables a convolution or a matrix product reads
    product_operands: frozenset[Any]
    #: the jaxpr's results, each with how many times the jaxpr returns it
    results: collections.Counter[Any]
    #: each variable's reading equations, in order (once per operand it is)
    reading: dict[Any, list[Any]]

    def readers(self, v: Any) -> int:
        """How many operands of equations and results of the jaxpr ``v`` is."""
        return len(self.reading.get(v, ())) + self.results[v]

    def spread_pad(self, eqn: Any) -> Any | None:
        """The interior ``pad`` (of :attr:`spread_pads`) whose result ``eqn`` sums with a
        window per element it spreads (the transpose of a pool whose windows do not overlap:
        ``rewrites/window_sum.py``), or None."""
        if eqn.primitive.name != "reduce_window_sum" or isinstance(eqn.invars[0], Literal):
            return None
        pad = self.spread_pads.get(eqn.invars[0])
        if pad is None:
            return None
        p, ones = eqn.params, (1,) * eqn.invars[0].aval.ndim
        if (tuple(p["window_strides"]) != ones or tuple(p["base_dilation"]) != ones
                or tuple(p["window_dilation"]) != ones
                or any(tuple(q) != (0, 0) for q in p["padding"])):
            return None
        config = pad.params["padding_config"]
        if any(w != c[2] + 1 for w, c in zip(p["window_dimensions"], config)):
            return None
        return pad

    def only_spread(self, pad: Any) -> bool:
        """Whether every reader of the ``pad`` equation's result is a window sum that
        :meth:`spread_pad` finds over it (the result is then never needed)."""
        (v,) = pad.outvars
        readers = self.reading.get(v, [])
        return (v in self.spread_pads and v not in self.results and bool(readers)
                and all(self.spread_pad(e) is pad for e in readers))

    @classmethod
    def of(cls, jaxpr: Jaxpr) -> Analysis:
        """The analysis of ``jaxpr``'s own equations (a nested jaxpr has one of its own)."""
        eqns = jaxpr.eqns
        reading: dict[Any, list[Any]] = {}
        for e in eqns:
            for v in e.invars:
                if not isinstance(v, Literal):
                    reading.setdefault(v, []).append(e)
        return cls(
            producer={v: e for e in eqns for v in e.outvars},
            reversed_filters={e.outvars[0]: (e.invars[0], tuple(e.params["dimensions"]))
                              for e in eqns if e.primitive.name == "rev"},
            products={e.outvars[0]: e for e in eqns if _is_2d_product(e)},
            spread_pads={e.outvars[0]: e for e in eqns if _spreads(e)},
            product_operands=frozenset(v for e in eqns if e.primitive.name in PRODUCTS
                                       for v in e.invars if not isinstance(v, Literal)),
            results=collections.Counter(v for v in jaxpr.outvars if not isinstance(v, Literal)),
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
