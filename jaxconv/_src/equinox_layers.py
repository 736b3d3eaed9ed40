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

import inspect
import math
import typing
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax

from jaxconv._src.lax_conv import conv_general_dilated
from jaxconv._src.torch_conv_transpose import conv_transpose_torch, per_axis
from jaxconv._src.typing import ForwardLowering, PrecisionLike


def _uniform(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    lim = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, minval=-lim, maxval=lim)


class _JaxconvConv(eqx.Module):
    """What the Conv classes add to equinox's: jaxconv's convolution in ``__call__``, and
    ``precision`` and ``lowering`` (keyword-only arguments, static fields)."""

    precision: PrecisionLike = eqx.field(static=True, default=None, kw_only=True)
    lowering: ForwardLowering = eqx.field(static=True, default="auto", kw_only=True)

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """``x``: one example ``(in_channels, *spatial)``; returns ``(out_channels, *out)``.

        As ``eqx.nn.Conv.__call__`` (its rank check and message, its padding modes), with
        :func:`jaxconv.conv_general_dilated` in place of ``lax.conv_general_dilated``.
        """
        conv = typing.cast(eqx.nn.Conv, self)
        unbatched_rank = conv.num_spatial_dims + 1
        if x.ndim != unbatched_rank:
            raise ValueError(
                f"Input to `Conv` needs to have rank {unbatched_rank},",
                f" but input has shape {x.shape}.",
            )
        padding = conv.padding
        if conv.padding_mode != "ZEROS":
            x = conv._nonzero_pad(x)
            padding = "VALID"
        y = conv_general_dilated(x[None], conv.weight, conv.stride, padding,
                                 rhs_dilation=conv.dilation, feature_group_count=conv.groups,
                                 precision=self.precision, lowering=self.lowering)[0]
        return y + typing.cast(jax.Array, conv.bias) if conv.use_bias else y


def _equinox_conv(base: type[eqx.nn.Conv], name: str, rank: int | None) -> type[eqx.nn.Conv]:
    """``base`` (an ``eqx.nn`` Conv class) computed by jaxconv: same signature (plus the
    keyword-only ``precision`` and ``lowering``), fields, defaults, checks and messages."""
    dims = "N" if rank is None else f"{rank}"
    doc = f"""``eqx.nn.{base.__name__}`` with jaxconv's gradients.

    The arguments, fields, defaults, initialisation, construction checks and messages are
    ``eqx.nn.{base.__name__}``'s own (this class derives from it); the convolution is
    :func:`jaxconv.conv_general_dilated` ({dims} spatial axes). Two keyword-only additions:
    ``precision`` (as in lax) and ``lowering`` (jaxconv's forward formulation, as in
    :func:`jaxconv.convolution`). Every ``padding_mode`` of equinox is supported.
    """
    def __init__(self: Any, *args: Any, precision: PrecisionLike = None,
                 lowering: ForwardLowering = "auto", **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self.precision, self.lowering = precision, lowering

    signature = inspect.signature(base.__init__)
    extra = [inspect.Parameter("precision", inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation="PrecisionLike"),
             inspect.Parameter("lowering", inspect.Parameter.KEYWORD_ONLY, default="auto",
                               annotation="ForwardLowering")]
    __init__.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *extra])
    __init__.__doc__ = f"The arguments of ``eqx.nn.{base.__name__}``, and ``precision`` and ``lowering``."
    cls = type(name, (_JaxconvConv, base), {"__doc__": doc, "__module__": __name__,
                                            "__qualname__": name, "__init__": __init__})
    return typing.cast(type[eqx.nn.Conv], cls)


Conv = _equinox_conv(eqx.nn.Conv, "Conv", None)
Conv1d = _equinox_conv(eqx.nn.Conv1d, "Conv1d", 1)
Conv2d = _equinox_conv(eqx.nn.Conv2d, "Conv2d", 2)
Conv3d = _equinox_conv(eqx.nn.Conv3d, "Conv3d", 3)


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


