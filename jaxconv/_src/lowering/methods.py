"""Every lowering method by name (:data:`METHODS`), the names each kernel accepts, and why a
method does not apply to a problem. Everything that needs the methods reads this table: the
ops' ``lowering=`` checks and docstrings, the chooser, the execution, the tests."""

from __future__ import annotations

import typing

from jaxconv._src import typing as public
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import convolution, grouped, onednn, phases, shifted, taps, winograd
from jaxconv._src.lowering.method import Method

#: every lowering method, by name
METHODS: dict[str, Method] = {m.name: m for m in (
    convolution.CONV,
    convolution.FEATURE_GROUP,
    convolution.GRID,
    phases.PHASES,
    shifted.SHIFTED,
    taps.DOT,
    convolution.VJP,
    onednn.ONEDNN,
    onednn.ONEDNN_F32,
    winograd.WINOGRAD,
    winograd.WINOGRAD_2X2,
    winograd.WINOGRAD_3X3,
    winograd.WINOGRAD_4X4,
    grouped.PER_GROUP,
    grouped.BLOCK_DIAGONAL,
)}

#: the public type of each kernel's ``lowering=`` argument (its values, in their documented order)
LOWERING_TYPES = {Kernel.FORWARD: public.ForwardLowering, Kernel.DATA: public.DataGradLowering,
                  Kernel.WEIGHT: public.WeightGradLowering}


def methods(kernel: Kernel) -> tuple[str, ...]:
    """The methods that implement ``kernel``, in the order of its public ``Literal`` type."""
    names = [m for m in METHODS if kernel in METHODS[m].kernels]
    order = [v for v in typing.get_args(LOWERING_TYPES[kernel]) if v in names]
    return (*order, *(m for m in names if m not in order))


def why_not(method: str, kernel: Kernel, p: ConvProblem) -> str | None:
    """Why ``method`` cannot compute ``kernel`` for ``p`` (a registered name), or None."""
    return METHODS[method].why_not(kernel, p)


def default_leaf(kernel: Kernel) -> str:
    """The leaf where no backend's table is known, or oneDNN does not take the operands: one
    convolution."""
    return "grid" if kernel is Kernel.DATA else "conv"
