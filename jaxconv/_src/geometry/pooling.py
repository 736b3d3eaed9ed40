"""The geometry of a max pool: its windows, strides, padding and output sizes, validated.

``pool_problem`` is the problem builder of :func:`jaxconv.max_pool`, as
``convolution_problem`` is the convolutions': it checks every argument before
anything is computed and returns a frozen :class:`PoolProblem` that the kernels
in ``pooling.py`` only read. Padding follows ``lax.reduce_window`` (and so
``flax.linen.max_pool``): ``"VALID"``, ``"SAME"`` (the extra element of an odd
total at the end: auto_pad ``same_upper`` of a convolution with the window as
its kernel) or explicit ``(low, high)`` pairs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxconv._src.geometry.arguments import check_array, check_same_dtype, int_tuple, is_int, kind
from jaxconv._src.geometry.layouts import DataLayout, data_layout
from jaxconv._src.geometry.padding import PadRule, auto_pads, conv_output_size


@dataclasses.dataclass(frozen=True)
class PoolProblem:
    """A resolved max pool: ``window`` taps per spatial axis every ``strides`` rows of the input
    padded by ``pads`` (low, high), ``output_size`` windows per axis, in ``data``'s layout."""

    data: DataLayout
    input_size: tuple[int, ...]
    window: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    output_size: tuple[int, ...]

    @property
    def padded_size(self) -> tuple[int, ...]:
        return tuple(i + lo + hi for i, (lo, hi) in zip(self.input_size, self.pads))

    @property
    def taps(self) -> int:
        """The taps of one window (the number ``argmax`` counts up to)."""
        return math.prod(self.window)

    @property
    def argmax_dtype(self) -> Any:
        """The dtype of each window's argmax (a tap's index): int8 up to 127 taps, else int32."""
        return jnp.dtype(jnp.int8 if self.taps <= 127 else jnp.int32)

    def offsets(self) -> Iterator[tuple[int, ...]]:
        """Each tap's offset in its window, in row-major order (the order ties are broken in:
        the first maximum wins, as in XLA's and PyTorch's max pool gradients)."""
        return itertools.product(*(range(k) for k in self.window))

    def shape(self, like: Sequence[int], spatial: Sequence[int]) -> tuple[int, ...]:
        """``like`` (a data shape) with its spatial sizes replaced by ``spatial``."""
        out = list(like)
        for axis, size in zip(self.data.spatial_axes, spatial):
            out[axis] = size
        return tuple(out)


def _padding(op: str, padding: Any, n: int, sizes: Sequence[int], window: Sequence[int],
             strides: Sequence[int]) -> tuple[tuple[int, int], ...]:
    if isinstance(padding, str):
        mode = padding.upper()
        if mode not in ("VALID", "SAME"):
            raise ValueError(f"{op}: padding must be 'VALID', 'SAME' or a sequence of (low, high) "
                             f"pairs, got {padding!r}")
        begins, ends = auto_pads("valid" if mode == "VALID" else "same_upper", PadRule.CONV,
                                 sizes, window, strides, (1,) * n, (0,) * n, (0,) * n)
        return tuple(zip(begins, ends))
    if not isinstance(padding, (tuple, list)):
        raise TypeError(f"{op}: padding must be a string or a sequence of (low, high) pairs, "
                        f"got {kind(padding)}")
    if len(padding) != n:
        raise ValueError(f"{op}: padding must have {n} (low, high) pair(s), one per spatial "
                         f"axis, got {len(padding)}: {list(padding)}")
    pairs = []
    for pair in padding:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(map(is_int, pair))):
            raise TypeError(f"{op}: padding must hold (low, high) pairs of ints, got {pair!r}")
        if min(pair) < 0:
            raise ValueError(f"{op}: padding must be >= 0, got {list(padding)}")
        pairs.append((int(pair[0]), int(pair[1])))
    return tuple(pairs)


def pool_problem(op: str, inputs: Any, window_shape: Any, strides: Any, padding: Any,
                 data_format: Any) -> tuple[jax.Array, PoolProblem]:
    """``inputs`` as an array and its :class:`PoolProblem`; every argument checked first."""
    x = check_array(op, "inputs", inputs)
    check_same_dtype(op, {"inputs": x})
    return x, pool_of_shape(op, tuple(x.shape), window_shape, strides, padding, data_format)


def pool_of_shape(op: str, shape: tuple[int, ...], window_shape: Any, strides: Any,
                  padding: Any, data_format: Any) -> PoolProblem:
    """The :class:`PoolProblem` of inputs of ``shape`` (:func:`pool_problem` without an
    array: ``accelerate`` asks of a traced equation's operand)."""
    if len(shape) < 3:
        raise ValueError(f"{op}: inputs must have rank >= 3 (batch, spatial axes, channels), "
                         f"got rank {len(shape)} (shape {tuple(shape)})")
    n = len(shape) - 2
    data = data_layout(op, "data_format", data_format, n)
    if window_shape is None:
        raise TypeError(f"{op}: window_shape must be an int or a sequence of ints, got None")
    window = int_tuple(op, "window_shape", window_shape, n, default=1, minimum=1)
    steps = int_tuple(op, "strides", strides, n, default=1, minimum=1)
    sizes = tuple(int(shape[a]) for a in data.spatial_axes)
    pads = _padding(op, padding, n, sizes, window, steps)
    out = tuple(conv_output_size(i, k, s, 1, lo, hi)
                for i, k, s, (lo, hi) in zip(sizes, window, steps, pads))
    if min(out) < 1:
        raise ValueError(f"{op}: the padded input must hold at least one window on every spatial "
                         f"axis: input {list(sizes)}, padding {[list(p) for p in pads]}, "
                         f"window_shape {list(window)}")
    return PoolProblem(data, sizes, window, steps, pads, out)


def window_why(params: dict[str, Any], x: Any) -> str | None:
    """Why a ``reduce_window``-family equation over ``x`` is no window jaxconv computes: not
    floating, or dilated; else None."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return "dtype"
    ones = (1,) * x.ndim
    if (tuple(params.get("base_dilation", ones)) != ones
            or tuple(params.get("window_dilation", ones)) != ones):
        return "pool dilation"
    return None


def window_problem(params: dict[str, Any], x: Any) -> PoolProblem | str:
    """The max pool a ``reduce_window``-family equation (its ``params``) over ``x`` (an array or
    its type) computes, or why none: a key of ``accelerate/rewrites/base.py``'s ``REASONS``."""
    why = window_why(params, x)
    if why is not None:
        return why
    if x.ndim < 3:
        return "not 1 to 3 spatial axes"
    window, strides = params["window_dimensions"], params["window_strides"]
    padding = [tuple(p) for p in params["padding"]]
    moved = {a for a in range(x.ndim)
             if window[a] != 1 or strides[a] != 1 or padding[a] != (0, 0)}
    if not moved & {0, x.ndim - 1}:
        layout, spatial = "NXC", range(1, x.ndim - 1)
    elif not moved & {0, 1}:
        layout, spatial = "NCX", range(2, x.ndim)
    else:
        return "pool axes"
    try:
        p = pool_of_shape("accelerate", tuple(x.shape), tuple(window[a] for a in spatial),
                          tuple(strides[a] for a in spatial),
                          tuple(padding[a] for a in spatial), layout)
    except (TypeError, ValueError):
        return "pool padding"
    return p
