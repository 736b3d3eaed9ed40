"""Formulations as one ``lax.conv_general_dilated`` with relabelled operands.

Methods: ``"conv"`` (forward, weight gradient), ``"feature_group"`` (weight gradient of a
grouped problem), ``"vjp"`` (data and weight gradients: the program ``jax.vjp`` emits) and
``"grid"`` (data gradient). Except ``"vjp"``, none puts an input dilation inside a
convolution, and padding stays explicit wherever the transposes JAX derives under ``grad``
would otherwise reach the pattern that aborts jaxlib 0.10.2 on CPU (docs/semantics.md, "A
toolchain hazard", tests/core/test_hazards.py); ``"vjp"`` hands problems with both a stride and a
dilation to a safe form.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import common
from jaxconv._src.lowering.common import Pads
from jaxconv._src.lowering.method import Method, grouped_only

_RelabelledMethod = Literal["conv", "feature_group", "vjp"]


# ---------------------------------------------------------------------------
# Forward:  y[n, g*OCg+oc, o] = sum_{ic,k} x[n, g*ICg+ic, o*S + k*D - pb] W[g*OCg+oc, ic, k]
#
# "conv": one strided, dilated convolution, feature_group_count = g, with x's
# padding (pb, pe - rem: the never-read remainder cropped) inside it, at most
# the dilated window's extent less one per side (common.fit; the rest explicit).
# On a problem with a stride and a dilation the transposes JAX derives from
# padding inside abort jaxlib 0.10.2 (tests/core/test_hazards.py): there the primal
# keeps that form and a custom_jvp sends every derivative through the form
# with all of the padding explicit (a lax.pad, then VALID), as the weight
# gradient's "conv" does. An explicit pad is a copy of x that XLA materializes,
# a few microseconds on the smallest problems: the primal keeps the fast form.
# ---------------------------------------------------------------------------
def _forward_conv(x: Array, w: Array, p: ConvProblem, precision: Precision,
                  preferred_element_type: DType) -> Array:
    def kernel(x: Array, w: Array, inside: bool) -> Array:
        caps = [(k - 1) * d if inside else 0 for k, d in zip(p.kernel, p.dilations)]
        xp, pads = common.fit(x, p.data.spatial_axes, p.fit_pads, caps)
        return common.conv(
            xp, w, dtype=x.dtype, precision=precision,
            preferred_element_type=preferred_element_type, window_strides=p.strides,
            padding=pads, rhs_dilation=p.dilations, dimension_numbers=p.dimension_numbers(),
            feature_group_count=p.groups,
        )

    if not common.strided_and_dilated(p):
        return kernel(x, w, inside=True)

    @jax.custom_jvp
    def fast(x: Array, w: Array) -> Array:
        return kernel(x, w, inside=True)

    @fast.defjvp
    def _(primals: tuple[Array, Array],
          tangents: tuple[Array, Array]) -> tuple[Array, Array]:
        (x, w), (tx, tw) = primals, tangents
        return fast(x, w), kernel(tx, w, inside=False) + kernel(x, tw, inside=False)

    return fast(x, w)


# ---------------------------------------------------------------------------
# Data gradient:  dx[n, g*ICg+ic, s] = sum_{oc,k,t: t*S + k*D - pb = s} dy[n, g*OCg+oc, t] W[.., ic, k]
#
# Place dy on a grid of step S (lhs_dilation S), so that t*S = s + pb - k*D.
# With the flipped kernel index k' = K-1-k, k*D = DK-1 - k'*D and
#     dx[s] = sum_{k'} dyd[s + (pb - DK + 1) + k'*D] * W[K-1-k'],
# a stride-1 correlation of dyd with the flipped kernel, dilation D, padded by
#     low  = DK - 1 - pb                  (negative: crop)
#     high = I + pb - (O-1)*S - 1  = DK - 1 - pe + rem
# so that the output has exactly I elements. The filter plays the transposed
# role: its O axis is the input feature and its I axis the output feature.
# With groups, O = g*OCg must become the per-group input feature: the group
# factor moves from the O axis onto the I axis (a reshape of the small filter).
#
# "vjp": exactly that convolution with the grid inside it (lhs_dilation = S)
# and the padding inside it: the program jax.vjp emits. With a stride and a
# dilation it can abort jaxlib 0.10.2, so those problems take "grid".
# "grid": the grid built by an explicit lax.pad (interior padding S-1,
# negative widths crop), so that no convolution with an input dilation
# reaches XLA: with one, the transposes JAX derives under grad abort jaxlib
# 0.10.2. Without a stride there is no grid, and the padding goes inside.
# ---------------------------------------------------------------------------
def regroup_for_transpose(w: Array, p: ConvProblem,
                           flip: bool = True) -> tuple[Array, tuple[int, ...]]:
    """The filter relabelled for the transposed convolution (then spatially flipped).

    The same steps as JAX's transpose rule (so that ``"vjp"`` is its program):
    with groups, O (``g*OCg``) splits into ``(g, OCg)`` and ``g`` merges into I,
    group-major. Returns (filter, (out_feature_axis, in_feature_axis, *spatial_axes)).
    """
    o_ax, i_ax, *sp = p.filter_layout.spec(swap=p.filter_swap)
    g = p.groups
    if g > 1:
        shape = w.shape
        w = w.reshape(shape[:o_ax] + (g, shape[o_ax] // g) + shape[o_ax + 1 :])
        # g (now at o_ax) moves to just before I and merges with it; every other axis
        # is back in its place (lax.reshape with a permutation, as JAX's rule does).
        perm = [a for a in range(w.ndim) if a != o_ax]
        perm.insert(i_ax, o_ax)
        new_shape = [n for a, n in enumerate(w.shape) if a != o_ax]
        new_shape[i_ax] *= g
        w = lax.reshape(w, new_shape, perm)
    if flip:
        w = lax.rev(w, tuple(sp))
    return w, (i_ax, o_ax, *sp)


def _transpose_pads(p: ConvProblem) -> list[tuple[int, int]]:
    """(DK - 1 - pb, I + pb - (O-1)*S - 1) per axis: the grid convolution's padding."""
    return [(dk - 1 - pb, i + pb - (o - 1) * s - 1) for i, o, s, pb, dk in
            zip(p.input_size, p.output_size, p.strides, p.pads_begin, p.dilated_kernel)]


