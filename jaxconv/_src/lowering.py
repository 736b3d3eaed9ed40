"""The three convolution kernels every jaxconv op lowers to.

Each kernel is one ``lax.conv_general_dilated`` (plus an explicit ``lax.pad``)
whose operands are relabelled through dimension numbers. They read a
:class:`~jaxconv._src.geometry.ConvProblem` (the roles of a forward
convolution ``y = conv(x, W)``) and nothing else:

* :func:`forward`      x, W  -> y
* :func:`data_grad`    dy, W -> dx   (also: the ConvTranspose forward)
* :func:`weight_grad`  x, dy -> dW   (also: the ConvTranspose weight gradient,
  with x and dy swapped, SEMANTICS.md section 1)

Every convolution emitted here is VALID (no padding) and fits its input
exactly: padding and the crop of the never-read remainder are done by
``lax.pad`` (which also takes negative widths). jaxlib 0.10.2's CPU compiler
aborts the process on some strided + dilated convolutions whose padded input
has a remainder (HAZARDS.md section 1); an exact fit never has one, neither
here nor in the transposes JAX derives from these kernels under ``grad``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src.geometry import ConvProblem

Precision = Any  # lax.PrecisionLike
DType = Any  # jnp dtype-like or None

_LOW_PRECISION = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def accumulation_dtype(dtype, preferred_element_type=None):
    """The type a convolution of ``dtype`` inputs accumulates in.

    ``preferred_element_type`` if given; else float32 for float16/bfloat16,
    int32 for integers narrower than 32 bits, and the input dtype otherwise.
    """
    if preferred_element_type is not None:
        return preferred_element_type
    dt = np.dtype(dtype)
    if dt in _LOW_PRECISION:
        return np.dtype(jnp.float32)
    if jnp.issubdtype(dt, jnp.integer) and dt.itemsize < 4:
        return np.dtype(jnp.int32)
    return None


def _conv(lhs, rhs, *, dtype, precision, preferred_element_type, **kwargs) -> jax.Array:
    """``conv_general_dilated`` accumulating in :func:`accumulation_dtype`.

    The result has ``preferred_element_type`` if given, else ``dtype`` (a
    narrow integer result is the wide accumulator cast back, wrapping like C).
    """
    out = lax.conv_general_dilated(
        lhs, rhs, precision=precision,
        preferred_element_type=accumulation_dtype(dtype, preferred_element_type), **kwargs
    )
    return out.astype(preferred_element_type if preferred_element_type is not None else dtype)


def _pad_spatial(a: jax.Array, axes, pads, interior=None) -> jax.Array:
    """``lax.pad`` on the given axes: (low, high) per axis, optional interior."""
    config = [(0, 0, 0)] * a.ndim
    for j, (ax, (lo, hi)) in enumerate(zip(axes, pads)):
        config[ax] = (lo, hi, 0 if interior is None else interior[j])
    if all(c == (0, 0, 0) for c in config):
        return a
    return lax.pad(a, jnp.zeros((), a.dtype), config)


# ---------------------------------------------------------------------------
# Forward:  y[n, g*OCg+oc, o] = sum_{ic,k} x[n, g*ICg+ic, o*S + k*D - pb] W[g*OCg+oc, ic, k]
#
# Pad x by (pb, pe - rem) so the windows fit exactly, then a VALID strided,
# dilated convolution with feature_group_count = groups.
# ---------------------------------------------------------------------------
def forward(x, w, p: ConvProblem, *, precision=None, preferred_element_type=None) -> jax.Array:
    xp = _pad_spatial(x, p.data.spatial_axes, p.fit_pads)
    return _conv(
        xp, w, dtype=x.dtype, precision=precision, preferred_element_type=preferred_element_type,
        window_strides=p.strides, padding="VALID", rhs_dilation=p.dilations,
        dimension_numbers=p.dimension_numbers(), feature_group_count=p.groups,
    )


# ---------------------------------------------------------------------------
# Data gradient:  dx[n, g*ICg+ic, s] = sum_{oc,k,t: t*S + k*D - pb = s} dy[n, g*OCg+oc, t] W[.., ic, k]
#
# Place dy on a grid of step S (interior padding S-1), so that t*S = s + pb - k*D.
# With the flipped kernel index k' = K-1-k, k*D = DK-1 - k'*D and
#     dx[s] = sum_{k'} dyd[s + (pb - DK + 1) + k'*D] * W[K-1-k'],
# a stride-1 correlation of dyd with the flipped kernel, dilation D, padded by
#     low  = DK - 1 - pb                  (negative: crop)
#     high = I + pb - (O-1)*S - 1  = DK - 1 - pe + rem
# so that the output has exactly I elements. The filter plays the transposed
# role: its O axis is the input feature and its I axis the output feature.
# With groups, O = g*OCg must become the per-group input feature: the group
# factor moves from the O axis onto the I axis (a reshape of the small filter).
# ---------------------------------------------------------------------------
def _regroup_for_transpose(w, p: ConvProblem):
    """The filter relabelled for the transposed convolution.

    Returns (filter, (out_feature_axis, in_feature_axis, *spatial_axes)).
    """
    o_ax, i_ax, *sp = p.filter_layout.spec(swap=p.filter_swap)
    w = lax.rev(w, tuple(sp))
    g = p.groups
    if g > 1:
        # O (g*OCg) -> (g, OCg); g moves to just before I; (g, ICg) merge into I.
        # In both orders of the O and I axes, moveaxis(w, o_ax, i_ax) puts g
        # right before I, and after the merge every axis is back in its place.
        shape = w.shape
        w = w.reshape(shape[:o_ax] + (g, shape[o_ax] // g) + shape[o_ax + 1 :])
        w = jnp.moveaxis(w, o_ax, i_ax)
        shape = w.shape
        w = w.reshape(shape[:i_ax] + (g * shape[i_ax + 1],) + shape[i_ax + 2 :])
    return w, (i_ax, o_ax, *sp)


def data_grad(dy, w, p: ConvProblem, *, precision=None, preferred_element_type=None) -> jax.Array:
    pads = []
    for i, o, s, pb, dk in zip(p.input_size, p.output_size, p.strides, p.pads_begin, p.dilated_kernel):
        pads.append((dk - 1 - pb, i + pb - (o - 1) * s - 1))
    interior = [s - 1 for s in p.strides]
    dyd = _pad_spatial(dy, p.data.spatial_axes, pads, interior)
    wt, rhs_spec = _regroup_for_transpose(w, p)
    spec = p.data.spec
    return _conv(
        dyd, wt, dtype=dy.dtype, precision=precision,
        preferred_element_type=preferred_element_type,
        window_strides=(1,) * p.rank, padding="VALID", rhs_dilation=p.dilations,
        dimension_numbers=lax.ConvDimensionNumbers(spec, rhs_spec, spec),
        feature_group_count=p.groups,
    )


# ---------------------------------------------------------------------------
# Weight gradient:  dW[g*OCg+oc, ic, k] = sum_{n,t} x[n, g*ICg+ic, t*S + k*D - pb] dy[n, g*OCg+oc, t]
#
# Read it as a convolution over the spatial axis with the roles relabelled:
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
# ---------------------------------------------------------------------------
def weight_grad(x, dy, p: ConvProblem, *, precision=None, preferred_element_type=None) -> jax.Array:
    xp = _pad_spatial(x, p.data.spatial_axes, p.fit_pads)
    d = p.data
    lhs_spec = (d.channel_axis, d.batch_axis, *d.spatial_axes)
    rhs_spec = (d.channel_axis, d.batch_axis, *d.spatial_axes)
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    out_spec = (i_ax, o_ax, *w_sp)
    return _conv(
        xp, dy, dtype=x.dtype, precision=precision, preferred_element_type=preferred_element_type,
        window_strides=p.dilations, padding="VALID", rhs_dilation=p.strides,
        dimension_numbers=lax.ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec),
        batch_group_count=p.groups,
    )


# Jitted entry points: the problem and the options are static (hashable).
_STATIC = ("p", "precision", "preferred_element_type")
jit_forward = jax.jit(forward, static_argnames=_STATIC)
jit_data_grad = jax.jit(data_grad, static_argnames=_STATIC)
jit_weight_grad = jax.jit(weight_grad, static_argnames=_STATIC)
