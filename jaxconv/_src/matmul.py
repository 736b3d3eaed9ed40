"""Matrix products on the oneDNN handler: the primitive ``jaxconv_matmul`` that
:func:`jaxconv.accelerate` binds for a 2D ``dot_general`` of bfloat16 matrices (a dense layer's
forward and both its gradients in a mixed-precision step) or of float32 ones where that timed
faster (a served model's dense layer).

Why. XLA:CPU computes a bfloat16 ``dot_general`` in float32: it converts both operands, runs
the float32 product and rounds the result. oneDNN's matmul multiplies bfloat16 natively (twice
float32's FMA rate on AVX-512 BF16 and AMX) and sums in float32: a dense layer's three
products took 0.14-0.43 of XLA's time on a 2-core Zen 4 (``python -m benchmarks.dense_products``;
docs/onednn.md, "Matrix products"). A float32 product of one row or a few (a serving batch)
reads its weights once; XLA:CPU runs it on one thread, and the handler's sgemm in parts on
XLA's pool reads them on every pool thread (``python -m benchmarks.dense_products --serving``).

The product. ``matmul(a, b, contracting=(ca, cb))`` is ``lax.dot_general(a, b, ((ca,), (cb,)),
((), ()))`` of two matrices: ``a``'s free axis makes the result's rows, ``b``'s its columns.
Each operand is read in its own layout through its strides (``native/onednn/matmul.h``). Its transposes
are products of the same kind (``C = op(A) op(B)``, ``dA = ct op(B)^T``, ``dB = op(A)^T ct``,
each laid out as its operand), so derivatives of any order stay ``jaxconv_matmul`` equations,
and ``vmap`` of one batched operand folds the batch into that operand's free axis.

Where it runs on the handler: on the CPU, in a program on one device, not exported (a
serialized artifact may run where the handler is not registered), for bfloat16 operands where
oneDNN computes bfloat16 natively (``lowering/onednn.py``'s ``native_bfloat16``) and float32
ones where the handler's product timed faster (the chooser decides:
``chooser.product_on_onednn``). Everywhere else the primitive lowers to ``lax.dot_general``, so
the values agree within the rounding of one float32 sum.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxconv._src import lowering, primitive
from jaxconv._src.kernel import Array, DType
from jaxconv._src.lowering.onednn import matmul_call

matmul_p = Primitive("jaxconv_matmul")

def matmul(a: Array, b: Array, contracting: tuple[int, int],
           preferred_element_type: DType = None) -> Array:
    """``lax.dot_general(a, b, (((contracting[0],), (contracting[1],)), ((), ())))`` of two
    matrices of one dtype, on oneDNN's matmul where it runs there (module docstring).

    Args:
      a: the left matrix; its free axis makes the result's rows.
      b: the right matrix, ``a``'s dtype; its free axis makes the result's columns.
      contracting: the axis (0 or 1) of ``a`` and of ``b`` that the product sums over.
      preferred_element_type: the result's dtype (None: the operands').

    Returns:
      The product, ``a``'s free size x ``b``'s free size.

    Raises:
      TypeError: the operands are not matrices of one floating dtype.
      ValueError: a contracting axis is not 0 or 1, or the two have different sizes.
    """
    if np.ndim(a) != 2 or np.ndim(b) != 2:
        raise TypeError(f"matmul: a and b must be matrices, got shapes {np.shape(a)} and "
                        f"{np.shape(b)}")
    if a.dtype != b.dtype or not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"matmul: a and b must share one floating dtype, got {a.dtype} and "
                        f"{b.dtype}")
    ca, cb = contracting
    if ca not in (0, 1) or cb not in (0, 1) or a.shape[ca] != b.shape[cb]:
        raise ValueError(f"matmul: contracting must name one axis of each matrix (0 or 1) of "
                         f"equal sizes, got {contracting} for shapes {a.shape} and {b.shape}")
    dtype = None if preferred_element_type is None else np.dtype(preferred_element_type)
    out: Array = matmul_p.bind(a, b, contracting=(int(ca), int(cb)), preferred_element_type=dtype)
    return out


def _abstract_eval(a: Any, b: Any, *, contracting: tuple[int, int],
                   preferred_element_type: DType) -> jax.core.ShapedArray:
    ca, cb = contracting
    dtype = a.dtype if preferred_element_type is None else preferred_element_type
    return primitive.result_aval(matmul_p.name, (a.shape[1 - ca], b.shape[1 - cb]), dtype, a, b)


def _widened(a: Array, b: Array, preferred_element_type: DType) -> tuple[Array, Array]:
    """The operands in the result's dtype where it is wider: the same products (a narrower
    float's values are the wider one's), and XLA:CPU's dot thunk takes no bfloat16 operands
    with a float32 result ("Unsupported element type for DotThunk")."""
    if preferred_element_type is None or np.dtype(preferred_element_type) == a.dtype:
        return a, b
    return a.astype(preferred_element_type), b.astype(preferred_element_type)


def _xla(a: Array, b: Array, *, contracting: tuple[int, int],
         preferred_element_type: DType) -> Array:
    ca, cb = contracting
    a, b = _widened(a, b, preferred_element_type)
    return lax.dot_general(a, b, (((ca,), (cb,)), ((), ())))


def _onednn(a: Array, b: Array, *, contracting: tuple[int, int],
            preferred_element_type: DType) -> Array:
    return matmul_call(a, b, contracting, preferred_element_type)


_XLA_RULE = mlir.lower_fun(_xla, multiple_results=False)
_ONEDNN_RULE = mlir.lower_fun(_onednn, multiple_results=False)


def _cpu_rule(ctx: mlir.LoweringRuleContext, a: Any, b: Any, **params: Any) -> Any:
    """oneDNN's matmul in a program on one device that is not exported (module docstring)."""
    a_aval, b_aval = ctx.avals_in
    dims = (((params["contracting"][0],), (params["contracting"][1],)), ((), ()))
    ours = lowering.product_on_onednn(a_aval, b_aval, dims, params["preferred_element_type"],
                                      partitioned=primitive.partitioned(ctx),
                                      exported=primitive.exported(ctx, "auto"))
    return (_ONEDNN_RULE if ours else _XLA_RULE)(ctx, a, b, **params)


