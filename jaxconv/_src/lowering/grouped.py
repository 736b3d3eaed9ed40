"""Combinators for grouped problems: ``"per_group"`` and ``"block_diagonal"``.

Each reworks a grouped problem into one-group problems and runs them through ``leaf``: the
formulation of the sub-problem's kernel that the backend's table picks, planned by the
chooser (``Plan.sub_plan``) for the backend this kernel call is lowered for. A combinator
never re-enters the ``"auto"`` dispatch and never stages a second ``platform_dependent``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, Kernel, Leaf
from jaxconv._src.lowering.method import Method, grouped_only


# ---------------------------------------------------------------------------
# "per_group" (any kernel, groups > 1): the g groups are independent problems.
# Split each operand along the axis that holds the groups (x and y: the channel
# axis; the filter: its output-role axis, group-major), run each group as a
# one-group problem (its own kernel, as its backend's table picks it), and
# concatenate the results along the same axis. XLA:CPU runs a grouped
# convolution far below the speed of the dense ones it is made of: g dense
# weight gradients were 3.5-9x faster than one grouped convolution on
# N16 28x28-56x56 problems with g = 2..32 (docs/performance.md).
# ---------------------------------------------------------------------------
def _per_group(kernel: Kernel, a: Array, b: Array, p: ConvProblem, *, leaf: Leaf) -> Array:
    g, c = p.groups, p.data.channel_axis
    w_ax = p.filter_layout.spec(swap=p.filter_swap)[0]  # the filter axis of the G*OCg outputs
    sub = dataclasses.replace(p, groups=1, in_channels=p.in_channels // g,
                              out_channels=p.out_channels // g)
    b_ax, out_ax = (c, w_ax) if kernel is Kernel.WEIGHT else (w_ax, c)
    parts = [leaf(kernel, ai, bi, sub)
             for ai, bi in zip(jnp.split(a, g, axis=c), jnp.split(b, g, axis=b_ax))]
    return jnp.concatenate(parts, axis=out_ax)


# ---------------------------------------------------------------------------
# "block_diagonal" (groups > 1): a grouped convolution is the dense one whose
# filter is zero outside the g diagonal blocks,
#     W_dense[g*OCg + oc, h*ICg + ic, k] = W[g*OCg + oc, ic, k] if g == h else 0,
# so the forward and data gradient run the dense problem (its own kernel, as the
# backend's table picks it) on that filter, and the weight gradient is the
# dense one's diagonal blocks. g times the arithmetic, but one dense problem
# of g*ICg channels: XLA:CPU's 3D products of 2-8 channels per group run far
# below the dense speed (docs/performance.md). The off-diagonal blocks are
# selected zeros (not products with 0), so an inf in one group stays there.
# ---------------------------------------------------------------------------
def _filter_to_oik(w: Array, p: ConvProblem) -> tuple[Array, list[int]]:
    """The filter as (O, I, *K), and the permutation that puts it back."""
    spec = list(p.filter_layout.spec(swap=p.filter_swap))
    return jnp.transpose(w, spec), [spec.index(ax) for ax in range(w.ndim)]


def _block_diagonal_filter(w: Array, p: ConvProblem) -> Array:
    g = p.groups
    w_oik, back = _filter_to_oik(w, p)
    o, icg, *k = w_oik.shape
    wg = w_oik.reshape(g, o // g, 1, icg, *k)
    blocks = (jnp.arange(g)[:, None] == jnp.arange(g)[None, :]).reshape(g, 1, g, 1, *[1] * len(k))
    dense = jnp.where(blocks, wg, jnp.zeros((), w.dtype)).reshape(o, g * icg, *k)
    return jnp.transpose(dense, back)


def _block_diagonal(kernel: Kernel, a: Array, b: Array, p: ConvProblem, *, leaf: Leaf) -> Array:
    dense = dataclasses.replace(p, groups=1)
    if kernel is not Kernel.WEIGHT:
        return leaf(kernel, a, _block_diagonal_filter(b, p), dense)
    g = p.groups
    dw_oik, back = _filter_to_oik(leaf(kernel, a, b, dense), dense)
    o, i, *k = dw_oik.shape
    d = dw_oik.reshape(g, o // g, g, i // g, *k)
    return jnp.transpose(jnp.concatenate([d[j, :, j] for j in range(g)], axis=0), back)


PER_GROUP = Method(
    "per_group", "groups > 1: one problem per group",
    {k: functools.partial(_per_group, k) for k in Kernel},
    grouped_only("splits"), combinator=True)
BLOCK_DIAGONAL = Method(
    "block_diagonal", "groups > 1: one dense problem, block-diagonal filter",
    {k: functools.partial(_block_diagonal, k) for k in Kernel},
    grouped_only("expands"), combinator=True)
