"""Equinox layers whose gradients are jaxconv's kernels (``pip install jaxconv[equinox]``).

Equinox conventions: ``eqx.Module``s called on one unbatched example ``(C, *spatial)``
(``jax.vmap`` them over a batch), initialised from a ``key``.

* :class:`Conv`: the arguments, parameters (weight ``(out, in // groups, *K)``, bias
  ``(out, 1, ..., 1)``) and initialisation of ``eqx.nn.Conv``, computed by
  :func:`jaxconv.conv_general_dilated`.
* :class:`Conv1d`, :class:`Conv2d`, :class:`Conv3d`: the same for ``eqx.nn.Conv{1,2,3}d``.
* :class:`ConvTranspose` (and ``1d``/``2d``/``3d``): the arguments, fields, padding rules and
  checks of ``eqx.nn.ConvTranspose``, with PyTorch's weight layout ``(in, out // groups, *K)``
  and initialisation (a torch weight loads as it is; ``eqx.nn.ConvTranspose`` stores the
  flipped ``(out, in // groups, *K)`` instead), computed by :func:`jaxconv.conv_transpose`.
"""

from __future__ import annotations

import inspect
import math
import typing
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from jaxconv._src.conv_transpose import conv_transpose
from jaxconv._src.geometry import dilated_kernel_size
from jaxconv._src.lax_conv import conv_general_dilated
from jaxconv._src.typing import DataGradLowering, ForwardLowering, PrecisionLike


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


def _with_keywords(init: Any, signature: inspect.Signature, base: str, lowering: str) -> None:
    """Gives ``init`` the signature of the equinox class ``base`` plus keyword-only
    ``precision`` and ``lowering`` (annotated ``lowering``): what IDEs and
    ``inspect.signature`` show."""
    extra = [inspect.Parameter("precision", inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation="PrecisionLike"),
             inspect.Parameter("lowering", inspect.Parameter.KEYWORD_ONLY, default="auto",
                               annotation=lowering)]
    init.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *extra])
    init.__doc__ = f"The arguments of ``eqx.nn.{base}``, and ``precision`` and ``lowering``."


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

    _with_keywords(__init__, inspect.signature(base.__init__), base.__name__, "ForwardLowering")
    cls = type(name, (_JaxconvConv, base), {"__doc__": doc, "__module__": __name__,
                                            "__qualname__": name, "__init__": __init__})
    return typing.cast(type[eqx.nn.Conv], cls)


Conv = _equinox_conv(eqx.nn.Conv, "Conv", None)
Conv1d = _equinox_conv(eqx.nn.Conv1d, "Conv1d", 1)
Conv2d = _equinox_conv(eqx.nn.Conv2d, "Conv2d", 2)
Conv3d = _equinox_conv(eqx.nn.Conv3d, "Conv3d", 3)


class _JaxconvConvTranspose(eqx.Module):
    """What the ConvTranspose classes change in equinox's: PyTorch's weight layout and
    initialisation, jaxconv's transposed convolution in ``__call__``, and ``precision`` and
    ``lowering`` (keyword-only arguments, static fields)."""

    precision: PrecisionLike = eqx.field(static=True, default=None, kw_only=True)
    lowering: DataGradLowering = eqx.field(static=True, default="auto", kw_only=True)

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """``x``: one example ``(in_channels, *spatial)``; returns ``(out_channels, *out)``.

        Equinox's padding (its ``padding``, ``output_padding`` and ``padding_mode``, resolved
        by its own ``_padding_transpose``) with PyTorch's weight ``(in, out // groups, *K)``:
        :func:`jaxconv.conv_transpose` with IOX weights.
        """
        layer = typing.cast(eqx.nn.ConvTranspose, self)
        unbatched_rank = layer.num_spatial_dims + 1
        if x.ndim != unbatched_rank:
            raise ValueError(
                f"Input to `ConvTranspose` needs to have rank {unbatched_rank},",
                f" but input has shape {x.shape}.",
            )
        padding_t = layer._padding_transpose()
        if layer.padding_mode == "CIRCULAR":
            x, padding_t = layer._circular_pad(x, padding_t)
        # equinox computes conv(x dilated by S, pads padding_t): the ConvTranspose whose
        # pads_begin is DK - 1 - p0t and whose end is DK - 1 - p1t (= pads_end - output_padding)
        dk = [dilated_kernel_size(k, d) for k, d in zip(layer.kernel_size, layer.dilation)]
        begin = [k - 1 - p0 for k, (p0, _) in zip(dk, padding_t)]
        end = [k - 1 - p1 for k, (_, p1) in zip(dk, padding_t)]
        # lax's output size (a zero-size input dilates to size 0; never negative)
        sizes = [max(0, max(0, (i - 1) * s + 1) + p0 + p1 - k + 1) for i, s, k, (p0, p1) in
                 zip(x.shape[1:], layer.stride, dk, padding_t)]
        if 0 in x.shape[1:] or 0 in sizes:  # lax's empty cases: zeros of lax's shape
            y = jnp.zeros((layer.out_channels, *sizes), x.dtype)
        else:
            y = conv_transpose(
                x[None], layer.weight, strides=layer.stride, pads_begin=begin,
                pads_end=[max(e, 0) for e in end], output_padding=[max(-e, 0) for e in end],
                dilations=layer.dilation, groups=layer.groups, data_format="NCX",
                filter_format="IOX", precision=self.precision, lowering=self.lowering)[0]
        return y + typing.cast(jax.Array, layer.bias) if layer.use_bias else y


