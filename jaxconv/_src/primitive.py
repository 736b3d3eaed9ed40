"""Derivatives of every op through jaxconv's own kernels: one bilinear primitive.

Each kernel (``lowering/``) is bilinear in its two array operands, and its
transpose in either operand is again one of the three (``ct`` is the
cotangent of the kernel's result; every kernel reads the same ConvProblem)::

    forward(x, W) -> y          x: data_grad(ct, W)     W: weight_grad(x, ct)
    data_grad(dy, W) -> dx      dy: forward(ct, W)      W: weight_grad(ct, dy)
    weight_grad(x, dy) -> dW    x: data_grad(dy, ct)    dy: forward(x, ct)

Why a primitive. ``jax.custom_vjp`` would give reverse mode only (no ``jvp``,
``jacfwd`` or forward-over-reverse hessians), and a ``jax.custom_jvp`` alone
is transposed by JAX through ``lax.conv_general_dilated``'s own rules, which
are what we replace. A primitive with a bilinear JVP (``ad.defbilinear``: the
tangent is the kernel applied to one tangent at a time), the transpose rules
above and a batching rule that folds a batched operand into the problem
(``batching.py``) gives both modes, derivatives of any order and ``vmap`` at
any depth, since every rule binds the primitive again: under any stack of
transforms the program holds ``jaxconv_conv`` equations, never lax's
transposes. JAX never derives a transpose of a kernel, so the stride +
dilation hazard of jaxlib 0.10.2 stays unreachable.

Lowering: one rule per platform (``mlir.register_lowering(..., platform=)``),
each the kernel's JAX program for its backend's table (``lowering/tables.py``), so the
method ``"auto"`` stands for is chosen once per kernel call, for the platform
the program is lowered for. Evaluated eagerly, the primitive runs as one
``jax.jit`` of itself (the only jit layer: the ops call :func:`apply`).

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
from jax._src import core as jax_core  # shard_map's varying manual axes (no public names)
from jax._src import (
    dispatch,  # primitives whose lowering needs the devices (no public name)
    sharding_impls,  # the lowering context's device layout (no public name)
)
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import PartitionSpec

from jaxconv._src import lowering
from jaxconv._src import batching as folds
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision

conv_p = Primitive("jaxconv_conv")

#: the primitive's parameters: all static (hashable)
_PARAMS = ("kernel", "p", "precision", "preferred_element_type", "method")


def _abstract_eval(a: Any, b: Any, *, kernel: Kernel, p: ConvProblem, precision: Precision,
                   preferred_element_type: DType, method: str) -> jax.core.ShapedArray:
    dtype = np.dtype(preferred_element_type if preferred_element_type is not None else a.dtype)
    return result_aval(conv_p.name, kernel.out_shape(p), dtype, a, b)


def result_aval(name: str, shape: tuple[int, ...], dtype: DType, a: Any,
                b: Any) -> jax.core.ShapedArray:
    """The result of primitive ``name`` on operands ``a`` and ``b`` (abstract values)."""
    # Inside shard_map the result varies over the manual mesh axes its operands vary over
    # (``apply`` has made theirs equal). Dropped, an output computed from a batch shard would
    # pass for one equal on every device, and the transpose would never reduce the weight
    # gradient of a replicated filter across the mesh (as lax's own convolution does).
    varying = jax_core.standard_vma_rule(name, a, b)
    if not varying:
        return jax.core.ShapedArray(shape, dtype)
    sharding = a.sharding.update(spec=PartitionSpec(*([None] * len(shape))))
    mat = jax_core.ManualAxisType(varying=varying, unreduced=frozenset(), reduced=frozenset())
    return jax.core.ShapedArray(shape, dtype, sharding=sharding, manual_axis_type=mat)


def _program(backend: str, partitioned: bool, portable: bool) -> Callable[..., Array]:
    """The kernel's JAX program on ``backend`` (its table resolves ``method="auto"``), split
    across devices by XLA's partitioner or not, with custom calls or none (``lowering.run``)."""
    def program(a: Array, b: Array, *, kernel: Kernel, p: ConvProblem, precision: Precision,
                preferred_element_type: DType, method: str) -> Array:
        return lowering.run(kernel, a, b, p, method=method, backend=backend, precision=precision,
                            preferred_element_type=preferred_element_type,
                            partitioned=partitioned, portable=portable)
    return program


def partitioned(ctx: mlir.LoweringRuleContext) -> bool:
    """Whether XLA's SPMD partitioner splits this program across devices: a ``jit`` over
    several devices, or a ``shard_map`` region that leaves some mesh axes to the partitioner
    (a fully manual region computes its local shards, as one device does)."""
    context = ctx.module_context.axis_context
    if isinstance(context, sharding_impls.ShardingContext):
        return context.num_devices > 1
    if isinstance(context, sharding_impls.SPMDAxisContext):
        return set(context.manual_axes) != set(context.mesh.axis_names)
    return False


def exported(ctx: mlir.LoweringRuleContext, method: str) -> bool:
    """Whether this program is lowered for ``jax.export`` without the caller's opt-in to keep
    oneDNN's call (``lowering="onednn"`` forced on the op, docs/export.md): a serialized
    artifact may run where jaxconv's handler is not registered, and JAX refuses to serialize
    a custom call without a compatibility guarantee, so the portable XLA formulations."""
    return bool(ctx.module_context.lowering_parameters.for_export) and method != "onednn"


