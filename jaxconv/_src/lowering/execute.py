"""Executing a kernel call's :class:`Plan` (which ``policy.plan`` makes): its leaf method, on
each device's blocks where the plan says so (``spmd.call``, which sets each block's threads),
or its combinator with a leaf plan for each sub-problem. Nothing here decides a method."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, CombinatorFn, DType, Kernel, Precision
from jaxconv._src.lowering import onednn, spmd
from jaxconv._src.lowering.methods import METHODS, default_leaf


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one kernel call runs (made by ``policy.plan``)."""

    kernel: Kernel
    #: the method that computes it (a registered name, never ``"auto"``)
    method: str
    #: the backend whose program holds the call (None: a direct call, no table)
    backend: str | None
    #: run per device's blocks (``spmd.call``), in a program split across devices
    per_shard: bool = False
    #: the method's products fenced off from the operations around them (``common.product``)
    fence: bool = False
    dtype: Any = None
    precision: Precision = None
    preferred_element_type: DType = None
    #: the plan of a combinator's one-group sub-problem (``policy``: the same backend's table)
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
            if METHODS[leaf_plan.method].combinator:  # a table bug (tests/test_lowering_registry.py)
                raise RuntimeError(f"jaxconv: a combinator's sub-problem got {leaf_plan.method!r}")
            return _compute(leaf_plan, sa, sb, sub)
        return typing.cast(CombinatorFn, record.kernels[plan.kernel])(a, b, p, leaf=leaf)
    return _compute(plan, a, b, p)


def _compute(plan: Plan, a: Array, b: Array, p: ConvProblem) -> Array:
    """A leaf plan on (a, b): on each device's blocks or as one call."""
    record = METHODS[plan.method]
    fn = typing.cast(Any, record.kernels[plan.kernel])

    def compute(sa: Array, sb: Array, sub: ConvProblem, threads: int = 0) -> Array:
        extra: dict[str, Any] = {"threads": threads} if record.per_shard else {}
        if record.fenced_on:
            extra["fence"] = plan.fence
        if plan.method == "onednn" and onednn.applies(plan.kernel, sub, plan.dtype,
                                             plan.preferred_element_type):
            # a device's blocks oneDNN does not take (the plan's own test, on the blocks): one
            # convolution on them
            other = typing.cast(Any, METHODS[default_leaf(plan.kernel)].kernels[plan.kernel])
            return typing.cast(Array, other(sa, sb, sub, plan.precision,
                                            plan.preferred_element_type))
        return typing.cast(Array, fn(sa, sb, sub, plan.precision, plan.preferred_element_type,
                                     **extra))
    if plan.per_shard:
        return spmd.call(plan.kernel, a, b, p, compute)
    return compute(a, b, p)
