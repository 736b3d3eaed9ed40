"""Rounding float32 to bfloat16 by integer operations.

XLA:CPU's ``convert`` from float32 to bfloat16 is slow: 800K values took 0.23 ms, where the
same rounding written as integer operations took 0.07 ms (3.2M: 0.44 against 0.20; 2-core
Zen 4 VM); a 16-bit convolution's float32 result (``onednn_f32``), 200K values, 0.10 ms
against 0.05 (2-core Intel Xeon). The rounding, to nearest with ties to even, on the bits of a
float32 ``u``: ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16``, the upper half of the rounded value (an
overflow to the exponent's all-ones is infinity, as IEEE rounding gives); a NaN keeps its
sign and upper bits, quieted (``| 0x40``). The values are XLA's, bit for bit
(``tests/accelerate/rewrites/test_narrowing.py``). Its readers: the narrowing rewrite
(``accelerate/rewrites/narrowing.py``) and the widened oneDNN kernels' results
(``lowering/onednn.py``, ``lowering/fused.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src.kernel import Array, DType


@jax.custom_jvp
def round_to_bfloat16(x: Array) -> Array:
    """``x.astype(jnp.bfloat16)`` for a float32 ``x``, by integer operations (module
    docstring); its derivatives are the cast's (``grad`` of an accelerated function reads
    them)."""
    u = lax.bitcast_convert_type(x, jnp.uint32)
    rounded = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) >> 16
    nan = (u >> 16) | jnp.uint32(0x40)
    bits = lax.select(x != x, nan, rounded).astype(jnp.uint16)
    return lax.bitcast_convert_type(bits, jnp.bfloat16)


@round_to_bfloat16.defjvp
def _cast_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
    (x,), (t,) = primals, tangents
    return round_to_bfloat16(x), t.astype(jnp.bfloat16)


def narrowed(x: Array, dtype: DType) -> Array:
    """``x.astype(dtype)``: a float32 ``x`` to bfloat16 by :func:`round_to_bfloat16`, any
    other cast as XLA's."""
    if x.dtype == np.float32 and np.dtype(dtype) == np.dtype(jnp.bfloat16):
        return round_to_bfloat16(x)
    return x.astype(dtype)
