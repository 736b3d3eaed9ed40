"""Equinox layers whose gradients are jaxconv's kernels (``pip install jaxconv[equinox]``).

Equinox conventions: ``eqx.Module``s called on one unbatched example ``(C, *spatial)``
(``jax.vmap`` them over a batch), initialised from a ``key``.

* :class:`Conv`: the arguments, parameters (weight ``(out, in // groups, *K)``, bias
  ``(out, 1, ..., 1)``) and initialisation of ``eqx.nn.Conv``, computed by
  :func:`jaxconv.conv_general_dilated`.
* :class:`ConvTranspose`: PyTorch's ``ConvTranspose{1,2,3}d`` semantics with its weight
  layout ``(in, out // groups, *K)`` (a torch weight loads as it is; ``eqx.nn.ConvTranspose``
  stores ``(out, in // groups, *K)`` instead).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import equinox as eqx
import jax

from jaxconv._src.lax_conv import conv_general_dilated
from jaxconv._src.torch_conv_transpose import conv_transpose_torch, per_axis
from jaxconv._src.typing import PrecisionLike


def _uniform(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    lim = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, minval=-lim, maxval=lim)


class Conv(eqx.Module):
    """``eqx.nn.Conv`` with jaxconv's gradients.

    Example:
      >>> import jax, jaxconv.equinox
      >>> conv = jaxconv.equinox.Conv(2, 4, 8, 3, stride=2, padding=1, groups=2,
      ...                             key=jax.random.key(0))
      >>> conv(jax.numpy.ones((4, 16, 16))).shape
      (8, 8, 8)
    """

    weight: jax.Array
    bias: jax.Array | None
    num_spatial_dims: int = eqx.field(static=True)
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: str | tuple[tuple[int, int], ...] = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)
    precision: PrecisionLike = eqx.field(static=True)

    def __init__(self, num_spatial_dims: int, in_channels: int, out_channels: int,
                 kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: str | int | Sequence[int] | Sequence[tuple[int, int]] = 0,
                 dilation: int | Sequence[int] = 1, groups: int = 1, use_bias: bool = True,
                 precision: PrecisionLike = None, *, key: jax.Array) -> None:
        n = num_spatial_dims
        kernel = per_axis("Conv", "kernel_size", kernel_size, n, minimum=1)
        wkey, bkey = jax.random.split(key)
        fan_in = in_channels // groups * math.prod(kernel)
        self.weight = _uniform(wkey, (out_channels, in_channels // groups, *kernel), fan_in)
        self.bias = _uniform(bkey, (out_channels,) + (1,) * n, fan_in) if use_bias else None
        self.num_spatial_dims, self.groups, self.precision = n, groups, precision
        self.stride = per_axis("Conv", "stride", stride, n, minimum=1)
        self.dilation = per_axis("Conv", "dilation", dilation, n, minimum=1)
        if isinstance(padding, str):
            self.padding = padding
        elif isinstance(padding, int):
            self.padding = ((padding, padding),) * n
        else:
            pairs: list[tuple[int, int]] = []
            for p in padding:
                if isinstance(p, int):
                    pairs.append((p, p))
                else:
                    lo, hi = p
                    pairs.append((int(lo), int(hi)))
            self.padding = tuple(pairs)

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """``x``: one example ``(in_channels, *spatial)``; returns ``(out_channels, *out)``."""
        y = conv_general_dilated(x[None], self.weight, self.stride, self.padding,
                                 rhs_dilation=self.dilation, feature_group_count=self.groups,
                                 precision=self.precision)[0]
        return y if self.bias is None else y + self.bias


class ConvTranspose(eqx.Module):
    """A transposed convolution with PyTorch's semantics and weight layout.

    Example:
      >>> import jax, jaxconv.equinox
      >>> up = jaxconv.equinox.ConvTranspose(2, 8, 4, 3, stride=2, padding=1,
      ...                                    output_padding=1, key=jax.random.key(0))
      >>> up(jax.numpy.ones((8, 5, 5))).shape
      (4, 10, 10)
    """

    weight: jax.Array
    bias: jax.Array | None
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: tuple[int, ...] = eqx.field(static=True)
    output_padding: tuple[int, ...] = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)
    precision: PrecisionLike = eqx.field(static=True)

    def __init__(self, num_spatial_dims: int, in_channels: int, out_channels: int,
                 kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0,
                 dilation: int | Sequence[int] = 1, groups: int = 1, use_bias: bool = True,
                 precision: PrecisionLike = None, *, key: jax.Array) -> None:
        n = num_spatial_dims
        kernel = per_axis("ConvTranspose", "kernel_size", kernel_size, n, minimum=1)
        wkey, bkey = jax.random.split(key)
        fan_in = out_channels // groups * math.prod(kernel)  # PyTorch's, for ConvTranspose
        self.weight = _uniform(wkey, (in_channels, out_channels // groups, *kernel), fan_in)
        self.bias = _uniform(bkey, (out_channels,) + (1,) * n, fan_in) if use_bias else None
        self.stride = per_axis("ConvTranspose", "stride", stride, n, minimum=1)
        self.padding = per_axis("ConvTranspose", "padding", padding, n, minimum=0)
        self.output_padding = per_axis("ConvTranspose", "output_padding", output_padding, n, minimum=0)
        self.dilation = per_axis("ConvTranspose", "dilation", dilation, n, minimum=1)
        self.groups, self.precision = groups, precision

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """``x``: one example ``(in_channels, *spatial)``; returns ``(out_channels, *out)``."""
        y = conv_transpose_torch(
            x[None], self.weight, stride=self.stride, padding=self.padding,
            output_padding=self.output_padding, dilation=self.dilation, groups=self.groups,
            data_format="NCX", precision=self.precision)[0]
        return y if self.bias is None else y + self.bias.astype(y.dtype)


