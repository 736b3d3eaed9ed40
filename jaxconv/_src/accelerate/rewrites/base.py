"""What a rewrite of :func:`jaxconv.accelerate` is, and why one declines an equation.

A rewrite reads equations of some primitives. ``match(eqn, scope)`` returns a :class:`Match`
(what it found, and which variables its ``emit`` reads) or a key of :data:`REASONS` (why the
equation runs as written); ``emit(match, values, scope)`` computes the equation's results from
those variables' values. Each of the interpreter's passes (``transform.PASSES``) asks its
rewrites (``rewrites.WIDEN``, then ``rewrites.KERNELS``) in order, and the first match wins;
``jaxconv.explain`` prints the same matches and reasons (``Decision``).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from jaxconv._src.accelerate.analysis import Analysis
from jaxconv._src.lowering import chooser

#: Why an equation runs as lax wrote it, by key: the chooser's reasons for handing a
#: convolution to lax (``chooser.HANDED_TO_LAX``, which jaxconv's own ops use too) and the
#: rewrites' own.
REASONS: dict[str, str] = {
    **chooser.HANDED_TO_LAX,
    "dtype": "operands not real floating point, or of two dtypes",
    "dilation and stride": "input dilation with a window stride or batch groups (no kernel's "
                           "transpose)",
    "groups": "feature and batch groups together",
    "pad range": "pads no forward problem has (a pad past the dilated kernel)",
    "written faster": "a transposed convolution XLA computes faster as written than jaxconv's "
                      "kernel of its reversed filter (timed on this machine)",
    "pool dilation": "a dilated pool window or base",
    "pool axes": "a pool over the first and last axes (neither NXC nor NCX)",
    "pool select": "a min pool's selection (select_prim is not >=)",
    "pool padding": "pads no max pool has",
    "window size": "a window sum of more than WINDOW_SUM_MAX_TAPS (64) taps, left to XLA",
    "no spread": "not the transpose of a pool whose windows do not overlap",
    "read elsewhere": "its result has readers other than the window sums that repeat it",
    "not factored": "not a float32 sum of a product by a factor it does not sum over",
    "no chain": "its operand is no shared element-wise chain of narrower sources",
    "no product": "not a transpose of a 2D matrix product's result",
    "product": "not a product oneDNN's matmul computes here",
    "no fused chain": "not the end of an element-wise chain of a convolution's result that "
                      "nothing else reads",
    "no forward": "the chain of a convolution that is no forward jaxconv computes",
    "fused dtype": "the chain of a convolution that is not float32, bfloat16 or float16, or "
                   "that goes on in float32 past its last value in the convolution's dtype "
                   "with no reader converting its result back",
    "fused layout": "the chain of a convolution whose result is not in its input's layout",
    "chain goes on": "its result is the value the next equation of the chain continues",
    "no narrowing": "not a float32 -> bfloat16 cast that only convolutions and products read",
}

#: the reasons that say an equation is not what a rewrite reads at all (every other
#: element-wise equation of a program, for the fused chain): ``jaxconv.explain`` counts them
#: apart from the refusals
STRUCTURAL = frozenset({"no fused chain", "chain goes on", "no narrowing"})


def constant(value: Any) -> bool:
    """Whether ``value`` is a constant of the program: an array, not a tracer (a model's
    variables closed over by the function ``accelerate`` wraps)."""
    return isinstance(value, (jax.Array, np.ndarray)) and not isinstance(value, jax.core.Tracer)


def packs(w: Any) -> bool:
    """Whether the filter ``w`` is packed where oneDNN runs its kernel (a forward's or a
    transposed convolution's): a constant of the program, in a process whose programs run on
    the CPU (elsewhere the call is never oneDNN's, and its packing would be work and memory for
    nothing; docs/onednn.md, "Packed filters")."""
    return constant(w) and jax.default_backend() == "cpu"


@dataclasses.dataclass(frozen=True)
class Match:
    """What a rewrite found in one equation."""

    rewrite: Rewrite
    eqn: Any
    #: the variables whose values :meth:`Rewrite.emit` reads, in order
    reads: tuple[Any, ...]
    #: what ``match`` resolved (a kernel, a pool problem, the pad a sum reads through, ...)
    detail: Any = None
    #: what ``explain`` prints for it
    label: str = ""


@dataclasses.dataclass
class Scope:
    """One jaxpr's evaluation, as a rewrite sees it."""

    analysis: Analysis
    #: each variable's value so far (16-bit ones maybe ``widening.Wide``)
    env: dict[Any, Any]
    #: the method every convolution asks for (``"auto"`` or ``"direct"``)
    lowering: str
    #: an equation evaluated as written (16-bit arithmetic in float32, nested jaxprs rewritten)
    equation: Callable[[Any, list[Any]], Any]
    #: per-rewrite state kept over the jaxpr's equations, by the rewrite's name
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: float32 variables whose values are 16-bit values widened (a fused chain's result), with
    #: those values: a convert back to their dtype reads them (the narrowing rewrite)
    narrow: dict[Any, Any] = dataclasses.field(default_factory=dict)


class Rewrite(abc.ABC):
    """An equation of :attr:`primitives` computed otherwise, where :meth:`match` finds one."""

    #: the rewrite's name (what ``explain`` and the tests say)
    name: ClassVar[str]
    #: the primitives whose equations it reads
    primitives: ClassVar[frozenset[str]]

    @abc.abstractmethod
    def match(self, eqn: Any, scope: Scope) -> Match | str:
        """What the rewrite computes for ``eqn``, or the key of :data:`REASONS` saying why
        not."""

    @abc.abstractmethod
    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        """The equation's results, from the values of ``match.reads``."""

    def __repr__(self) -> str:
        return f"<rewrite {self.name}>"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the rewrites made of one equation: the one that matched (with its label), or
    each asked rewrite's reason."""

    eqn: Any
    matched: str | None
    label: str = ""
    #: each declining rewrite's name and reason key
    reasons: tuple[tuple[str, str], ...] = ()
    #: the match's ``detail`` (a convolution's kernel, ...)
    detail: Any = None

    def why(self) -> str:
        """The reasons as text (:data:`REASONS`)."""
        return "; ".join(REASONS[key] for _, key in self.reasons)
