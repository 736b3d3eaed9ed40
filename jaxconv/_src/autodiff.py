"""Derivatives of every op through jaxconv's own kernels: one bilinear primitive.

Each kernel of ``lowering.py`` is bilinear in its two array operands, and its
transpose in either operand is again one of the three (``ct`` is the
cotangent of the kernel's result; every kernel reads the same ConvProblem)::

    forward(x, W) -> y          x: data_grad(ct, W)     W: weight_grad(x, ct)
    data_grad(dy, W) -> dx      dy: forward(ct, W)      W: weight_grad(ct, dy)
    weight_grad(x, dy) -> dW    x: data_grad(dy, ct)    dy: forward(x, ct)

Why a primitive. ``jax.custom_vjp`` would give reverse mode only (no ``jvp``,
``jacfwd`` or forward-over-reverse hessians), and a ``jax.custom_jvp`` alone
is transposed by JAX through ``lax.conv_general_dilated``'s own rules, which
are what we replace. A primitive with a bilinear JVP (``ad.defbilinear``: the
tangent is the kernel applied to one tangent at a time) and the transpose
rules above gives both modes, and derivatives of any order, since every rule
binds the primitive again. Its lowering is the kernel's JAX program
(``mlir.lower_fun``), so the per-backend choice of formulation
(``lax.platform_dependent``) happens where it always did, and JAX never
derives a transpose of a kernel (the stride + dilation hazard of jaxlib 0.10.2
stays unreachable). Under ``vmap`` the kernel is vectorized as a JAX function.

Dtypes follow JAX's rule for ``conv_general_dilated``: a cotangent wider than
the other operand (``preferred_element_type``) widens that operand, the
product is computed there, and the gradient comes back in its primal's dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxconv._src import lowering as kernels
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.registry import Kernel

conv_p = Primitive("jaxconv_conv")


def _run(a: jax.Array, b: jax.Array, *, kernel: Kernel, p: ConvProblem, precision: Any,
         preferred_element_type: Any, method: str) -> jax.Array:
    """The kernel itself: the primitive's implementation and lowering."""
    kw = dict(precision=precision, preferred_element_type=preferred_element_type)
    if kernel == "forward":
        return kernels.forward(a, b, p, method=method, **kw)
    if kernel == "data":
        return kernels.data_grad(a, b, p, method=method, **kw)
    if kernel == "weight":
        return kernels.weight_grad(a, b, p, method=method, **kw)
    raise ValueError(f"jaxconv_conv: kernel must be 'forward', 'data' or 'weight', got {kernel!r}")


def _shape(kernel: Kernel, p: ConvProblem) -> tuple[int, ...]:
    return {"forward": p.y_shape, "data": p.x_shape, "weight": p.filter_shape}[kernel]


def _abstract_eval(a: Any, b: Any, *, kernel: Kernel, p: ConvProblem, precision: Any,
                   preferred_element_type: Any, method: str) -> jax.core.ShapedArray:
    dtype = preferred_element_type if preferred_element_type is not None else a.dtype
    return jax.core.ShapedArray(_shape(kernel, p), np.dtype(dtype))


_STATIC = ("kernel", "p", "precision", "preferred_element_type", "method")
conv_p.def_impl(jax.jit(_run, static_argnames=_STATIC))
conv_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(conv_p, mlir.lower_fun(_run, multiple_results=False))


def apply(a: jax.Array, b: jax.Array, *, kernel: Kernel, p: ConvProblem, precision: Any = None,
          preferred_element_type: Any = None, method: str = "auto") -> jax.Array:
    """The kernel ``kernel`` on (a, b), differentiable through jaxconv's kernels."""
    out: jax.Array = conv_p.bind(a, b, kernel=kernel, p=p, precision=precision,
                                 preferred_element_type=preferred_element_type, method=method)
    return out


# The transpose of each kernel in its first (lhs) and second (rhs) operand: (kernel, swap),
# where the adjoint is kernel(ct, other) or, with swap, kernel(other, ct).
_LHS: dict[str, tuple[Kernel, bool]] = {"forward": ("data", False), "data": ("forward", False),
                                        "weight": ("data", True)}
_RHS: dict[str, tuple[Kernel, bool]] = {"forward": ("weight", True), "data": ("weight", False),
                                        "weight": ("forward", True)}


def _adjoint(table: dict[str, tuple[Kernel, bool]], ct: Any, other: jax.Array, undefined: Any,
             *, kernel: Kernel, p: ConvProblem, precision: Any, **_: Any) -> Any:
    if type(ct) is ad.Zero:
        return ad.Zero(undefined.aval)
    target, swap = table[kernel]
    if other.dtype != ct.dtype:  # widen the defined operand, as JAX's conv transpose does
        other = other.astype(ct.dtype)
    a, b = (other, ct) if swap else (ct, other)
    out = apply(a, b, kernel=target, p=p, precision=precision)
    dtype = undefined.aval.dtype
    return out.astype(dtype) if out.dtype != dtype else out


def _lhs_rule(ct: Any, a: Any, b: Any, **params: Any) -> Any:
    return _adjoint(_LHS, ct, b, a, **params)


def _rhs_rule(ct: Any, a: Any, b: Any, **params: Any) -> Any:
    return _adjoint(_RHS, ct, a, b, **params)


ad.defbilinear(conv_p, _lhs_rule, _rhs_rule)


def _batch(args: tuple[jax.Array, jax.Array], dims: tuple[Any, Any],
           **params: Any) -> tuple[jax.Array, int]:
    a, b = args
    da, db = dims
    fn: Callable[..., jax.Array] = functools.partial(_run, **params)
    out = jax.vmap(fn, in_axes=(da, db))(a, b)
    return out, 0


batching.primitive_batchers[conv_p] = _batch


# Jitted entry points for the ops: the problem and the options are static (hashable).
def forward(x: jax.Array, w: jax.Array, *, p: ConvProblem, precision: Any = None,
            preferred_element_type: Any = None, method: str = "auto") -> jax.Array:
    return apply(x, w, kernel="forward", p=p, precision=precision,
                 preferred_element_type=preferred_element_type, method=method)


def data_grad(dy: jax.Array, w: jax.Array, *, p: ConvProblem, precision: Any = None,
              preferred_element_type: Any = None, method: str = "auto") -> jax.Array:
    return apply(dy, w, kernel="data", p=p, precision=precision,
                 preferred_element_type=preferred_element_type, method=method)


def weight_grad(x: jax.Array, dy: jax.Array, *, p: ConvProblem, precision: Any = None,
                preferred_element_type: Any = None, method: str = "auto") -> jax.Array:
    return apply(x, dy, kernel="weight", p=p, precision=precision,
                 preferred_element_type=preferred_element_type, method=method)


_OPTIONS = ("p", "precision", "preferred_element_type")
jit_forward: Callable[..., jax.Array] = jax.jit(forward, static_argnames=(*_OPTIONS, "method"))
jit_data_grad: Callable[..., jax.Array] = jax.jit(data_grad, static_argnames=(*_OPTIONS, "method"))
jit_weight_grad: Callable[..., jax.Array] = jax.jit(weight_grad, static_argnames=(*_OPTIONS, "method"))
