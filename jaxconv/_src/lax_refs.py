"""lax's convolution as it was when jaxconv was imported, and the forms jaxconv hands XLA.

A program can make third-party code use jaxconv by assigning
``jax.lax.conv_general_dilated = jaxconv.conv_general_dilated`` (docs/migration.md). jaxconv
itself calls lax's function (for the calls it hands to lax, in its XLA formulations, in its
checks and benchmarks' baselines): every such call goes through the reference held here,
taken at import, so that the assignment never sends jaxconv back into itself.

No negative pad reaches XLA from jaxconv. lax allows a negative pad (it crops), and XLA:CPU
(jaxlib 0.10.2) computes a convolution with one from the memory beside its input
(docs/semantics.md, "Negative pads"; openxla/xla#48713). :func:`conv` and :func:`pad`
compute the same values with the crop done by ``lax.slice`` first (the arithmetic:
``geometry.crop_of_pads``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxconv._src import geometry

#: ``jax.lax.conv_general_dilated`` as imported (never looked up again): the baselines' lax
conv_general_dilated = lax.conv_general_dilated


def _negative(pads: Sequence[Sequence[int]]) -> bool:
    return any(lo < 0 or hi < 0 for lo, hi, *_ in pads)


def pad(operand: jax.Array, padding_value: Any,
        padding_config: Sequence[Sequence[int]]) -> jax.Array:
    """``lax.pad`` with its negative widths done by ``lax.slice`` (module docstring)."""
    config = [(int(lo), int(hi), int(interior)) for lo, hi, interior in padding_config]
    if all(c == (0, 0, 0) for c in config):
        return operand
    sizes = [(n - 1) * (i + 1) + 1 + lo + hi if n else lo + hi
             for n, (lo, hi, i) in zip(operand.shape, config)]
    if not _negative(config) or min(sizes) < 0:  # nothing to crop, or lax's own error
        return lax.pad(operand, padding_value, config)
    starts, limits, kept = [], [], []
    for n, (lo, hi, interior) in zip(operand.shape, config):
        start, limit, lo2, hi2 = geometry.crop_of_pads(n, lo, hi, interior + 1)
        if limit == start:  # every element cropped: the result is the padding value
            return jnp.broadcast_to(jnp.asarray(padding_value, operand.dtype), sizes)
        starts.append(start)
        limits.append(limit)
        kept.append((lo2, hi2, interior))
    return pad(lax.slice(operand, starts, limits), padding_value, kept)


def crop_operands(lhs: jax.Array, params: dict[str, Any]) -> tuple[jax.Array, dict[str, Any]]:
    """A ``conv_general_dilated`` equation's lhs and params with its negative pads cropped
    from the lhs (module docstring): the same convolution with no negative pad. Where the
    crop leaves no element of an axis, every window reads padding only: the lhs is then one
    zero on that axis, padded to the same span."""
    pads = params["padding"]
    if isinstance(pads, str) or not _negative(pads):
        return lhs, params
    spatial = params["dimension_numbers"].lhs_spec[2:]
    dilation = params.get("lhs_dilation") or (1,) * len(spatial)
    starts, limits = [0] * lhs.ndim, list(lhs.shape)
    kept, empty = [], False
    for axis, (lo, hi), s in zip(spatial, pads, dilation):
        n = lhs.shape[axis]
        start, limit, lo2, hi2 = geometry.crop_of_pads(n, lo, hi, s)
        if limit == start:  # nothing left: one zero spanning the same (n - 1) s + 1 + lo + hi
            span = (n - 1) * s + 1 + lo + hi if n else lo + hi
            empty, start, limit, lo2, hi2 = True, 0, 1, 0, span - 1
        starts[axis], limits[axis] = start, limit
        kept.append((lo2, hi2))
    if empty or 0 in lhs.shape:  # no element is read: zeros of the cropped shape
        shape = [limit - start for start, limit in zip(starts, limits)]
        return jnp.zeros(shape, lhs.dtype), {**params, "padding": tuple(kept)}
    return lax.slice(lhs, starts, limits), {**params, "padding": tuple(kept)}


def conv(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding: Any,
         lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
         dimension_numbers: Any = None, **kwargs: Any) -> jax.Array:
    """``lax.conv_general_dilated`` (as imported) with its negative pads cropped from ``lhs``
    first (module docstring): the same value, and no negative pad reaches XLA."""
    if not isinstance(padding, str) and _negative(padding):
        dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
        lhs, params = crop_operands(lhs, {"padding": padding, "lhs_dilation": lhs_dilation,
                                          "dimension_numbers": dn})
        padding = params["padding"]
    return conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                dimension_numbers, **kwargs)
