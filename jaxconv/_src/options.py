"""Validation of the compute options the ops take: precision, preferred_element_type, lowering."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import geometry, lowering


def compute_options(op: str, precision: Any, preferred_element_type: Any) -> tuple[Any, Any]:
    """Validates ``precision`` and ``preferred_element_type``; returns hashable forms."""
    if preferred_element_type is not None:
        try:
            preferred_element_type = np.dtype(preferred_element_type)
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
        return precision, preferred_element_type
    if isinstance(precision, str):
        try:
            return lax.Precision(precision), preferred_element_type
        except ValueError:
            pass
    elif (
        isinstance(precision, (tuple, list))
        and len(precision) == 2
        and all(isinstance(v, lax.Precision) or v is None for v in precision)
    ):
        return tuple(precision), preferred_element_type
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
) -> tuple[list[Any], Any, Any]:
    """The preamble of every op: arrays, one shared dtype, valid compute options.

    Returns (the arrays as jax arrays in order, precision, preferred_element_type).
    """
    arrs = {name: geometry.check_array(op, name, v) for name, v in arrays.items()}
    dtype = geometry.check_same_dtype(op, arrs, floating=floating)
    precision, preferred_element_type = compute_options(op, precision, preferred_element_type)
    if floating:
        check_output_dtype(op, dtype, preferred_element_type)
    return list(arrs.values()), precision, preferred_element_type


def check_lowering(op: str, kind: str, lowering_value: Any, p: Any) -> str:
    """Validates an op's ``lowering=`` against the methods of its kernel and the problem ``p``.

    ``kind`` is ``"forward"``, ``"weight"`` or ``"data"`` (which kernel the op runs).
    Returns the method (``"auto"`` or one of the kernel's methods).
    """
    if kind == "forward":
        methods = lowering.FORWARD_METHODS
    elif kind == "weight":
        methods = lowering.WEIGHT_GRAD_METHODS
    elif kind == "data":
        methods = lowering.DATA_GRAD_METHODS
    else:
        raise ValueError(f"check_lowering: kind must be 'forward', 'weight' or 'data', got {kind!r}")
    allowed = ["auto", *methods]
    if not isinstance(lowering_value, str):
        raise TypeError(f"{op}: lowering must be a string, one of {allowed}, got "
                        f"{lowering_value!r}")
    if lowering_value not in allowed:
        raise ValueError(f"{op}: lowering must be one of {allowed}, got {lowering_value!r}")
    why = lowering.method_inapplicable(lowering_value, p)
    if why is not None:
        usable = [m for m in allowed if lowering.method_inapplicable(m, p) is None]
        raise ValueError(f"{op}: lowering={lowering_value!r} does not apply to this problem: "
                         f"{why}; use one of {usable}")
    return lowering_value
