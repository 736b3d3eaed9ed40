"""A served convolution's BatchNorm folded into its filter once, when the program is traced.

Where a fused chain's filter is a constant of the program (a model served with its variables
closed over, float32, in a process whose programs run on the CPU: ``base.packs``) and the chain starts with channel-wise ``add``, ``sub``, ``mul`` and
``mul_rsqrt`` post-ops whose operands the program computes from its constants by shape-only
equations (flax's inference BatchNorm: its statistics reshaped), that run is composed into one
scale and one shift per output channel, ``y * a + b``, and the scale multiplied into the filter
along its output-channel axis. The call then runs one channel ``add`` where it ran the run: the
handler composes a run at every call, and multiplies a packed filter's products by the scale as
a post-op, since it cannot scale bytes already in the primitive's layout (docs/onednn.md,
"Fused chains"). The run is composed in float64 and the filter rounded once; a 16-bit filter is
not folded (scaled, it would round once more), as the handler does not fold one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend.core import Literal

from jaxconv._src.accelerate.rewrites.base import Scope, constant
from jaxconv._src.lowering.fused import PostOp

#: the post-ops a run composes (the handler's LeadingAffine: native/onednn/decisions.cc)
_AFFINE = frozenset({"add", "sub", "mul", "mul_rsqrt"})

#: the shape-only equations an operand is read through to a constant of the program
_SHAPE_ONLY: dict[str, Callable[[np.ndarray, dict[str, Any]], np.ndarray]] = {
    "reshape": lambda v, p: v.reshape(p["new_sizes"]),
    "broadcast_in_dim": lambda v, p: np.broadcast_to(
        v.reshape([v.shape[p["broadcast_dimensions"].index(d)]
                   if d in p["broadcast_dimensions"] else 1 for d in range(len(p["shape"]))]),
        p["shape"]),
    "squeeze": lambda v, p: v.squeeze(tuple(p["dimensions"])),
    "convert_element_type": lambda v, p: v.astype(p["new_dtype"]),
}
#: how many such equations deep
_DEPTH = 4


def host_value(var: Any, scope: Scope, depth: int = _DEPTH) -> np.ndarray | None:
    """``var``'s value on the host where it is a literal, a constant of the program, or one
    computed from a constant by shape-only equations alone; else None."""
    if isinstance(var, Literal):
        return np.asarray(var.val)
    value = scope.env.get(var)
    if constant(value):
        return np.asarray(value)
    eqn = scope.analysis.producer.get(var)
    if (depth == 0 or eqn is None or eqn.primitive.name not in _SHAPE_ONLY
            or len(eqn.invars) != 1):
        return None
    source = host_value(eqn.invars[0], scope, depth - 1)
    return None if source is None else _SHAPE_ONLY[eqn.primitive.name](source, eqn.params)


def affine_run(steps: Sequence[tuple[PostOp, Any]], scope: Scope, channels: int
               ) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The leading run of ``steps`` (post-ops and their operands' variables) that composes:
    channel-wise affine post-ops whose operands :func:`host_value` reads. Its length, and its
    scale and shift per channel (float64, ``y * a + b``); None where it holds no product (a
    shift alone folds into nothing)."""
    a, b = np.ones(channels), np.zeros(channels)
    length, multiplies = 0, False
    for op, side in steps:
        if op.kind != "channel" or op.alg not in _AFFINE:
            break
        got = host_value(side, scope)
        if got is None or got.size not in (1, channels):
            break
        v = np.broadcast_to(got.astype(np.float64).reshape(-1), (channels,))
        if op.alg == "add":
            b = b + v
        elif op.alg == "sub":
            b = b - v
        else:  # mul, mul_rsqrt: the operand, or its normalizer 1 / sqrt(v + eps)
            r = v if op.alg == "mul" else 1.0 / np.sqrt(v + np.float64(np.float32(op.alpha)))
            a, b, multiplies = a * r, b * r, True
        length += 1
    return (length, a, b) if multiplies else None


def scaled(filt: np.ndarray, fmt: str, a: np.ndarray) -> np.ndarray:
    """The float32 filter ``filt`` (``fmt``: ``"OIX"`` or ``"XIO"``, a forward's, as
    ``lax_conv.forward_filter`` gives it) times ``a`` along its output-channel axis, rounded
    once."""
    shape = [1] * filt.ndim
    shape[0 if fmt == "OIX" else -1] = a.size
    out: np.ndarray = (filt.astype(np.float64) * a.reshape(shape)).astype(np.float32)
    return out
