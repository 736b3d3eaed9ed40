"""User overrides of the lowering choice."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from jaxconv._src import lowering

_WEIGHT_GRAD = contextvars.ContextVar("jaxconv_weight_grad_lowering", default="auto")
_DATA_GRAD = contextvars.ContextVar("jaxconv_data_grad_lowering", default="auto")


@contextlib.contextmanager
def _override(name: str, var: contextvars.ContextVar, methods, method: str) -> Iterator[None]:
    if method not in ("auto", *methods):
        raise ValueError(f"{name}: method must be one of {['auto', *methods]}, got {method!r}")
    token = var.set(method)
    try:
        yield
    finally:
        var.reset(token)


@contextlib.contextmanager
def weight_grad_lowering(method: str) -> Iterator[None]:
    """Forces the weight-gradient formulation of the ops called inside the block.

    The ops pick one per problem by default (``"auto"``; see
    ``docs/performance.md``). The choice is made when an op is traced, so it
    is baked into a ``jax.jit`` function traced inside the block.

    Args:
      method: ``"auto"``, ``"conv"`` (one convolution with batch_group_count),
        ``"feature_group"`` (groups moved next to the batch),
        ``"shifted"`` (one multiply-reduce per kernel tap; needs one input
        channel per group) or ``"dot"`` (one dot_general per kernel tap, or
        one outer product when every output extent is 1).

    Returns:
      A context manager; the override holds inside its ``with`` block.

    Raises:
      ValueError: an unknown method (at entry), or a method that does not apply
        to a problem (when that op is called).

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> x = jnp.ones((2, 8, 8, 4)); dy = jnp.ones((2, 8, 8, 4))
      >>> with jaxconv.weight_grad_lowering("conv"):
      ...     dw = jaxconv.convolution_backprop_filters(x, dy, (1, 1, 4, 4))
      >>> float(dw[0, 0, 0, 0])
      128.0
    """
    with _override("weight_grad_lowering", _WEIGHT_GRAD, lowering.WEIGHT_GRAD_METHODS, method):
        yield


@contextlib.contextmanager
def data_grad_lowering(method: str) -> Iterator[None]:
    """Forces the data-gradient formulation (also the ConvTranspose / backprop-data forward).

    Args:
      method: ``"auto"``, ``"grid"`` (dy spread on a grid of step S by an
        explicit pad, one stride-1 convolution) or ``"phases"`` (one stride-1
        convolution per output phase with the sub-kernel of taps reaching it,
        interleaved; no zero grid).

    Returns:
      A context manager; the override holds inside its ``with`` block.

    Raises:
      ValueError: an unknown method.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> dy = jnp.ones((1, 4, 4, 2)); w = jnp.ones((3, 3, 2, 2))
      >>> with jaxconv.data_grad_lowering("grid"):
      ...     dx = jaxconv.convolution_backward_data(dy, w, (8, 8), strides=2, pads_begin=1)
      >>> dx.shape
      (1, 8, 8, 2)
    """
    with _override("data_grad_lowering", _DATA_GRAD, lowering.DATA_GRAD_METHODS, method):
        yield


def data_grad_method() -> str:
    return _DATA_GRAD.get()


def weight_grad_method(op: str, p) -> str:
    """The method in force for problem ``p``, checked to apply to it."""
    method = _WEIGHT_GRAD.get()
    if method == "shifted" and p.in_channels != p.groups:
        raise ValueError(f"{op}: weight_grad_lowering 'shifted' needs one input channel per "
                         f"group, got {p.in_channels} channels in {p.groups} groups")
    return method


def xla_cpu_compiler_options() -> dict[str, str]:
    """XLA:CPU compiler options that speed up large-kernel convolutions (jaxlib 0.10).

    An op cannot set compiler options for the ``jax.jit`` it is traced in, so
    they are offered to the caller: ``jax.jit(step, compiler_options=
    jaxconv.xla_cpu_compiler_options())``. They select XLA:CPU's
    individual-dot convolution library, measured 3-5x faster on 7x7 and 11x11
    weight gradients and slower on depthwise ones (``docs/performance.md``).
    The option is experimental in XLA: a jaxlib that does not know it rejects
    it at compile time.

    Returns:
      A dict for the ``compiler_options`` argument of ``jax.jit`` (CPU only).

    Example:
      >>> import jaxconv
      >>> jaxconv.xla_cpu_compiler_options()
      {'xla_cpu_experimental_ynn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'}
    """
    return {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