def _equinox_conv_transpose(base: type[eqx.nn.ConvTranspose], name: str,
                            rank: int | None) -> type[eqx.nn.ConvTranspose]:
    """``base`` (an ``eqx.nn`` ConvTranspose class) computed by jaxconv, with PyTorch's weight."""
    dims = "N" if rank is None else f"{rank}"
    doc = f"""``eqx.nn.{base.__name__}``'s arguments with PyTorch's weight layout.

    The arguments (by name and position), fields, defaults, padding rules (``padding`` as
    equinox reads it: ints, pairs, ``'VALID'``, ``'SAME'``, ``'SAME_LOWER'``; ``padding_mode``
    ``'ZEROS'`` or ``'CIRCULAR'``), construction checks and messages are
    ``eqx.nn.{base.__name__}``'s own (this class derives from it). The weight is PyTorch's
    ``ConvTranspose{dims}d`` weight ``(in_channels, out_channels // groups, *K)``, initialised
    as PyTorch does (uniform in +-1/sqrt(out_channels / groups * prod(K))), so a torch weight
    loads as it is; ``eqx.nn.{base.__name__}`` stores the flipped forward-convolution weight
    ``(out_channels, in_channels // groups, *K)`` instead. The transposed convolution is
    :func:`jaxconv.conv_transpose`. Two keyword-only additions: ``precision`` (as in lax) and
    ``lowering`` (its formulation, as in :func:`jaxconv.conv_transpose`).
    """

    def __init__(self: Any, *args: Any, precision: PrecisionLike = None,
                 lowering: DataGradLowering = "auto", **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        key = signature.bind(self, *args, **kwargs).arguments["key"]
        wkey, bkey = jax.random.split(key, 2)
        layer = typing.cast(eqx.nn.ConvTranspose, self)
        groups, kernel = layer.groups, layer.kernel_size
        lim = 1.0 / math.sqrt(layer.out_channels // groups * math.prod(kernel))
        dtype = layer.weight.dtype
        shape = (layer.in_channels, layer.out_channels // groups, *kernel)
        self.weight = jax.random.uniform(wkey, shape, dtype, -lim, lim)
        if layer.use_bias:
            self.bias = jax.random.uniform(bkey, (layer.out_channels,) + (1,) * len(kernel),
                                           dtype, -lim, lim)
        self.precision, self.lowering = precision, lowering

    signature = inspect.signature(base.__init__)
    _with_keywords(__init__, signature, base.__name__, "DataGradLowering")
    cls = type(name, (_JaxconvConvTranspose, base), {"__doc__": doc, "__module__": __name__,
                                                     "__qualname__": name, "__init__": __init__})
    return typing.cast(type[eqx.nn.ConvTranspose], cls)


ConvTranspose = _equinox_conv_transpose(eqx.nn.ConvTranspose, "ConvTranspose", None)
ConvTranspose1d = _equinox_conv_transpose(eqx.nn.ConvTranspose1d, "ConvTranspose1d", 1)
ConvTranspose2d = _equinox_conv_transpose(eqx.nn.ConvTranspose2d, "ConvTranspose2d", 2)
ConvTranspose3d = _equinox_conv_transpose(eqx.nn.ConvTranspose3d, "ConvTranspose3d", 3)
