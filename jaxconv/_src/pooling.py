"""max_pool: a max pool whose derivatives are a gather and a phase-by-phase sum.

A CNN's max pool is not a convolution, but its gradient sits in every ResNet's training step,
and XLA:CPU computes the gradient of ``lax.reduce_window`` max (``select_and_scatter``) as a
reduce-window over value-and-index tuples and a scatter, about 10x the time of this one and
of PyTorch's (CHANGELOG.md, "Earlier measurements"). Here:

    y[o]  = max_t xp[o S + t]                     xp: x padded with -inf, t a tap of the window
    a[o]  = the first t where xp[o S + t] = y[o]  (the first maximum, as XLA's and PyTorch's)
    dy[o] = dxp[o S + a[o]]                       the JVP: ``gather`` (linear in the tangent)
    dxp   = sum_o ct[o] e[o S + a[o]]             its transpose: ``scatter``

Each tap ``xp[o S + t]`` is read from x itself: its strided slice of x, padded (with -inf, or
0 for a tangent) only where its windows reach the padding; XLA fuses those small pads into the
loop over the taps, where a pad of the whole input was a copy of x in a pass of its own.

``scatter`` is computed per phase: the padded input's rows r = q S + p (p < S) receive only
the taps t = p + S j, from the outputs o = q - j, so each phase p is a sum over its taps of
``ct`` masked by ``a = t`` and shifted by j (pads, no scatter), and the phases interleave
into dxp by stacks and reshapes, one spatial axis at a time (one transpose of all phases at
once ran 3x slower on XLA:CPU: it fused the argmax into every contribution). Both are
primitives, each the other's transpose and its own JVP (both are linear in their array
operand; the argmax is not differentiated), with a batching rule that folds a mapped axis
into the batch: derivatives of any order in both modes and ``vmap``, and, lowered to slices,
pads and selects, any backend, an export and XLA's partitioner.
"""

from __future__ import annotations

import functools
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxconv._src import lax_refs, lowering, primitive
from jaxconv._src.geometry.pooling import PoolProblem, pool_problem
from jaxconv._src.kernel import Array
from jaxconv._src.lowering.max_pool import max_pool_call

_OP = "max_pool"


def wide(x: Array) -> Array:
    """A 16-bit float array in float32, where XLA:CPU's selections and sums run at full speed
    (in bfloat16 it converts around every operation: CHANGELOG.md, "Earlier measurements"; measured on XLA:CPU only, other backends compute the same, not timed). The
    maximum and the selected values convert back exactly; sums round once, at the end."""
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


