"""The handler's max pool: a 2D max pool's forward and each window's argmax in one pass
(``native/pooling/max_pool.h``), for the gradient of ``jaxconv.max_pool``
(``jaxconv/_src/pooling.py``). Where it runs: ``chooser.max_pool_why_not``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src.geometry.pooling import PoolProblem
from jaxconv._src.kernel import Array
from jaxconv._src.native import library

def handler_applies(dtype: np.dtype, p: PoolProblem) -> str | None:
    """Why the handler does not compute this pool's forward and argmax, or None where it
    does: a 2D pool of float32 or bfloat16 in flax's layout (``NXC``: channels contiguous)
    whose argmax is int8 (``PoolProblem.argmax_dtype``), with the handler built."""
    if p.data.format != "NXC" or len(p.window) != 2:
        return f"the handler pools 2D NXC inputs, got {len(p.window)}D {p.data.format}"
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(jnp.bfloat16)):
        return f"the handler pools float32 and bfloat16, got {np.dtype(dtype)}"
    if p.argmax_dtype != np.int8:
        return f"the handler pools windows of an int8 argmax (at most 127 taps), got {p.taps}"
    found = library.status()
    if not found.available:
        return f"the handler is not available: {found.detail}"
    return None


def max_pool_call(x: Array, p: PoolProblem) -> tuple[Array, Array]:
    """The pool of ``x`` and each window's argmax (int8, taps in ``p.offsets()`` order) from
    the handler (:func:`handler_applies` holds)."""
    shape = p.shape(x.shape, p.output_size)
    out = (jax.ShapeDtypeStruct(shape, x.dtype),  # type: ignore[no-untyped-call]
           jax.ShapeDtypeStruct(shape, jnp.int8))  # type: ignore[no-untyped-call]
    call = jax.ffi.ffi_call(library.MAX_POOL_TARGET, out)
    y, arg = call(x, op="max_pool", window=np.array(p.window, np.int64),
                  strides=np.array(p.strides, np.int64),
                  pads=np.array([lo for lo, _ in p.pads], np.int64))
    return y, arg