@functools.partial(jax.jit, static_argnames=("contracting", "preferred_element_type"))
def _eager(a: Array, b: Array, **params: Any) -> Array:
    out: Array = matmul_p.bind(a, b, **params)
    return out


matmul_p.def_impl(_eager)
matmul_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(matmul_p, _XLA_RULE)
mlir.register_lowering(matmul_p, _cpu_rule, platform="cpu")


# The transposes, for C = op(A) op(B) with op(A) = A (ca = 1) or A^T (ca = 0), op(B) = B
# (cb = 0) or B^T (cb = 1):
#   dop(A) = ct op(B)^T, so dA = matmul(ct, b, (1, 1 - cb))   where ca = 1 (A is M x K)
#                           dA = matmul(b, ct, (1 - cb, 1))   where ca = 0 (A is K x M)
#   dop(B) = op(A)^T ct, so dB = matmul(a, ct, (1 - ca, 0))   where cb = 0 (B is K x N)
#                           dB = matmul(ct, a, (0, 1 - ca))   where cb = 1 (B is N x K)
# A cotangent wider than the other operand (a float32 result of bfloat16 operands) widens it;
# the gradient comes back in its primal's dtype.

def _adjoint(ct: Any, other: Array, undefined: Any, lhs: bool,
             contracting: tuple[int, int]) -> Any:
    if type(ct) is ad.Zero:
        return ad.Zero(undefined.aval)
    if other.dtype != ct.dtype:  # ct is the result's dtype: the operands' or a wider one
        other = other.astype(ct.dtype)
    ca, cb = contracting
    if lhs:
        out = matmul(ct, other, (1, 1 - cb)) if ca == 1 else matmul(other, ct, (1 - cb, 1))
    else:
        out = matmul(other, ct, (1 - ca, 0)) if cb == 0 else matmul(ct, other, (0, 1 - ca))
    dtype = undefined.aval.dtype
    return out.astype(dtype) if out.dtype != dtype else out


def _lhs_rule(ct: Any, a: Any, b: Any, *, contracting: tuple[int, int], **_: Any) -> Any:
    return _adjoint(ct, b, a, True, contracting)


def _rhs_rule(ct: Any, a: Any, b: Any, *, contracting: tuple[int, int], **_: Any) -> Any:
    return _adjoint(ct, a, b, False, contracting)


ad.defbilinear(matmul_p, _lhs_rule, _rhs_rule)


def _batch_rule(args: Any, dims: Any, *, contracting: tuple[int, int],
                preferred_element_type: DType) -> tuple[Array, int]:
    """One batched operand: its batch folded into its free axis, one product, the result
    unfolded (the batch is the result's axis 0 for ``a``, 1 for ``b``). Both batched: XLA's
    batched ``dot_general``."""
    (a, b), (da, db) = args, dims
    ca, cb = contracting
    if da is not None and db is not None:
        a, b = _widened(jnp.moveaxis(a, da, 0), jnp.moveaxis(b, db, 0), preferred_element_type)
        return lax.dot_general(a, b, (((ca + 1,), (cb + 1,)), ((0,), (0,)))), 0
    if da is not None:  # batch next to a's free axis, then merged with it
        a = jnp.moveaxis(a, da, 1 - ca)  # (B, M, K) or (K, B, M)
        n = a.shape[1 - ca]
        a = a.reshape((n * a.shape[1], a.shape[2]) if ca == 1 else (a.shape[0], -1))
        out = matmul(a, b, contracting, preferred_element_type)
        return out.reshape(n, -1, out.shape[1]), 0
    b = jnp.moveaxis(b, db, 1 - cb)  # (K, B, N) or (B, N, K)
    n = b.shape[1 - cb]
    b = b.reshape((b.shape[0], -1) if cb == 0 else (n * b.shape[1], b.shape[2]))
    out = matmul(a, b, contracting, preferred_element_type)
    return out.reshape(out.shape[0], n, -1), 1


batching.primitive_batchers[matmul_p] = _batch_rule