def _tap(x: Array, p: PoolProblem, offset: tuple[int, ...], value: Any) -> Array:
    """The tap at ``offset`` of every window: the strided slice of ``x`` it reads, padded with
    ``value`` where the window reads the padding. (Not a slice of x padded whole: XLA:CPU
    computes such a pad in a pass of its own, a copy of x, where each tap's small pad fuses
    into the loop that reads the taps: the ResNets' 3x3 stride-2 stem pool of 112x112 x 64
    took 0.18 ms at batch 1 against 0.34, 0.82 at batch 8 against 3.0; 2-core Xeon, model
    207.)"""
    start, limit, step = [0] * x.ndim, list(x.shape), [1] * x.ndim
    cfg = [(0, 0, 0)] * x.ndim
    for axis, t, n, s, size, (lo, _) in zip(p.data.spatial_axes, offset, p.output_size,
                                            p.strides, p.input_size, p.pads):
        first = max(0, -(-(lo - t) // s))  # the first window whose tap t reads x
        last = min(n - 1, (size - 1 + lo - t) // s)  # ... and the last
        if last < first:  # every window reads the padding here
            return jnp.full(p.shape(x.shape, p.output_size), value, x.dtype)
        start[axis], limit[axis], step[axis] = first * s + t - lo, last * s + t - lo + 1, s
        cfg[axis] = (first, n - 1 - last, 0)
    tap = lax.slice(x, start, limit, step)
    if all(c == (0, 0, 0) for c in cfg):
        return tap
    return lax.pad(tap, jnp.asarray(value, x.dtype), cfg)


def _forward(x: Array, p: PoolProblem) -> Array:
    xw = wide(x)
    taps = [_tap(xw, p, t, -jnp.inf) for t in p.offsets()]
    return functools.reduce(jnp.maximum, taps).astype(x.dtype)


def _argmax(x: Array, p: PoolProblem) -> Array:
    """Per window, the index (in ``p.offsets()`` order) of its first maximal tap. (Its running
    maximum is not the primal: that stays ``_forward``'s, whose ``maximum`` passes a NaN on as
    ``lax.reduce_window`` does.)"""
    xw = wide(x)
    dtype = p.argmax_dtype
    first, *rest = p.offsets()
    y = _tap(xw, p, first, -jnp.inf)
    arg = jnp.zeros(y.shape, dtype)
    for n, offset in enumerate(rest, 1):
        t = _tap(xw, p, offset, -jnp.inf)
        better = t > y  # strictly: the first maximum stays
        y, arg = jnp.where(better, t, y), jnp.where(better, jnp.asarray(n, dtype), arg)
    return arg


def _gather(t: Array, arg: Array, p: PoolProblem) -> Array:
    """Each window's tap ``arg`` of ``t`` (zeros for the padding)."""
    tw = wide(t)
    out = jnp.zeros(arg.shape, tw.dtype)
    for n, offset in enumerate(p.offsets()):
        out = jnp.where(arg == n, _tap(tw, p, offset, 0), out)
    return out.astype(t.dtype)


def _scatter(ct: Array, arg: Array, p: PoolProblem) -> Array:
    """The transpose of ``_gather``: ``ct`` summed into the input position of each window's
    tap ``arg``, phase by phase (the module's comment)."""
    dtype, ct = ct.dtype, wide(ct)
    # arg once, in memory: fused into the phases' loop it was computed again for every tap
    # that reads it (the argmax's chain of compares per tap of each window). Measured on
    # jax 0.11's XLA:CPU (ResNet's stem pool forward and backward 9.0 ms -> 5.6, 2-core Xeon);
    # jax 0.10's XLA:CPU drops the barrier (the same program as before); other backends not timed
    arg = lax.optimization_barrier(arg)
    axes, strides = p.data.spatial_axes, p.strides
    rows = [-(-size // s) for size, s in zip(p.padded_size, strides)]  # per phase
    phases = []
    for phase in np.ndindex(*strides):
        acc = jnp.zeros(p.shape(ct.shape, rows), ct.dtype)
        for n, offset in enumerate(p.offsets()):
            if any(t % s != q for t, s, q in zip(offset, strides, phase)):
                continue
            cfg = [(0, 0, 0)] * ct.ndim
            for axis, t, s, o, r in zip(axes, offset, strides, p.output_size, rows):
                cfg[axis] = (t // s, r - o - t // s, 0)
            picked = jnp.where(arg == n, ct, jnp.zeros((), ct.dtype))
            acc = acc + lax_refs.pad(picked, jnp.zeros((), ct.dtype), cfg)
        phases.append(acc)
    # interleaved: each spatial axis k of size rows_k becomes (rows_k, stride_k), stacked right
    # after it (the last axis first), then merged into rows_k * stride_k
    full = _interleave(phases, list(np.ndindex(*strides)), axes, strides)
    start, limit = [0] * ct.ndim, list(full.shape)
    for axis, (lo, _), size in zip(axes, p.pads, p.input_size):
        start[axis], limit[axis] = lo, lo + size
    return lax.slice(full, start, limit).astype(dtype)


def _interleave(phases: list[Array], keys: list[tuple[int, ...]], axes: tuple[int, ...],
                strides: tuple[int, ...]) -> Array:
    """The array whose rows r S + q (per spatial axis) are phase q's rows r."""
    if not axes:
        return phases[0]
    axis, s = axes[-1], strides[-1]
    groups: dict[tuple[int, ...], list[Array]] = {}
    for key, ph in zip(keys, phases):
        groups.setdefault(key[:-1], []).append(ph)  # keys in order: the last index fastest
    merged = []
    for group in groups.values():
        st = jnp.stack(group, axis=axis + 1)
        merged.append(st.reshape(*st.shape[:axis], st.shape[axis] * s, *st.shape[axis + 2:]))
    return _interleave(merged, list(groups), axes[:-1], strides[:-1])


gather_p = Primitive("jaxconv_max_pool_gather")
scatter_p = Primitive("jaxconv_max_pool_scatter")


def _define(prim: Primitive, fn: Any, out_shape: Any, adjoint: Primitive) -> None:
    def impl(t: Array, arg: Array, *, p: PoolProblem) -> Array:
        return typing.cast(Array, fn(t, arg, p))

    prim.def_impl(jax.jit(impl, static_argnames="p"))
    prim.def_abstract_eval(
        lambda t, arg, *, p: jax.core.ShapedArray(out_shape(t, arg, p), t.dtype))
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=False))

    # linear in t: its own JVP, the other's transpose; the argmax is not differentiated
    def jvp(primals: Any, tangents: Any, *, p: PoolProblem) -> Any:
        (t, arg), (dt, _) = primals, tangents
        out = prim.bind(t, arg, p=p)
        if type(dt) is ad.Zero:
            return out, ad.Zero(jax.typeof(out).to_tangent_aval())
        return out, prim.bind(dt, arg, p=p)
    ad.primitive_jvps[prim] = jvp

    def transpose(ct: Any, t: Any, arg: Any, *, p: PoolProblem) -> Any:
        if type(ct) is ad.Zero:
            return [ad.Zero(t.aval), None]
        return [adjoint.bind(ct, arg, p=p), None]
    ad.primitive_transposes[prim] = transpose

    def batch(args: Any, dims: Any, *, p: PoolProblem) -> Any:
        # the mapped axis folded into the batch (axis 0 in both layouts), then split off again
        (t, arg), (dt, da) = args, dims
        size = t.shape[dt] if dt is not None else arg.shape[da]
        t, arg = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
                  for a, d in ((t, dt), (arg, da)))
        out = prim.bind(t.reshape(-1, *t.shape[2:]), arg.reshape(-1, *arg.shape[2:]), p=p)
        return out.reshape(size, -1, *out.shape[1:]), 0
    batching.primitive_batchers[prim] = batch


_define(gather_p, _gather, lambda t, arg, p: arg.shape, scatter_p)
_define(scatter_p, _scatter, lambda t, arg, p: p.shape(t.shape, p.input_size), gather_p)


# The forward and the argmax together, the JVP's primal and what its gather reads: one
# primitive, so that on the CPU one pass of the handler computes both where that timed faster
# (XLA:CPU computes the argmax's compares and selects an element at a time: ResNet's stem pool
# at batch 8, forward and backward, 10.8 ms against 4.1 on the 2-core Zen 4 of docs/onednn.md,
# "Max pool"; the chooser times the two on the running machine),
# elsewhere XLA's two passes.
# Not linear: its JVP is the pool's (the tangent gathered at the argmax; none for the argmax).
argmax_p = Primitive("jaxconv_max_pool_argmax")
argmax_p.multiple_results = True


def _forward_and_argmax(x: Array, p: PoolProblem) -> tuple[Array, Array]:
    return _forward(x, p), _argmax(x, p)


def contenders(p: PoolProblem) -> tuple[Any, Any]:
    """What the chooser times for ``p``: XLA's forward and argmax, and the gradient's scatter
    that reads the argmax (``chooser.max_pool_why_not``)."""
    return (functools.partial(_forward_and_argmax, p=p),
            lambda ct, arg: scatter_p.bind(ct, arg, p=p))


@functools.partial(jax.jit, static_argnames="p")
def _argmax_eager(x: Array, *, p: PoolProblem) -> tuple[Array, Array]:
    y, arg = argmax_p.bind(x, p=p)
    return y, arg


def _argmax_abstract(x: Any, *, p: PoolProblem) -> tuple[jax.core.ShapedArray, ...]:
    shape = p.shape(x.shape, p.output_size)
    return jax.core.ShapedArray(shape, x.dtype), jax.core.ShapedArray(shape, p.argmax_dtype)


_ARGMAX_XLA = mlir.lower_fun(lambda x, *, p: _forward_and_argmax(x, p), multiple_results=True)
_ARGMAX_HANDLER = mlir.lower_fun(lambda x, *, p: max_pool_call(x, p), multiple_results=True)


def _argmax_cpu(ctx: mlir.LoweringRuleContext, x: Any, *, p: PoolProblem) -> Any:
    """The handler's one pass in a program on one device that is not exported, where the
    chooser timed it faster (``chooser.max_pool_why_not``); XLA's two passes elsewhere."""
    (aval,) = ctx.avals_in
    ours = lowering.max_pool_on_handler(
        aval, p, *contenders(p), partitioned=primitive.partitioned(ctx),
        exported=primitive.exported(ctx, "auto"))
    return (_ARGMAX_HANDLER if ours else _ARGMAX_XLA)(ctx, x, p=p)


def _argmax_jvp(primals: Any, tangents: Any, *, p: PoolProblem) -> Any:
    (x,), (dx,) = primals, tangents
    y, arg = argmax_p.bind(x, p=p)
    dy = (ad.Zero(jax.typeof(y).to_tangent_aval()) if type(dx) is ad.Zero
          else gather_p.bind(dx, arg, p=p))
    return (y, arg), (dy, ad.Zero(jax.typeof(arg).to_tangent_aval()))


def _argmax_batch(args: Any, dims: Any, *, p: PoolProblem) -> Any:
    # the mapped axis folded into the batch (axis 0 in both layouts), then split off again
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    outs = argmax_p.bind(x.reshape(-1, *x.shape[2:]), p=p)
    return [o.reshape(x.shape[0], -1, *o.shape[1:]) for o in outs], [0, 0]


argmax_p.def_impl(_argmax_eager)
argmax_p.def_abstract_eval(_argmax_abstract)
mlir.register_lowering(argmax_p, _ARGMAX_XLA)
mlir.register_lowering(argmax_p, _argmax_cpu, platform="cpu")
ad.primitive_jvps[argmax_p] = _argmax_jvp
batching.primitive_batchers[argmax_p] = _argmax_batch


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _max_pool(x: Array, p: PoolProblem) -> Array:
    return _forward(x, p)


@_max_pool.defjvp
def _max_pool_jvp(p: PoolProblem, primals: Any, tangents: Any) -> Any:
    (x,), (dx,) = primals, tangents
    y, arg = argmax_p.bind(x, p=p)
    return y, gather_p.bind(dx, arg, p=p)


def pool(x: Array, p: PoolProblem) -> Array:
    """The max pool of a resolved problem, differentiable through the gather and the scatter
    (what :func:`max_pool` computes after its checks; ``jaxconv.accelerate`` calls it)."""
    return _max_pool(x, p)


def gather(t: Array, x: Array, p: PoolProblem) -> Array:
    """``t`` at each window's first maximum of ``x`` (the pool's JVP in ``t``)."""
    out: Array = gather_p.bind(t, argmax_p.bind(x, p=p)[1], p=p)
    return out


def scatter(ct: Array, x: Array, p: PoolProblem) -> Array:
    """``ct`` added at each window's first maximum of ``x`` (the pool's VJP)."""
    out: Array = scatter_p.bind(ct, argmax_p.bind(x, p=p)[1], p=p)
    return out


def max_pool(inputs: Array, window_shape: int | tuple[int, ...],
             strides: int | tuple[int, ...] | None = None,
             padding: str | tuple[tuple[int, int], ...] = "VALID", *,
             data_format: str = "NXC") -> Array:
    """Max pool whose gradient is not XLA's ``select_and_scatter`` (``flax.linen.max_pool``'s
    arguments).

    Computes ``lax.reduce_window`` max, exactly (the same values, the same gradient: each
    window's first maximum receives it), but differentiates it without XLA's
    ``select_and_scatter``: the JVP gathers each window's argmax tap, its transpose sums the
    cotangent phase by phase (``jaxconv/_src/pooling.py``): on XLA:CPU about 10x faster than
    ``flax.linen.max_pool``'s gradient and level with PyTorch's (CHANGELOG.md, "Earlier
    measurements"); on other backends not timed. Composes with ``jit``, ``vmap`` and
    ``grad``/``jvp`` to any order; padding positions are ``-inf`` and never chosen unless a
    whole window is padding.

    Args:
      inputs: ``(batch, *spatial, channels)`` (``data_format="NXC"``, flax's layout) or
        ``(batch, channels, *spatial)`` (``"NCX"``), floating, rank >= 3.
      window_shape: the window per spatial axis (an int: every axis).
      strides: the stride per spatial axis; ``None``: 1.
      padding: ``"VALID"``, ``"SAME"`` (the extra element of an odd total at the end, as
        ``lax.reduce_window``) or one ``(low, high)`` pair per spatial axis.
      data_format: ``"NXC"`` or ``"NCX"``.

    Returns:
      The pooled array, ``inputs``' dtype and layout.

    Raises:
      TypeError: ``inputs`` not a floating array, or an argument of the wrong type.
      ValueError: a rank, format, window, stride or padding out of range, or a padded input
        shorter than one window.

    Example:
      >>> import jax, jax.numpy as jnp, jaxconv
      >>> x = jnp.arange(16.0).reshape(1, 4, 4, 1)
      >>> jaxconv.max_pool(x, (2, 2), strides=(2, 2))[0, :, :, 0]
      Array([[ 5.,  7.],
             [13., 15.]], dtype=float32)
      >>> jax.grad(lambda x: jaxconv.max_pool(x, 2, 2).sum())(x)[0, :, :, 0]
      Array([[0., 0., 0., 0.],
             [0., 1., 0., 1.],
             [0., 0., 0., 0.],
             [0., 1., 0., 1.]], dtype=float32)
    """
    x, p = pool_problem(_OP, inputs, window_shape, strides, padding, data_format)
    return _max_pool(x, p)
