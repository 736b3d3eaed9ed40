"""How close a jaxconv result must be to an independent reference: one table per dtype.

The test suite, the executed docs and notebooks, and the benchmarks' correctness checks all
read their bounds from here, so that a comparison's bound depends on the dtype compared and
nothing else (docs/precision.md: how the bounds were measured).

The error is relative to the reference's scale, floored at 1 so that entries near zero are
held to an absolute bound::

    error = max |got - ref| / max(1, max |ref|)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import test_util

#: the largest ``error`` (above) allowed for a result of each dtype against a reference
#: computed from the same (rounded) inputs in float64 or by another library in the same dtype:
#: a few roundings of the dtype (float32's is 6e-8; a long sum of products gathers a few
#: hundred, as the measurements of docs/precision.md show), and 0 for integers and bool.
TOLERANCE: dict[str, float] = {
    "float64": 1e-12,
    "float32": 2e-5,
    "float16": 4e-3,
    "bfloat16": 2e-2,
}

#: ``jax.test_util.check_grads`` per dtype of the arguments: (atol = rtol, eps). Its
#: finite differences, not the kernels, set these: float64 with a small step is exact to
#: 1e-6; float32's default step loses about two more digits to rounding.
CHECK_GRADS_TOLERANCE: dict[str, tuple[float, float | None]] = {
    "float64": (1e-6, 1e-4),
    "float32": (2e-2, None),
}


def _real_name(dtype: Any) -> str:
    dt = np.dtype(dtype)
    if dt.kind == "c":  # a complex result is held to its components' bound
        dt = np.dtype(f"float{dt.itemsize * 4}")
    return str(dt.name)


def tolerance(dtype: Any) -> float:
    """The bound of :data:`TOLERANCE` for ``dtype`` (complex: its components'; integers and
    bool: 0, exact).

    Raises:
      ValueError: a floating dtype the table has no entry for.
    """
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return 0.0
    name = _real_name(dt)
    if name not in TOLERANCE:
        raise ValueError(f"tolerance: dtype must be one of {sorted(TOLERANCE)} (or complex, "
                         f"integer, bool), got {name}")
    return TOLERANCE[name]


def relative_error(got: Any, ref: Any) -> float:
    """``max |got - ref| / max(1, max |ref|)`` in float64 (complex in complex128) over the
    finite entries of ``ref``; 0 when empty; infinite where a NaN or an infinity of either
    array is not the same in the other (a NaN is never the same).

    Raises:
      ValueError: the shapes differ.
    """
    kind = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(ref) else np.float64
    a, b = np.asarray(got, kind), np.asarray(ref, kind)
    if a.shape != b.shape:
        raise ValueError(f"relative_error: got shape {a.shape} and reference shape {b.shape} "
                         f"differ")
    finite = np.isfinite(b)
    if not np.array_equal(np.isfinite(a), finite) or not np.array_equal(a[~finite], b[~finite]):
        return float("inf")
    a, b = a[finite], b[finite]
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def assert_close(got: Any, ref: Any, dtype: Any = None) -> None:
    """Asserts ``relative_error(got, ref) <= tolerance(dtype)``.

    Args:
      got: the result checked (any array numpy can read: jax, numpy, a CPU torch tensor).
      ref: the reference, the same shape.
      dtype: whose bound applies; default ``got``'s dtype (the precision the result was
        computed in).

    Raises:
      AssertionError: the error exceeds the bound (a NaN, or an infinity the other array does
        not have at the same place, exceeds every bound), or the shapes differ.

    Example:
      >>> import jax.numpy as jnp, jaxconv.testing
      >>> jaxconv.testing.assert_close(jnp.float32(1.0) + 1e-6, 1.0)
    """
    dt = np.asarray(got).dtype if dtype is None else dtype
    bound = tolerance(dt)
    try:
        err = relative_error(got, ref)
    except ValueError as e:
        raise AssertionError(str(e)) from None
    if err > bound:
        raise AssertionError(f"relative error {err:.3e} > {bound:.1e} for {_real_name(dt)}")


def check_grads(f: Callable[..., Any], args: Sequence[Any], order: int,
                modes: Sequence[str] = ("fwd", "rev")) -> None:
    """``jax.test_util.check_grads`` with the bounds of :data:`CHECK_GRADS_TOLERANCE` for the
    dtype of ``args[0]``."""
    name = _real_name(np.asarray(args[0]).dtype)
    if name not in CHECK_GRADS_TOLERANCE:
        raise ValueError(f"check_grads: arguments must be one of {sorted(CHECK_GRADS_TOLERANCE)}, "
                         f"got {name}")
    tol, eps = CHECK_GRADS_TOLERANCE[name]
    test_util.check_grads(f, tuple(args), order=order,  # type: ignore[no-untyped-call]
                          modes=tuple(modes), atol=tol, rtol=tol, eps=eps)
