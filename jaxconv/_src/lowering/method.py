"""One record per lowering method: what it implements, where it applies, and why not elsewhere.

A method is a name the ops' ``lowering=`` argument accepts. Its record holds, per kernel it
implements, the function that computes it; whether it applies to a problem (and, if not,
why: the message a user gets for a forced ``lowering=``); the phrase the ops' docstrings
show; and whether it is a *combinator* (it reworks the problem and runs sub-problems through
a leaf formulation the dispatch hands it) or a *leaf* (it computes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import CombinatorFn, Kernel, KernelFn


def always(p: ConvProblem) -> str | None:
    """The applicability test of a method that applies to every problem."""
    return None


def depthwise_only(p: ConvProblem) -> str | None:
    """Why a method that needs one input channel per group does not apply, or None."""
    if p.in_channels != p.groups:
        return (f"needs one input channel per group (depthwise), got {p.in_channels} input "
                f"channels in {p.groups} group(s)")
    return None


def grouped_only(verb: str) -> Callable[[ConvProblem], str | None]:
    """The applicability test of a method that ``verb``s a grouped problem."""
    def inapplicable(p: ConvProblem) -> str | None:
        return f"{verb} a grouped problem, got groups=1" if p.groups == 1 else None
    return inapplicable


@dataclasses.dataclass(frozen=True)
class Method:
    """A lowering method: one registry entry (``registry.METHODS``)."""

    #: the value of ``lowering=`` that forces it
    name: str
    #: what it does, for the ops' docstrings (a phrase after the quoted name)
    summary: str
    #: the function per kernel it implements (leaf: :class:`KernelFn`; combinator:
    #: :class:`CombinatorFn`)
    kernels: Mapping[Kernel, KernelFn | CombinatorFn]
    #: why it does not apply to a problem (a phrase after the method's name), or None
    inapplicable: Callable[[ConvProblem], str | None] = always
    #: whether it reworks the problem and runs its pieces through a leaf formulation
    combinator: bool = False
    #: the backends (``tables.BACKENDS``) whose programs may hold it; None: every one. A
    #: program lowered for another backend computes the problem by that backend's own choice.
    platforms: tuple[str, ...] | None = None
    #: whether, in a program XLA's SPMD partitioner splits across devices, it runs on each
    #: device's blocks (``lowering/spmd.py``: a custom call wrapped in ``custom_partitioning``) instead
    #: of leaving the problem to the backend's XLA formulation
    per_shard: bool = False
    #: the backends on whose programs its kernels fence their matrix products off from the
    #: operations around them (they take ``fence=True`` there: ``common.product``, where
    #: XLA:GPU aborted otherwise)
    fenced_on: tuple[str, ...] = ()
    #: why it does not take a kernel's operands (kernel, problem, dtype,
    #: preferred_element_type), or None: a device's blocks it refuses run the plan's fallback
    #: (``execute.py``); None: it takes whatever its problem test allows
    refuses: Callable[[Kernel, ConvProblem, Any, Any], str | None] | None = None

    def why_not(self, kernel: Kernel, p: ConvProblem) -> str | None:
        """Why this method cannot compute ``kernel`` for ``p``, or None if it can."""
        if kernel not in self.kernels:
            return f"'{self.name}' has no {kernel.label} formulation"
        why = self.inapplicable(p)
        return None if why is None else f"'{self.name}' {why}"
