"""The shared core of the ConvTranspose layers: PyTorch's ``ConvTranspose{1,2,3}d`` semantics.

PyTorch's output size is ``(I - 1) * S - 2 * P + D * (K - 1) + output_padding + 1``, with the
weight ``(in_channels, out_channels // groups, *K)``: jaxconv's ConvTranspose with IOX weights,
``pads_begin = pads_end = P``. Both layer libraries call this one function.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

import jaxconv._src.conv_transpose as ct
from jaxconv._src import geometry
from jaxconv._src.typing import DataFormat, PrecisionLike


def per_axis(layer: str, name: str, value: int | Sequence[int], n: int, *,
             minimum: int) -> tuple[int, ...]:
    """A layer argument: one int for every spatial axis, or one per axis (``geometry.int_tuple``)."""
    return geometry.int_tuple(layer, name, value, n, default=minimum, minimum=minimum)


def conv_transpose_torch(x: jax.Array, weight: jax.Array, *, stride: Sequence[int],
                         padding: Sequence[int], output_padding: Sequence[int],
                         dilation: Sequence[int], groups: int, data_format: DataFormat,
                         precision: PrecisionLike = None) -> jax.Array:
    """``torch.nn.functional.conv_transpose{n}d`` (without bias) on a batched ``x``."""
    return ct.conv_transpose(
        x, weight, strides=tuple(stride), pads_begin=tuple(padding), pads_end=tuple(padding),
        output_padding=tuple(output_padding), dilations=tuple(dilation), groups=groups,
        data_format=data_format, filter_format="IOX", precision=precision)
