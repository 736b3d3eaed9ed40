"""Ascend layouts: NCHW <-> 5HD and OIHW <-> FRACTAL_Z (with groups).

5HD ("NC1HWC0"), C0 = 16, channels zero-padded to a multiple of C0::

    x5[n, c1, h, w, c0] = x[n, c1 * C0 + c0, h, w]

      NCHW, C = 20                        5HD, C1 = 2
      c: 0 1 .. 15 | 16 .. 19             c1 = 0: c0 = 0..15 <- c 0..15
                                          c1 = 1: c0 = 0..3  <- c 16..19, c0 = 4..15 <- 0

FRACTAL_Z of a weight (Cout, Cin/g, KH, KW), groups = 1::

    res[0, (c1 * KH + kh) * KW + kw, co, c0] = w[co, c1 * 16 + c0, kh, kw]
    shape (1, C1 * KH * KW, ceil(Cout / 16) * 16, 16), zeros where co or c1*16+c0 is padding

Groups use the DSL's "enlarge" packing (``_compute_group_dict``): ``mag``
groups share one enlarged group, laid out block-diagonally::

    mag0 = lcm(Cin_g, 16) / Cin_g      mag1 = lcm(Cout_g, 16) / Cout_g
    mag = min(lcm(mag0, mag1), groups)  real_g = ceil(groups / mag)
    cin1_g = ceil(mag * Cin_g / 16)     cout_g = ceil(mag * Cout_g / 16) * 16

    group g -> enlarged group g // mag, slot j = g % mag:
    res[g // mag, (ci_e // 16 * KH + kh) * KW + kw, j * Cout_g + co, ci_e % 16]
        = w[g * Cout_g + co, ci, kh, kw],  ci_e = j * Cin_g + ci

    enlarged group r:          input channels ->
                      slot 0 (Cin_g) | slot 1 (Cin_g) | ...
      output  slot 0  |  w of g=r*mag  |       0        |
      channels slot 1 |       0        | w of g=r*mag+1 |

The cross-group blocks are zeros (the DSL's dense multiply would put products
of one group's input with another group's gradient there; docs/semantics.md,
"Other decisions"). The maps are static index arrays, so both directions are gathers:
exact inverses on valid data, and jit/vmap/grad friendly.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src.tbe_geometry import C0, tbe_filter_sizes


def _check_c0(op: str, c0: Any) -> int:
    if not isinstance(c0, int) or isinstance(c0, bool) or c0 <= 0:
        raise ValueError(f"{op}: c0 must be a positive int, got {c0!r}")
    return c0


def _array(op: str, name: str, value: Any, rank: int) -> jax.Array:
    if not isinstance(value, (jax.Array, np.ndarray)):
        raise TypeError(f"{op}: {name} must be a jax.Array or numpy.ndarray, got "
                        f"{type(value).__name__}")
    if value.ndim != rank:
        raise ValueError(f"{op}: {name} must have rank {rank}, got shape {list(value.shape)}")
    return jnp.asarray(value)


def to_5hd(x_nchw: Any, c0: int = C0) -> jax.Array:
    """NCHW -> 5HD ``(N, C1, H, W, C0)``, channels zero-padded to a multiple of ``c0``.

    Args:
      x_nchw: ``(N, C, H, W)``.
      c0: the channel block, 16 on Ascend.

    Returns:
      ``x5`` with ``x5[n, c1, h, w, c0] = x[n, c1 * C0 + c0, h, w]``.

    Raises:
      ValueError: wrong rank or ``c0``.
      TypeError: not an array.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxconv import tbe
      >>> tbe.to_5hd(jnp.ones((2, 20, 3, 3))).shape
      (2, 2, 3, 3, 16)
    """
    op = "to_5hd"
    c0 = _check_c0(op, c0)
    x = _array(op, "x_nchw", x_nchw, 4)
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    x = jnp.pad(x, ((0, 0), (0, c1 * c0 - c), (0, 0), (0, 0)))
    return x.reshape(n, c1, c0, h, w).transpose(0, 1, 3, 4, 2)


def from_5hd(x5: Any, channels: int) -> jax.Array:
    """5HD ``(N, C1, H, W, C0)`` -> NCHW with ``channels`` channels (padding dropped).

    Args:
      x5: a 5HD tensor.
      channels: the real channel count, ``<= C1 * C0``.

    Returns:
      ``(N, channels, H, W)``; whatever the padded channel slots hold is dropped.

    Raises:
      ValueError: wrong rank, or ``channels`` outside ``(C1 - 1) * C0 < channels <= C1 * C0``.
      TypeError: not an array.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxconv import tbe
      >>> x = jnp.arange(2 * 20 * 3 * 3.0).reshape(2, 20, 3, 3)
      >>> bool((tbe.from_5hd(tbe.to_5hd(x), 20) == x).all())
      True
    """
    op = "from_5hd"
    x = _array(op, "x5", x5, 5)
    n, c1, h, w, c0 = x.shape
    if not isinstance(channels, int) or not (c1 - 1) * c0 < channels <= c1 * c0:
        raise ValueError(
            f"{op}: channels must satisfy (C1 - 1) * C0 < channels <= C1 * C0 = "
            f"{c1 * c0} for C1={c1}, C0={c0}, got {channels!r}")
    return x.transpose(0, 1, 4, 2, 3).reshape(n, c1 * c0, h, w)[:, :channels]


def fractal_z_groups(cin_g: int, cout_g: int, groups: int) -> tuple[int, int, int, int]:
    """The DSL's enlarge packing: (mag, real_g, cin1_g, cout_g padded)."""
    mag0 = math.lcm(cin_g, C0) // cin_g
    mag1 = math.lcm(cout_g, C0) // cout_g
    mag = min(math.lcm(mag0, mag1), groups)
    return mag, -(-groups // mag), -(-(mag * cin_g) // C0), -(-(mag * cout_g) // C0) * C0


def fractal_z_shape(filter_sizes: tuple[int, int, int, int], groups: int = 1) -> tuple[int, ...]:
    r"""The FRACTAL_Z shape of a ``(Cout, Cin/g, KH, KW)`` weight (groups: the enlarge packing).

    .. math::
        (real\_g,\ cin1\_g \cdot KH \cdot KW,\ cout\_g,\ 16)

    with ``mag = min(lcm(lcm(Cin_g,16)/Cin_g, lcm(Cout_g,16)/Cout_g), groups)``,
    ``real_g = ceil(groups/mag)``, ``cin1_g = ceil(mag*Cin_g/16)``,
    ``cout_g = ceil(mag*Cout_g/16)*16``; for ``groups=1``: ``(1, C1*KH*KW,
    ceil(Cout/16)*16, 16)``.

    Args:
      filter_sizes: ``(Cout, Cin/groups, KH, KW)`` (the OIHW weight shape).
      groups: the convolution's groups (default 1).

    Returns:
      The 4-tuple shape of the FRACTAL_Z tensor.

    Raises:
      ValueError: Cout not divisible by groups (from the packing).

    Example:
      >>> from jaxconv import tbe
      >>> tbe.fractal_z_shape((32, 20, 3, 3))
      (1, 18, 32, 16)
      >>> tbe.fractal_z_shape((32, 5, 3, 3), groups=4)
      (1, 18, 32, 16)
    """
    cout, cin_g, kh, kw = filter_sizes
    _, real_g, cin1_g, cout_pad = fractal_z_groups(cin_g, cout // groups, groups)
    return (real_g, cin1_g * kh * kw, cout_pad, C0)


@functools.lru_cache(maxsize=256)
def _fractal_z_index(filter_sizes: tuple[int, int, int, int], groups: int) -> np.ndarray:
    """For each FRACTAL_Z position (flat), the flat OIHW index it holds, or -1 for zero."""
    cout, cin_g, kh, kw = filter_sizes
    cout_g = cout // groups
    mag, _, _, _ = fractal_z_groups(cin_g, cout_g, groups)
    shape = fractal_z_shape(filter_sizes, groups)
    index = np.full(shape, -1, np.int64)
    g, co, ci, h, w = np.meshgrid(np.arange(groups), np.arange(cout_g), np.arange(cin_g),
                                  np.arange(kh), np.arange(kw), indexing="ij")
    j = g % mag
    ci_e = j * cin_g + ci
    src = np.ravel_multi_index((g * cout_g + co, ci, h, w), filter_sizes)
    index[g // mag, (ci_e // C0 * kh + h) * kw + w, j * cout_g + co, ci_e % C0] = src
    return index


def to_fractal_z(w_oihw: Any, groups: int = 1) -> jax.Array:
    """OIHW weight ``(Cout, Cin/groups, KH, KW)`` -> FRACTAL_Z (see the module docstring).

    Args:
      w_oihw: the weight (or weight gradient).
      groups: its groups; > 1 uses the DSL's enlarge packing.

    Returns:
      ``(real_g, cin1_g * KH * KW, cout_g, 16)``; ``(1, C1*KH*KW, ceil(Cout/16)*16, 16)``
      for ``groups=1``.

    Raises:
      ValueError: wrong rank, Cout not divisible by groups.
      TypeError: not an array, groups not an int.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxconv import tbe
      >>> tbe.to_fractal_z(jnp.ones((20, 3, 2, 2))).shape
      (1, 4, 32, 16)
    """
    op = "to_fractal_z"
    w = _array(op, "w_oihw", w_oihw, 4)
    sizes, g = tbe_filter_sizes(op, tuple(w.shape), groups)
    index = _fractal_z_index(sizes, g)
    flat = jnp.take(w.reshape(-1), np.maximum(index, 0).reshape(-1), axis=0)
    flat = jnp.where(jnp.asarray(index.reshape(-1) >= 0), flat, jnp.zeros((), w.dtype))
    return flat.reshape(index.shape)


def from_fractal_z(wz: Any, filter_sizes: Any, groups: int = 1) -> jax.Array:
    """FRACTAL_Z -> OIHW ``(Cout, Cin/groups, KH, KW)``: the inverse of :func:`to_fractal_z`.

    Args:
      wz: a FRACTAL_Z tensor of shape ``fractal_z_shape(filter_sizes, groups)``.
      filter_sizes: ``(Cout, Cin/groups, KH, KW)``.
      groups: the groups it was packed with.

    Returns:
      The OIHW weight; padding and cross-group blocks are dropped.

    Raises:
      ValueError: a shape that does not match ``filter_sizes`` and ``groups``.
      TypeError: not an array, a traced ``filter_sizes``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxconv import tbe
      >>> w = jnp.arange(20 * 3 * 2 * 2.0).reshape(20, 3, 2, 2)
      >>> bool((tbe.from_fractal_z(tbe.to_fractal_z(w), (20, 3, 2, 2)) == w).all())
      True
    """
    op = "from_fractal_z"
    wz = _array(op, "wz", wz, 4)
    sizes, g = tbe_filter_sizes(op, filter_sizes, groups)
    index = _fractal_z_index(sizes, g)
    if tuple(wz.shape) != index.shape:
        raise ValueError(f"{op}: wz must have the FRACTAL_Z shape {list(index.shape)} of "
                         f"filter_sizes {list(sizes)} with groups {g}, got {list(wz.shape)}")
    inverse = np.empty(math.prod(sizes), np.int64)
    valid = index.reshape(-1) >= 0
    inverse[index.reshape(-1)[valid]] = np.nonzero(valid)[0]
    return jnp.take(wz.reshape(-1), inverse, axis=0).reshape(sizes)
