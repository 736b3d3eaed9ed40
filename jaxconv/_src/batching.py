"""The batching rule of the ``jaxconv_conv`` primitive: a batched operand folds into the problem.

Under ``jax.vmap`` the primitive binds itself again on a re-described problem, as JAX's own
rule for ``conv_general_dilated`` does, so that every transform stacked on top (``grad``,
``jacfwd``, ``hessian``, another ``vmap``) still sees one ``jaxconv_conv`` and its rules:
the kernel is never inlined as lax operations. With ``B`` the mapped size, ``G`` the groups,
``c`` the data's channel axis and ``O``/``I`` the filter's role axes (O group-major):

* forward, x batched: into x's batch, N -> (B, N); y's batch.
* forward, W batched: into W's O axis, (G, OCg) -> (G, B, OCg); y's channels, per group.
* forward, both: into the groups, G -> B*G (x's C and W's O, B-major); y's channels.
* data, dy batched: into dy's batch; dx's batch.
* data, W batched: into W's I axis, ICg -> (B, ICg); dx's channels, per group.
* data, both: into the groups; dx's channels.
* weight, x batched: into x's C, (G, ICg) -> (G, B, ICg); dW's I axis.
* weight, dy batched: into dy's C, (G, OCg) -> (G, B, OCg); dW's O axis, per group.
* weight, both: into the groups; dW's O axis.

(The weight gradient sums over the batch, so a batched x or dy cannot fold into N: it folds
into a channel axis instead.) Each fold is a transpose and a free reshape of one operand, and
every fold is exact: the folded problem computes, for each of the B slices, the slice's
own problem.

One case is not expressible as such a fold without changing a forced method's reach: a
*forced* ``lowering=`` that does not apply to the folded problem. The only one among the
methods is ``"shifted"`` (one input channel per group) for a weight gradient with only ``x``
batched: folding into x's channels gives B channels per group. There the unbatched operand
is broadcast to the batch and both fold into the groups (which keeps one channel per group),
at the cost of B copies of it. ``lowering="auto"`` re-chooses for the folded problem instead.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import jax.numpy as jnp

from jaxconv._src import lowering
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, Kernel

#: where one operand or the result carries the mapped axis: (axis of the unbatched array,
#: the group factor the mapped size goes after: 1 = outermost)
Place = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Fold:
    """How one batched call becomes one unbatched call of a larger problem."""

    p: ConvProblem
    a: Place | None
    b: Place | None
    out: Place


def plan(kernel: Kernel, p: ConvProblem, batched_a: bool, batched_b: bool, size: int) -> Fold:
    """The fold of ``kernel`` on ``p`` for the batched operands (at least one)."""
    n_ax, c = p.data.batch_axis, p.data.channel_axis
    o_ax, i_ax = p.filter_layout.spec(swap=p.filter_swap)[:2]
    g = p.groups
    more_in = dataclasses.replace(p, in_channels=size * p.in_channels)
    more_out = dataclasses.replace(p, out_channels=size * p.out_channels)
    if batched_a and batched_b:  # both: B more groups (B-major in every channel axis)
        folded = dataclasses.replace(more_in, out_channels=size * p.out_channels, groups=size * g)
        if kernel is Kernel.WEIGHT:
            return Fold(folded, (c, 1), (c, 1), (o_ax, 1))
        return Fold(folded, (c, 1), (o_ax, 1), (c, 1))
    if kernel is Kernel.WEIGHT:  # the sum over N: x or dy folds into a channel axis
        if batched_a:
            return Fold(more_in, (c, g), None, (i_ax, 1))
        return Fold(more_out, None, (c, g), (o_ax, g))
    if batched_a:  # x (forward) or dy (data) into the batch
        return Fold(dataclasses.replace(p, batch=size * p.batch), (n_ax, 1), None, (n_ax, 1))
    if kernel is Kernel.FORWARD:
        return Fold(more_out, None, (o_ax, g), (c, g))
    return Fold(more_in, None, (i_ax, 1), (c, g))


def fold(a: Array, mapped: int, place: Place) -> Array:
    """``a`` with its mapped axis merged into ``place``: (outer, B, rest) on that axis."""
    axis, outer = place
    if mapped != axis:
        a = jnp.moveaxis(a, mapped, axis)  # (..., B, E, ...)
    size, extent = a.shape[axis], a.shape[axis + 1]
    if outer > 1:
        a = a.reshape(a.shape[:axis] + (size, outer, extent // outer) + a.shape[axis + 2:])
        a = jnp.swapaxes(a, axis, axis + 1)  # (..., outer, B, E / outer, ...)
        return a.reshape(a.shape[:axis] + (extent * size,) + a.shape[axis + 3:])
    return a.reshape(a.shape[:axis] + (size * extent,) + a.shape[axis + 2:])


def unfold(y: Array, place: Place, size: int) -> Array:
    """The inverse of :func:`fold` on a result: the mapped axis back at ``place``'s axis."""
    axis, outer = place
    extent = y.shape[axis] // size
    if outer == 1:  # B outermost: a free reshape
        return y.reshape(y.shape[:axis] + (size, extent) + y.shape[axis + 1:])
    y = y.reshape(y.shape[:axis] + (outer, size, extent // outer) + y.shape[axis + 1:])
    y = jnp.swapaxes(y, axis, axis + 1)  # (..., B, outer, E / outer, ...)
    return y.reshape(y.shape[:axis + 1] + (extent,) + y.shape[axis + 3:])


def rule(bind: Any, args: tuple[Array, Array], dims: tuple[int | None, int | None], *, kernel: Kernel,
         p: ConvProblem, method: str, **params: Any) -> tuple[Array, int]:
    """The batching rule: ``bind`` (the primitive's) on the folded problem, then unfold."""
    a, b = args
    da, db = dims  # None: not mapped (at least one is)
    size = a.shape[da] if da is not None else b.shape[typing.cast(int, db)]
    if size == 0:  # nothing to compute: no problem of zero groups or zero batch is bound
        pet = params["preferred_element_type"]  # None: the operands' dtype
        return jnp.zeros((0, *kernel.out_shape(p)), a.dtype if pet is None else pet), 0
    f = plan(kernel, p, da is not None, db is not None, size)
    if method not in lowering.CHOOSING and lowering.why_not(method, kernel, f.p) is not None:
        # a forced method the fold would take out of its reach ("shifted" with x alone
        # batched): broadcast the other operand and fold both into the groups
        a, da = (a, da) if da is not None else (jnp.broadcast_to(a, (size, *a.shape)), 0)
        b, db = (b, db) if db is not None else (jnp.broadcast_to(b, (size, *b.shape)), 0)
        f = plan(kernel, p, True, True, size)
    fa = a if f.a is None or da is None else fold(a, da, f.a)
    fb = b if f.b is None or db is None else fold(b, db, f.b)
    out: Array = bind(fa, fb, kernel=kernel, p=f.p, method=method, **params)
    return unfold(out, f.out, size), f.out[0]
