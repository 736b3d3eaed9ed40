"""User overrides of the lowering choice."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from jaxconv._src import lowering

_WEIGHT_GRAD = contextvars.ContextVar("jaxconv_weight_grad_lowering", default="auto")


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
        channel per group) or ``"dot"`` (a dot_general; needs a 1x1 kernel).

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
    if method not in ("auto", *lowering.WEIGHT_GRAD_METHODS):
        raise ValueError(f"weight_grad_lowering: method must be one of "
                         f"{['auto', *lowering.WEIGHT_GRAD_METHODS]}, got {method!r}")
    token = _WEIGHT_GRAD.set(method)
    try:
        yield
    finally:
        _WEIGHT_GRAD.reset(token)


def weight_grad_method(op: str, p) -> str:
    """The method in force for problem ``p``, checked to apply to it."""
    method = _WEIGHT_GRAD.get()
    if method == "shifted" and p.in_channels != p.groups:
        raise ValueError(f"{op}: weight_grad_lowering 'shifted' needs one input channel per "
                         f"group, got {p.in_channels} channels in {p.groups} groups")
    if method == "dot" and any(k != 1 for k in p.kernel):
        raise ValueError(f"{op}: weight_grad_lowering 'dot' needs a 1x1 kernel, got "
                         f"{list(p.kernel)}")
    return method