def _data_grad_vjp(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                   preferred_element_type: DType) -> Array:
    if common.strided_and_dilated(p):
        return _data_grad_grid(dy, w, p, precision, preferred_element_type)
    wt, rhs_spec = regroup_for_transpose(w, p)
    spec = p.data.spec
    return common.conv(
        dy, wt, dtype=dy.dtype, precision=precision,
        preferred_element_type=preferred_element_type, padding=_transpose_pads(p),
        window_strides=(1,) * p.rank, lhs_dilation=p.strides, rhs_dilation=p.dilations,
        dimension_numbers=lax.ConvDimensionNumbers(spec, rhs_spec, spec),
        feature_group_count=p.groups,
    )


def _data_grad_grid(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                    preferred_element_type: DType) -> Array:
    pads = _transpose_pads(p)
    wt, rhs_spec = regroup_for_transpose(w, p)
    spec = p.data.spec
    padding: str | Pads
    if all(s == 1 for s in p.strides) and all(lo >= 0 and hi >= 0 for lo, hi in pads):
        # No grid: the padding goes inside the convolution (what jax.vjp emits; an
        # explicit pad is materialized). Without a stride the transposes JAX derives
        # from it are plain convolutions too: the hazard needs a stride and a dilation.
        lhs, padding = dy, pads
    else:
        # Explicit grid (lax.pad with interior padding) + VALID: an input dilation
        # inside the convolution aborts jaxlib 0.10.2 under grad (tests/core/test_hazards.py).
        lhs = common.pad_spatial(dy, p.data.spatial_axes, pads, [s - 1 for s in p.strides])
        padding = "VALID"
    return common.conv(
        lhs, wt, dtype=dy.dtype, precision=precision,
        preferred_element_type=preferred_element_type, padding=padding,
        window_strides=(1,) * p.rank, rhs_dilation=p.dilations,
        dimension_numbers=lax.ConvDimensionNumbers(spec, rhs_spec, spec),
        feature_group_count=p.groups,
    )


# Stride phases: split the output positions s = r + S*u by their phase r in
# [0, S). A tap k reaches phase r iff (r + pb - k*D) % S == 0, and then reads
# dy[u + c_k] with c_k = (r + pb - k*D) / S. Those taps are k0, k0 + step, ...
# with step = S / gcd(S, D), and c_k falls by D' = D / gcd(S, D) per tap, so
#     dx_r[u] = sum_j dy[u + c_last + j*D'] * W[k_last - j*step]
# is a stride-1 correlation with the reversed sub-kernel, dilation D', on dy
# padded (or cropped) by -c_last at the start, with ceil(I / S) outputs. The

