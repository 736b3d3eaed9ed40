"""Validation of the compute options the ops take: precision, preferred_element_type, lowering."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import geometry, lowering
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import DType, Kernel, Precision


def compute_options(op: str, precision: Any, preferred_element_type: Any) -> tuple[Precision, DType]:
    """Validates ``precision`` and ``preferred_element_type``; returns hashable forms."""
    dtype: DType = None
    if preferred_element_type is not None:
        try:
            dtype = preferred_element_type = np.dtype(preferred_element_type)
        except TypeError:
            raise TypeError(
                f"{op}: preferred_element_type must be a dtype or None, got "
                f"{preferred_element_type!r}"
            ) from None
        if not jnp.issubdtype(preferred_element_type, jnp.number):
            raise TypeError(
                f"{op}: preferred_element_type must be a numeric dtype, got {preferred_element_type}"
            )
    if precision is None or isinstance(precision, lax.Precision):
        return precision, dtype
    if isinstance(precision, str):
        try:
            return lax.Precision(precision), dtype
        except ValueError:
            pass
    elif (
        isinstance(precision, (tuple, list))
        and len(precision) == 2
        and all(isinstance(v, lax.Precision) or v is None for v in precision)
    ):
        pair: Precision = (precision[0], precision[1])
        return pair, dtype
    raise ValueError(
        f"{op}: precision must be None, a lax.Precision, 'default', 'high', 'highest' or a pair "
        f"of lax.Precision, got {precision!r}"
    )


def check_output_dtype(op: str, dtype: np.dtype, preferred_element_type: Any) -> None:
    if preferred_element_type is not None and not jnp.issubdtype(
        preferred_element_type, np.inexact
    ):
        raise TypeError(
            f"{op}: preferred_element_type must be a floating dtype for {dtype} inputs, got "
            f"{preferred_element_type}"
        )


def check_inputs(
    op: str, arrays: dict[str, Any], precision: Any, preferred_element_type: Any,
    *, floating: bool = True,
) -> tuple[list[jax.Array], Precision, DType]:
    """The preamble of every op: arrays, one shared dtype, valid compute options.

    Returns (the arrays as jax arrays in order, precision, preferred_element_type).
    """
    arrs = {name: geometry.check_array(op, name, v) for name, v in arrays.items()}
    dtype = geometry.check_same_dtype(op, arrs, floating=floating)
    valid_precision, out_dtype = compute_options(op, precision, preferred_element_type)
    if floating:
        check_output_dtype(op, dtype, out_dtype)
    return list(arrs.values()), valid_precision, out_dtype


def check_lowering(op: str, kernel: Kernel, lowering_value: Any, p: ConvProblem) -> str:
    """Validates an op's ``lowering=`` against the methods of its kernel and the problem ``p``.

    Returns the method (``"auto"``, ``"direct"`` or one of the kernel's methods in the registry).
    """
    allowed = ["auto", "direct", *lowering.methods(kernel)]
    if not isinstance(lowering_value, str):
        raise TypeError(f"{op}: lowering must be a string, one of {allowed}, got "
                        f"{lowering_value!r}")
    if lowering_value not in allowed:
        raise ValueError(f"{op}: lowering must be one of {allowed}, got {lowering_value!r}")
    if lowering_value in ("auto", "direct"):
        return lowering_value
    why = lowering.why_not(lowering_value, kernel, p)
    if why is not None:
        # the methods every installation and platform has (deterministic messages): not "onednn"
        usable = ["auto", "direct", *(m for m in allowed[2:] if lowering.METHODS[m].platforms is None
                            and lowering.why_not(m, kernel, p) is None)]
        raise ValueError(f"{op}: lowering={lowering_value!r} does not apply to this problem: "
                         f"{why}; use one of {usable}")
    return lowering_value
