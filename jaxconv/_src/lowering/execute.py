"""Executing a kernel call's :class:`Plan` (which ``chooser.plan`` makes): its method's function
with the plan's parameters, on each device's blocks where the plan says so (``spmd.call``,
which sets each block's threads; blocks the method refuses run the plan's fallback), or its
combinator with a leaf plan for each sub-problem. Nothing here decides a method."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, CombinatorFn, DType, Kernel, Precision
from jaxconv._src.lowering import spmd
from jaxconv._src.lowering.methods import METHODS


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one kernel call runs, fully resolved (made by ``chooser.plan``)."""

    kernel: Kernel
    #: the method that computes it (a registered name, never ``"auto"``)
    method: str
    #: the backend whose program holds the call (None: a direct call, no table)
    backend: str | None
    #: run per device's blocks (``spmd.call``), in a program split across devices
    per_shard: bool = False
    #: the method's parameters, (name, value) pairs its function takes as keywords:
    #: Winograd's ``tile``, ``fence`` (products fenced off from the operations around them:
    #: ``common.product``), ``threads`` (0: the handler's rule; per device's blocks, spmd's)
    params: tuple[tuple[str, Any], ...] = ()
    #: the leaf method for a device's blocks the method refuses (``Method.refuses``), or None
    fallback: str | None = None
    dtype: Any = None
    precision: Precision = None
    preferred_element_type: DType = None
    #: why this method (what ``jaxconv.explain`` prints): "rule" (the table), "measured: ..." or
    #: "cache: ..." (a timed choice), "forced", or a forced method's replacement and its reason
    why: str = dataclasses.field(default="", compare=False)
    #: the plan of a combinator's one-group sub-problem (``chooser``: the same backend's table)
    sub_plan: Callable[[Kernel, ConvProblem], Plan] | None = dataclasses.field(
        default=None, compare=False)


def execute(plan: Plan, a: Array, b: Array, p: ConvProblem) -> Array:
    """Runs ``plan`` on (a, b)."""
    record = METHODS[plan.method]
    if record.combinator:
        sub_plan = plan.sub_plan
        if sub_plan is None:
            raise RuntimeError(f"jaxconv: combinator {plan.method!r} planned without sub-plans")

        def leaf(sub_kernel: Kernel, sa: Array, sb: Array, sub: ConvProblem) -> Array:
            leaf_plan = sub_plan(sub_kernel, sub)
            if METHODS[leaf_plan.method].combinator:  # a table bug (tests/lowering/test_registry.py)
                raise RuntimeError(f"jaxconv: a combinator's sub-problem got {leaf_plan.method!r}")
            return _compute(leaf_plan, sa, sb, sub)
        return typing.cast(CombinatorFn, record.kernels[plan.kernel])(a, b, p, leaf=leaf)
    return _compute(plan, a, b, p)


def _compute(plan: Plan, a: Array, b: Array, p: ConvProblem) -> Array:
    """A leaf plan on (a, b): on each device's blocks or as one call."""
    record = METHODS[plan.method]
    fn = typing.cast(Any, record.kernels[plan.kernel])
    params = dict(plan.params)

    def compute(sa: Array, sb: Array, sub: ConvProblem, threads: int = 0) -> Array:
        if plan.fallback is not None and record.refuses is not None and record.refuses(
                plan.kernel, sub, plan.dtype, plan.preferred_element_type):
            other = typing.cast(Any, METHODS[plan.fallback].kernels[plan.kernel])
            return typing.cast(Array, other(sa, sb, sub, plan.precision,
                                            plan.preferred_element_type))
        extra = {**params, "threads": threads} if "threads" in params else params
        return typing.cast(Array, fn(sa, sb, sub, plan.precision, plan.preferred_element_type,
                                     **extra))
    if plan.per_shard:
        return spmd.call(plan.kernel, a, b, p, compute)
    return compute(a, b, p)
