"""Sums that recompute the element-wise chain they read, from its sources, where other
equations read the chain too.

XLA:CPU computes a ``reduce_sum`` (and a ``reduce_max`` or ``reduce_min``) with a library
fusion (YNNPACK) that takes in the element-wise operations feeding it, but only where no other
instruction reads them: an element-wise value that two sums read, or a sum and anything else,
is written to memory in full and read back by each. A BatchNorm's statistics are such sums:
flax converts the bfloat16 input to float32, sums it, and reads it again to centre it. XLA
wrote the float32 input (twice the input's bytes) and summed it from memory: the sum of a
bfloat16 8 x 112 x 112 x 64 array and of its square, both of the one float32 conversion, took
3.33 ms that way against 0.50 ms with each sum reading the bfloat16 array itself (2-core Zen 4,
CHANGELOG.md, "Earlier measurements").

The rule (:func:`chain`): a sum whose operand is an element-wise chain of the operand's size
(:data:`CHEAP` primitives on floating values; its sources are the values of another kind of
producer), where some value of the chain has another reader and every full-size source is
narrower than the operand (a 16-bit input converted to float32), computes the chain again from
its sources. Each such sum reads its sources through an ``optimization_barrier`` of its own
(:class:`Copies`): the same operations on the same values would be merged back into one by
XLA's common-subexpression pass. Other chains run as written: one through a broadcast (the
two-pass variance's centred input), which the library fusion does not take in, so that XLA
wrote the broadcast in full instead; one through a mask (a ReLU's gradient), likewise; and one
of float32 sources, which reads as many bytes either way and whose copy XLA may share with
another sum (:mod:`sums`). The values are the program's: the same operations on the same
values.

The rule applies wherever ``accelerate`` runs; it was measured on XLA:CPU only, whose library
fusions of sums it works around (its effect on a GPU's or TPU's program is not measured).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from jaxconv._src.accelerate import widening
from jaxconv._src.accelerate.analysis import Analysis
from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope

#: the sums that recompute their operand's chain
SUMS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})

#: element-wise primitives that XLA:CPU's library fusions of sums take in (on floating
#: operands only: a comparison's mask or a ``select_n`` on one is written in full either way)
CHEAP = frozenset({
    "convert_element_type", "add", "add_any", "sub", "mul", "neg", "square", "integer_pow",
    "max", "min", "abs", "reshape",
})

#: the most equations a chain computes again
MAX_CHAIN = 8


class Chain(NamedTuple):
    """The equations that compute a sum's operand (in order) and the values they read."""

    eqns: list[Any]
    sources: list[Any]


def chain(eqn: Any, prog: Analysis, computed: Callable[[Any], Any],
          is_source: Callable[[Any], bool]) -> Chain | None:
    """The chain ``eqn`` (a sum) recomputes, or None where it reads its operand as it is;
    ``prog``: its jaxpr's producers and reader counts.

    ``computed(v)`` is ``v``'s value, or None where the evaluation holds none; ``is_source(v)``
    says a value stops the chain whatever its producer (a value the evaluation holds in a form
    it cannot compute again)."""
    if eqn.primitive.name not in SUMS or isinstance(eqn.invars[0], Literal):
        return None
    operand = eqn.invars[0]
    size = int(np.prod(operand.aval.shape))
    eqns: list[Any] = []
    sources: list[Any] = []
    seen: set[Any] = set()
    shared = False

    def visit(v: Any) -> bool:
        nonlocal shared
        if isinstance(v, Literal) or v in seen:
            return True
        seen.add(v)
        p = prog.producer.get(v)
        if (p is None or p.primitive.name not in CHEAP or len(p.outvars) != 1
                or int(np.prod(v.aval.shape)) != size or is_source(v)
                or len(eqns) >= MAX_CHAIN):
            if computed(v) is None:
                return False
            sources.append(v)
            return True
        if any(not isinstance(u, Literal) and int(np.prod(u.aval.shape)) != size
               for u in p.invars):
            return False  # a broadcast: XLA writes it in full for the library fusion to read
        if not all(_floating(u) for u in [*p.invars, v]):
            return False
        if not all(visit(u) for u in p.invars):
            return False
        eqns.append(p)
        shared = shared or prog.readers(v) > 1
        return True

    if not visit(operand) or not eqns or not shared:
        return None
    # only where the sources are narrower than the copy XLA would write (a 16-bit input
    # converted to float32): a float32 chain of float32 values reads as many bytes either way,
    # and its copy may be the one XLA shares with another sum (:mod:`sums`)
    width = np.dtype(operand.aval.dtype).itemsize
    if any(np.dtype(v.aval.dtype).itemsize >= width for v in sources
           if int(np.prod(v.aval.shape)) == size):
        return None
    return Chain(eqns, sources)


def _floating(v: Any) -> bool:
    return bool(jnp.issubdtype(v.aval.dtype, jnp.floating))


class Copies:
    """Each full-size source's latest copy: every recomputing sum reads a copy of its own,
    one ``optimization_barrier`` further than the last one's."""

    def __init__(self) -> None:
        self._last: dict[Any, Any] = {}

    def of(self, sources: Sequence[Any], values: Sequence[Any], size: int) -> list[Any]:
        """``values`` (those of ``sources``), each of ``size`` elements through a new
        barrier."""
        full = [i for i, v in enumerate(values) if int(np.prod(np.shape(v))) == size]
        if not full:
            return list(values)
        fresh = lax.optimization_barrier(  # type: ignore[no-untyped-call]
            tuple(self._last.get(sources[i], values[i]) for i in full))
        out = list(values)
        for i, value in zip(full, fresh):
            self._last[sources[i]] = value
            out[i] = value
        return out


class Recompute(Rewrite):
    """A sum whose operand is an element-wise chain that other equations read too, computed
    from the chain's sources again (module docstring): a value computed in float32 for a
    16-bit one (a :class:`widening.Wide` value not stored as it is) is a source."""

    name = "recompute"
    primitives = SUMS

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        env, prog = scope.env, scope.analysis

        def kept(v: Any) -> bool:
            value = env.get(v)
            return isinstance(value, widening.Wide) and not value.stored

        def is_source(v: Any) -> bool:
            producer = prog.producer.get(v)
            return kept(v) or (producer is not None and any(
                kept(u) for u in producer.invars if not isinstance(u, Literal)))
        again = chain(eqn, prog, env.get, is_source)
        if again is None:
            return "no chain"
        return Match(self, eqn, (*again.sources, *eqn.invars[1:]), again,
                     f"its chain of {len(again.eqns)} computed again")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        again, eqn = match.detail, match.eqn
        sources, rest = values[:len(again.sources)], values[len(again.sources):]
        copies = scope.state.setdefault(self.name, Copies())
        operand = eqn.invars[0]
        size = int(np.prod(operand.aval.shape))
        plain = copies.of(again.sources, [widening.narrow(v) for v in sources], size)
        local = {v: widening.Wide.of(p) if isinstance(x, widening.Wide) else p
                 for v, x, p in zip(again.sources, sources, plain)}
        for e in again.eqns:
            ins = [v.val if isinstance(v, Literal) else local[v] for v in e.invars]
            if widening.targets(e):
                ins = [widening.widened(x) for x in ins]
            local[e.outvars[0]] = scope.equation(e, ins)[0]
        value = local[operand]
        value = widening.widened(value) if widening.targets(eqn) else value
        outs: list[Any] = scope.equation(eqn, [value, *rest])
        return outs
