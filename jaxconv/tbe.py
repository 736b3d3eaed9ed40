"""Ascend TBE layouts and ops: 5HD and FRACTAL_Z helpers, conv2d_backprop_filter.

See :mod:`jaxconv._src.tbe_layouts` for the index maps, drawn.
"""

from jaxconv._src.tbe import conv2d_backprop_filter
from jaxconv._src.tbe_layouts import (
    fractal_z_shape,
    from_5hd,
    from_fractal_z,
    to_5hd,
    to_fractal_z,
)

__all__ = [
    "conv2d_backprop_filter",
    "fractal_z_shape",
    "from_5hd",
    "from_fractal_z",
    "to_5hd",
    "to_fractal_z",
]
