"""The three kernels every jaxconv op lowers to, and the types their formulations share.

Each kernel reads a :class:`~jaxconv._src.geometry.ConvProblem` (the roles of a
forward convolution ``y = conv(x, W)``) and two arrays:

* ``Kernel.FORWARD``  x, W  -> y
* ``Kernel.DATA``     dy, W -> dx   (also: the ConvTranspose forward)
* ``Kernel.WEIGHT``   x, dy -> dW   (also: the ConvTranspose weight gradient, with x
  and dy swapped: docs/semantics.md)
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, TypeAlias

import jax
import numpy as np
from jax import lax

from jaxconv._src.geometry import ConvProblem

Array = jax.Array
#: precision as the kernels get it: validated and hashable (``options.compute_options``: None,
#: a ``lax.Precision`` or a pair of them)
Precision: TypeAlias = lax.PrecisionLike
#: a numpy dtype, or None for "the input dtype"
DType: TypeAlias = np.dtype[Any] | None


class Kernel(str, enum.Enum):
    """Which of the three bilinear kernels: a value of the primitive's ``kernel`` parameter.

    A ``str`` enum: ``Kernel.DATA == "data"``, so messages and ``eqn.params`` read as words.
    """

    FORWARD = "forward"
    DATA = "data"
    WEIGHT = "weight"

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        """How the docs name it: "forward", "data-gradient", "weight-gradient"."""
        return "forward" if self is Kernel.FORWARD else f"{self.value}-gradient"

    def out_shape(self, p: ConvProblem) -> tuple[int, ...]:
        """The shape of the kernel's result for ``p``: y, dx or dW."""
        if self is Kernel.FORWARD:
            return p.y_shape
        if self is Kernel.DATA:
            return p.x_shape
        return p.filter_shape


class KernelFn(Protocol):
    """A leaf formulation of one kernel: ``fn(a, b, p, precision, preferred_element_type)``."""

    def __call__(self, a: Array, b: Array, p: ConvProblem, precision: Precision,
                 preferred_element_type: DType, /) -> Array: ...


class Leaf(Protocol):
    """What a combinator calls for each sub-problem: a leaf formulation of ``kernel``,
    resolved for the backend the kernel call is lowered for (never ``"auto"`` again)."""

    def __call__(self, kernel: Kernel, a: Array, b: Array, p: ConvProblem, /) -> Array: ...


class CombinatorFn(Protocol):
    """A formulation that reworks the problem and runs sub-problems through ``leaf``."""

    def __call__(self, a: Array, b: Array, p: ConvProblem, /, *, leaf: Leaf) -> Array: ...
