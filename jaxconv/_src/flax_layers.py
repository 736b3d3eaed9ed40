"""flax.nnx layers whose gradients are jaxconv's kernels (``pip install jaxconv[flax]``).

* :class:`Conv`: ``flax.nnx.Conv`` itself (same arguments, parameters, initialisers and
  value), with :func:`jaxconv.conv_general_dilated` as its convolution: a model switches
  by replacing ``nnx.Conv`` with ``jaxconv.flax.Conv``.
* :class:`ConvTranspose`: PyTorch's ``ConvTranspose{1,2,3}d`` semantics (``padding``,
  ``output_padding``, ``groups``, ``dilation``; the weight in PyTorch's layout
  ``(in_features, out_features // groups, *K)``, so a torch weight loads as it is).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxconv._src.lax_conv import conv_general_dilated
from jaxconv._src.torch_conv_transpose import conv_transpose_torch, per_axis
from jaxconv._src.typing import DataFormat, PrecisionLike


class Conv(nnx.Conv):
    """``flax.nnx.Conv`` with jaxconv's gradients: the same arguments and parameters.

    Example:
      >>> import jax, jaxconv.flax
      >>> from flax import nnx
      >>> layer = jaxconv.flax.Conv(4, 8, (3, 3), strides=2, feature_group_count=2,
      ...                           rngs=nnx.Rngs(0))
      >>> layer(jax.numpy.ones((1, 16, 16, 4))).shape
      (1, 8, 8, 8)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("conv_general_dilated", conv_general_dilated)
        super().__init__(*args, **kwargs)


def _nnx_conv_signature(bound: bool) -> inspect.Signature:
    """nnx.Conv.__init__'s signature with jaxconv's default convolution (without ``self`` when
    ``bound``): what IDEs and ``inspect.signature`` show for :class:`Conv`."""
    params = [q.replace(default=conv_general_dilated) if q.name == "conv_general_dilated" else q
              for q in inspect.signature(nnx.Conv.__init__).parameters.values()]
    return inspect.Signature(params[1:] if bound else params)


# nnx's metaclass __call__ hides __init__'s parameters from inspect.signature(Conv): set both
Conv.__init__.__signature__ = _nnx_conv_signature(bound=False)  # type: ignore[attr-defined]
Conv.__signature__ = _nnx_conv_signature(bound=True)  # type: ignore[attr-defined]


class ConvTranspose(nnx.Module):
    """A transposed convolution with PyTorch's semantics and weight layout.

    Args:
      in_features: input channels.
      out_features: output channels.
      kernel_size: one int per spatial axis (1 to 3 axes; an int is one axis, as in
        ``nnx.Conv``).
      strides: stride(s); default 1.
      padding: PyTorch's ``padding`` (removed at both ends); default 0.
      output_padding: extra elements at the end, each smaller than the stride.
      groups: channel groups.
      dilation: kernel dilation.
      use_bias: add a bias of ``out_features``.
      data_format: ``"NXC"`` (channels last, flax's default) or ``"NCX"`` (PyTorch's).
      kernel_init: initialiser of the weight ``(in_features, out_features // groups, *K)``;
        default PyTorch's (uniform in +-1/sqrt(fan_in), fan_in = out_features/groups * prod(K)).
      bias_init: initialiser of the bias; default the same uniform.
      precision: as in :func:`jaxconv.conv_transpose`.
      rngs: ``nnx.Rngs``.

    Example:
      >>> import jax, jaxconv.flax
      >>> from flax import nnx
      >>> up = jaxconv.flax.ConvTranspose(8, 4, (3, 3), strides=2, padding=1, output_padding=1,
      ...                                 rngs=nnx.Rngs(0))
      >>> up(jax.numpy.ones((1, 5, 5, 8))).shape
      (1, 10, 10, 4)
    """

    def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
                 *, strides: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                 output_padding: int | Sequence[int] = 0, groups: int = 1,
                 dilation: int | Sequence[int] = 1, use_bias: bool = True,
                 data_format: DataFormat = "NXC", kernel_init: Any = None, bias_init: Any = None,
                 param_dtype: Any = jnp.float32, precision: PrecisionLike = None,
                 rngs: nnx.Rngs) -> None:
        kernel = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
        n = len(kernel)
        self.kernel_size = kernel
        self.strides = per_axis("ConvTranspose", "strides", strides, n, minimum=1)
        self.padding = per_axis("ConvTranspose", "padding", padding, n, minimum=0)
        self.output_padding = per_axis("ConvTranspose", "output_padding", output_padding, n, minimum=0)
        self.dilation = per_axis("ConvTranspose", "dilation", dilation, n, minimum=1)
        self.groups, self.data_format, self.precision = groups, data_format, precision
        bound = 1.0 / math.sqrt(out_features // groups * math.prod(kernel))
        uniform = jax.nn.initializers.uniform(2 * bound)

        def torch_like(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
            return uniform(key, shape, dtype) - bound

        shape = (in_features, out_features // groups, *kernel)
        self.kernel = nnx.Param((kernel_init or torch_like)(rngs.params(), shape, param_dtype))
        self.bias = nnx.Param((bias_init or torch_like)(rngs.params(), (out_features,),
                                                        param_dtype)) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = conv_transpose_torch(
            x, self.kernel[...], stride=self.strides, padding=self.padding,
            output_padding=self.output_padding, dilation=self.dilation, groups=self.groups,
            data_format=self.data_format, precision=self.precision)
        if self.bias is not None:
            n = len(self.kernel_size)
            shape = (1,) * (n + 1) + (-1,) if self.data_format.upper() == "NXC" else (
                (1, -1) + (1,) * n)
            y = y + self.bias[...].reshape(shape)
        return y