def _lowering(backend: str) -> Callable[..., Any]:
    """The primitive's lowering rule on ``backend``: one program on one device, one split
    across devices by XLA's partitioner (a custom call per device's blocks, ``lowering/spmd.py``),
    and one with no custom call (an export)."""
    rules = {(part, port): mlir.lower_fun(_program(backend, part, port), multiple_results=False)
             for part in (False, True) for port in (False, True)}

    def rule(ctx: mlir.LoweringRuleContext, *args: Any, **params: Any) -> Any:
        key = (partitioned(ctx), exported(ctx, params["method"]))
        return rules[key](ctx, *args, **params)
    return rule


@functools.partial(jax.jit, static_argnames=_PARAMS)
def _eager(a: Array, b: Array, **params: Any) -> Array:
    out: Array = conv_p.bind(a, b, **params)
    return out


# A program split across devices may run oneDNN per device through custom_partitioning
# (lowering/spmd.py), whose lowering needs the program's devices: JAX hands them to the
# lowering of the primitives in this set (no public name).
dispatch.prim_requires_devices_during_lowering.add(conv_p)
conv_p.def_impl(_eager)
conv_p.def_abstract_eval(_abstract_eval)
for _backend in lowering.BACKENDS:
    _rule = _lowering(_backend)
    for _platform in lowering.PLATFORMS[_backend] or (None,):  # "default": every other platform
        mlir.register_lowering(conv_p, _rule, platform=_platform)


def apply(a: Array, b: Array, *, kernel: Kernel, p: ConvProblem, precision: Precision = None,
          preferred_element_type: DType = None, method: str = "auto") -> Array:
    """The kernel ``kernel`` on (a, b), differentiable and batchable through jaxconv's kernels."""
    # inside shard_map: an operand that does not vary over a manual axis the other varies over
    # is cast to varying (``pvary``, whose transpose is the psum of its cotangent: a replicated
    # filter's gradient summed over the batch shards), as lax.conv_general_dilated does
    a, b = jax_core.auto_insert_reshard(a, b)
    out: Array = conv_p.bind(a, b, kernel=kernel, p=p, precision=precision,
                             preferred_element_type=preferred_element_type, method=method)
    return out


# The transpose of each kernel in its first (lhs) and second (rhs) operand: (kernel, swap),
# where the adjoint is kernel(ct, other) or, with swap, kernel(other, ct).
_LHS = {Kernel.FORWARD: (Kernel.DATA, False), Kernel.DATA: (Kernel.FORWARD, False),
        Kernel.WEIGHT: (Kernel.DATA, True)}
_RHS = {Kernel.FORWARD: (Kernel.WEIGHT, True), Kernel.DATA: (Kernel.WEIGHT, False),
        Kernel.WEIGHT: (Kernel.FORWARD, True)}


def _adjoint(table: dict[Kernel, tuple[Kernel, bool]], ct: Any, other: Array, undefined: Any,
             *, kernel: Kernel, p: ConvProblem, precision: Precision, method: str,
             **_: Any) -> Any:
    if type(ct) is ad.Zero:
        return ad.Zero(undefined.aval)
    target, swap = table[kernel]
    if other.dtype != ct.dtype:  # widen the defined operand, as JAX's conv transpose does
        other = other.astype(ct.dtype)
    a, b = (other, ct) if swap else (ct, other)
    # a forced method is the primal's alone (its transpose is another kernel); "direct", a
    # choice without Winograd, holds for every derivative
    out = apply(a, b, kernel=target, p=p, precision=precision,
                method="direct" if method == "direct" else "auto")
    dtype = undefined.aval.dtype
    return out.astype(dtype) if out.dtype != dtype else out


def _lhs_rule(ct: Any, a: Any, b: Any, **params: Any) -> Any:
    return _adjoint(_LHS, ct, b, a, **params)


def _rhs_rule(ct: Any, a: Any, b: Any, **params: Any) -> Any:
    return _adjoint(_RHS, ct, a, b, **params)


ad.defbilinear(conv_p, _lhs_rule, _rhs_rule)
batching.primitive_batchers[conv_p] = functools.partial(folds.rule, conv_p.bind)


def forward(x: Array, w: Array, *, p: ConvProblem, precision: Precision = None,
            preferred_element_type: DType = None, method: str = "auto") -> Array:
    """y from x and W: :func:`apply` of ``Kernel.FORWARD``."""
    return apply(x, w, kernel=Kernel.FORWARD, p=p, precision=precision,
                 preferred_element_type=preferred_element_type, method=method)


def data_grad(dy: Array, w: Array, *, p: ConvProblem, precision: Precision = None,
              preferred_element_type: DType = None, method: str = "auto") -> Array:
    """dx from dy and W: :func:`apply` of ``Kernel.DATA``."""
    return apply(dy, w, kernel=Kernel.DATA, p=p, precision=precision,
                 preferred_element_type=preferred_element_type, method=method)


def weight_grad(x: Array, dy: Array, *, p: ConvProblem, precision: Precision = None,
                preferred_element_type: DType = None, method: str = "auto") -> Array:
    """dW from x and dy: :func:`apply` of ``Kernel.WEIGHT``."""
    return apply(x, dy, kernel=Kernel.WEIGHT, p=p, precision=precision,
                 preferred_element_type=preferred_element_type, method=method)
