"""Argument checks shared by every op: arrays, dtypes, ranks, shapes, int attributes, groups.

Each check raises ``TypeError`` (wrong kind) or ``ValueError`` (wrong value)
with a message that starts with the op's name, names the argument and states
what was expected and what was given.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def kind(value: Any) -> str:
    """A short description of a value's kind for error messages."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_array(op: str, name: str, value: Any) -> jax.Array:
    """Returns ``value`` as a jax array, or raises ``TypeError``.

    Accepts ``jax.Array`` (traced or not) and ``numpy.ndarray``; rejects lists,
    scalars and other objects, since their rank is the first thing we check.
    """
    if isinstance(value, (jax.Array, np.ndarray)):
        dtype = np.dtype(value.dtype)
        if not (jnp.issubdtype(dtype, jnp.number) or dtype == np.bool_):
            raise TypeError(f"{op}: {name} must have a numeric dtype, got {dtype}")
        return jax.numpy.asarray(value)
    raise TypeError(f"{op}: {name} must be a jax.Array or numpy.ndarray, got {kind(value)}")


def check_same_dtype(op: str, arrays: dict[str, jax.Array], *, floating: bool = True) -> np.dtype:
    """Checks that the named arrays share one dtype (floating if asked); returns it."""
    dtypes = {name: np.dtype(a.dtype) for name, a in arrays.items()}
    names = list(dtypes)
    first = dtypes[names[0]]
    for name in names[1:]:
        if dtypes[name] != first:
            got = ", ".join(f"{n} {d}" for n, d in dtypes.items())
            raise TypeError(f"{op}: {', '.join(names)} must have the same dtype, got {got}")
    if first == np.bool_:
        raise TypeError(f"{op}: {names[0]} must have a numeric dtype, got bool")
    if floating and not jnp.issubdtype(first, jnp.inexact):
        raise TypeError(
            f"{op}: {names[0]} must have a floating dtype (float32, float16, bfloat16, "
            f"float64), got {first}"
        )
    if jnp.issubdtype(first, jnp.complexfloating):
        raise TypeError(f"{op}: {names[0]} must be real, got {first}")
    return first


def spatial_rank(op: str, name: str, array_rank: int, extra: int = 2) -> int:
    """Spatial rank from an array's rank (``extra`` non-spatial axes); 1, 2 or 3."""
    n = array_rank - extra
    if n not in (1, 2, 3):
        raise ValueError(
            f"{op}: {name} must have rank {extra + 1}, {extra + 2} or {extra + 3} "
            f"(1, 2 or 3 spatial axes), got rank {array_rank}"
        )
    return n


def static_shape(op: str, name: str, value: Any) -> tuple[int, ...]:
    """A shape-like argument as a tuple of Python ints.

    Takes a tuple/list of ints, a numpy integer array or a concrete jax array;
    a traced value raises ``TypeError`` telling the caller to pass it statically.
    """
    if value is None:
        raise TypeError(f"{op}: {name} is required (a tuple of ints), got None")
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{op}: {name} must be a static value (tuple of ints, numpy array or concrete "
            f"jax array), got a traced array {value.aval}; pass it as a Python tuple or close "
            f"over it instead of passing it through jit/vmap"
        )
    if isinstance(value, (jax.Array, np.ndarray)):
        arr = np.asarray(value)
        if arr.ndim != 1 or not jnp.issubdtype(arr.dtype, jnp.integer):
            raise TypeError(
                f"{op}: {name} must be a 1-D integer array, got shape {arr.shape} "
                f"and dtype {arr.dtype}"
            )
        return tuple(int(v) for v in arr)
    if isinstance(value, (tuple, list)):
        if not all(is_int(v) for v in value):
            raise TypeError(f"{op}: {name} must hold ints, got {value!r}")
        return tuple(int(v) for v in value)
    raise TypeError(f"{op}: {name} must be a tuple of ints, got {kind(value)}")


def int_tuple(
    op: str, name: str, value: Any, n: int, *, default: int, minimum: int
) -> tuple[int, ...]:
    """One int per spatial axis, ``>= minimum``; ``None`` gives ``default``.

    A single int is broadcast to every axis (as in ``lax`` and PyTorch).
    """
    if value is None:
        return (default,) * n
    if is_int(value):
        values = (int(value),) * n
    elif isinstance(value, (tuple, list, np.ndarray, jax.Array)) and not isinstance(
        value, jax.core.Tracer
    ):
        seq = list(np.asarray(value).tolist()) if not isinstance(value, (tuple, list)) else value
        if not all(is_int(v) for v in seq):
            raise TypeError(f"{op}: {name} must hold ints, got {value!r}")
        values = tuple(int(v) for v in seq)
        if len(values) != n:
            raise ValueError(
                f"{op}: {name} must have {n} value(s), one per spatial axis, got "
                f"{len(values)}: {list(values)}"
            )
    else:
        raise TypeError(f"{op}: {name} must be an int or a sequence of ints, got {kind(value)}")
    bad = [v for v in values if v < minimum]
    if bad:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{op}: {name} must be {what}, got {list(values)}")
    return values


def check_groups(op: str, groups: Any) -> int:
    """``groups`` as a positive int."""
    if not is_int(groups):
        raise TypeError(f"{op}: groups must be an int, got {kind(groups)}")
    if groups < 1:
        raise ValueError(f"{op}: groups must be >= 1, got {groups}")
    return int(groups)
