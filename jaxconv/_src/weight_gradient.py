"""The weight-gradient ops of both oneDNN families share this body.

``convolution_backprop_filters`` / ``convolution_backward_weights`` and the
ConvTranspose ``backward_weights`` / ``backprop_filters`` differ only in their
argument names, defaults and problem builder.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxconv._src import geometry, options, primitive
from jaxconv._src.geometry import Names
from jaxconv._src.kernel import Kernel
from jaxconv._src.typing import ArrayLike, DTypeLike, PrecisionLike, ShapeLike, WeightGradLowering


def weight_gradient(
    op: str, names: Names, x_value: ArrayLike, dy_value: ArrayLike, w_shape: ShapeLike | None,
    precision: PrecisionLike, preferred_element_type: DTypeLike | None, *,
    lowering: WeightGradLowering, transposed: bool = False, **attrs: Any,
) -> jax.Array:
    """Validate, resolve, lower: the body of every oneDNN weight-gradient op.

    ``transposed`` builds the ConvTranspose problem; a ConvTranspose's weight
    gradient is the weight gradient of the convolution it transposes with x
    and dy swapped, so one kernel serves both families.
    """
    (x, dy), precision, preferred_element_type = options.check_inputs(
        op, {names.x: x_value, names.y: dy_value}, precision, preferred_element_type)
    shape = geometry.static_shape(op, names.w_shape, w_shape)
    build = geometry.conv_transpose_problem if transposed else geometry.convolution_problem
    p = build(op, names, x_shape=x.shape, y_shape=dy.shape, w_shape=shape, **attrs)
    lhs, rhs = (dy, x) if transposed else (x, dy)
    return primitive.weight_grad(lhs, rhs, p=p, precision=precision,
                                    preferred_element_type=preferred_element_type,
                                    method=options.check_lowering(op, Kernel.WEIGHT, lowering, p))
