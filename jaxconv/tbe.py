"""Ascend TBE: the 5HD and FRACTAL_Z layout helpers and ``conv2d_backprop_filter``."""

from jaxconv._src import tbe_layouts as _tbe_layouts
from jaxconv._src.tbe import conv2d_backprop_filter
from jaxconv._src.tbe_layouts import (
    fractal_z_shape,
    from_5hd,
    from_fractal_z,
    to_5hd,
    to_fractal_z,
)

__doc__ = __doc__ + "\n" + _tbe_layouts.__doc__  # the index maps, drawn

__all__ = [
    "conv2d_backprop_filter",
    "fractal_z_shape",
    "from_5hd",
    "from_fractal_z",
    "to_5hd",
    "to_fractal_z",
]