# ---------------------------------------------------------------------------
# Weight gradient:  dW[g*OCg+oc, ic, k] = sum_{n,t} x[n, g*ICg+ic, t*S + k*D - pb] dy[n, g*OCg+oc, t]
#
# "conv": read it as a convolution over the spatial axes with the roles relabelled:
#   lhs  = padded x, with its C axis as the *batch* and its N axis as the feature,
#   rhs  = dy, with its C axis as the output feature and its N axis as the input
#          feature (the sum over n is the feature contraction),
#   window over x: dy's O positions, dilated by S (rhs_dilation = S),
#   output position k moves the window by D (window_strides = D).
# The padded x holds (K-1)*D + (O-1)*S + 1 elements (the exact fit), so the
# output has exactly K positions. Groups: batch_group_count = g splits the lhs
# batch (x's channels, group-major) and the output feature (dy's channels)
# into matching groups, leaving ICg in the output batch. The output dimension
# numbers put batch -> the filter's I axis, feature -> O, spatial -> X, so the
# result comes out directly in the requested filter format.
#
# "vjp": that convolution with all of the padding (pb, pe - rem) inside it,
# negative widths included: the program jax.vjp emits. "conv" keeps inside at
# most what the windows read and crops the rest explicitly (see common.fit).
#
# "feature_group": XLA expands batch_group_count into g times the work. Move
# the group factor of x's channels next to its batch instead, group-major
# (one transpose of x), so that the lhs feature axis is (g, N) and
# feature_group_count = g pairs group j of x with group j of dy.
# ---------------------------------------------------------------------------
def _weight_grad_conv(x: Array, dy: Array, p: ConvProblem, precision: Precision,
                      preferred_element_type: DType, *, method: _RelabelledMethod) -> Array:
    """The "conv", "feature_group" and "vjp" methods: one relabelled convolution.

    Its padding goes inside the convolution (an explicit ``lax.pad`` is
    materialized by XLA: 2x on N16 C64 56x56 k3). On a problem with a stride
    and a dilation (on any axes) the transposes JAX derives from that
    convolution for second-order grads abort jaxlib 0.10.2
    (tests/core/test_hazards.py), so there the primal keeps the fast form ("vjp"
    there takes the form of "conv") and a ``custom_jvp`` makes every
    derivative go through the explicitly padded form instead: the kernel is
    bilinear, so its JVP is ``wgrad(tx, dy) + wgrad(x, tdy)``, and JAX never
    transposes the fast one.
    """
    kernel = functools.partial(_relabelled_weight_grad, p=p, method=method, precision=precision,
                               preferred_element_type=preferred_element_type)
    if not common.strided_and_dilated(p):
        return kernel(x, dy, inside="all" if method == "vjp" else "capped")

    @jax.custom_jvp
    def fast(x: Array, dy: Array) -> Array:
        return kernel(x, dy, inside="capped")

    @fast.defjvp
    def _(primals: tuple[Array, Array],
          tangents: tuple[Array, Array]) -> tuple[Array, Array]:
        (x, dy), (tx, tdy) = primals, tangents
        return fast(x, dy), kernel(tx, dy, inside="none") + kernel(x, tdy, inside="none")

    return fast(x, dy)


def _relabelled_weight_grad(x: Array, dy: Array, *, p: ConvProblem, method: _RelabelledMethod,
                            precision: Precision, preferred_element_type: DType,
                            inside: Literal["all", "capped", "none"]) -> Array:
    """``inside``: "all" the padding (jax.vjp's program), "capped" (see ``_fit``) or "none"."""
    d = p.data
    if inside == "all":
        xc, pads = x, list(p.fit_pads)
    else:
        caps = [(o - 1) * s if inside == "capped" else 0 for o, s in zip(p.output_size, p.strides)]
        xc, pads = common.fit(x, d.spatial_axes, p.fit_pads, caps)
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    out_spec = (i_ax, o_ax, *w_sp)
    rhs_spec = (d.channel_axis, d.batch_axis, *d.spatial_axes)
    shared: dict[str, Any] = dict(
        dtype=x.dtype, precision=precision, preferred_element_type=preferred_element_type,
        window_strides=p.dilations, padding=pads, rhs_dilation=p.strides,
    )
    if method == "feature_group" and p.groups > 1:
        g = p.groups
        xn = jnp.transpose(xc, d.spec)  # (N, C, *X)
        nb, c, *sp = xn.shape
        xg = jnp.moveaxis(xn.reshape(nb, g, c // g, *sp), 1, 0).reshape(g * nb, c // g, *sp)
        lhs_spec = (1, 0, *range(2, 2 + p.rank))  # batch = ICg, feature = (g, N)
        return common.conv(xg, dy, dimension_numbers=lax.ConvDimensionNumbers(
            lhs_spec, rhs_spec, out_spec), feature_group_count=g, **shared)
    lhs_spec = (d.channel_axis, d.batch_axis, *d.spatial_axes)
    return common.conv(xc, dy,
                       dimension_numbers=lax.ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec),
                       batch_group_count=p.groups, **shared)


CONV = Method(
    "conv", "one ``lax.conv_general_dilated``",
    {Kernel.FORWARD: _forward_conv,
     Kernel.WEIGHT: functools.partial(_weight_grad_conv, method="conv")})
FEATURE_GROUP = Method(
    "feature_group", "groups > 1: one convolution with ``feature_group_count``",
    {Kernel.WEIGHT: functools.partial(_weight_grad_conv, method="feature_group")},
    grouped_only("regroups"))
VJP = Method(
    "vjp", "the program ``jax.vjp`` emits",
    {Kernel.DATA: _data_grad_vjp,
     Kernel.WEIGHT: functools.partial(_weight_grad_conv, method="vjp")})
GRID = Method(
    "grid", "one convolution over ``dy`` spread on a grid of step S",
    {Kernel.DATA: _data_grad_grid})
