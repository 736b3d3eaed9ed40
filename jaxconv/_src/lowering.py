"""The three convolution kernels every jaxconv op lowers to.

Each kernel reads a :class:`~jaxconv._src.geometry.ConvProblem` (the roles of
a forward convolution ``y = conv(x, W)``) and nothing else:

* :func:`forward`      x, W  -> y
* :func:`data_grad`    dy, W -> dx   (also: the ConvTranspose forward)
* :func:`weight_grad`  x, dy -> dW   (also: the ConvTranspose weight gradient,
  with x and dy swapped: docs/semantics.md)

Each kernel has formulations (``method``, the ops' ``lowering=`` argument):
one ``lax.conv_general_dilated`` whose operands are relabelled through
dimension numbers, or per-kernel-tap products (``dot_general`` over strided
slices, or multiply-adds for depthwise problems). ``"auto"`` stages the choice
of every backend's table (``backends.py``) with ``lax.platform_dependent``, so
one traced program picks the right one on CPU, GPU and TPU. Except ``"vjp"``
(JAX's own program), no formulation puts an input dilation inside a
convolution, and padding stays explicit (``lax.pad``, which also crops with
negative widths) wherever the transposes JAX derives under ``grad`` would
otherwise reach the pattern that aborts jaxlib 0.10.2 on CPU (the strided +
dilated convolution bug: docs/semantics.md, "A toolchain hazard", tests/test_hazards.py);
``"vjp"`` hands problems with both a stride and a dilation to a safe form.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import backends
from jaxconv._src.geometry import ConvProblem

Array = jax.Array
#: precision as the kernels get it: validated and hashable (``options.compute_options``)
Precision = Any
#: a numpy dtype, or None for "the input dtype"
DType = Any
Pads = Sequence[tuple[int, int]]
WeightGradMethod = Literal["conv", "feature_group", "shifted", "dot", "vjp", "per_group",
                           "block_diagonal"]
DataGradMethod = Literal["grid", "phases", "dot", "vjp", "per_group", "block_diagonal"]

_LOW_PRECISION = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def accumulation_dtype(dtype: DType, preferred_element_type: DType = None) -> DType:
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


def _conv(lhs: Array, rhs: Array, *, dtype: DType, precision: Precision,
          preferred_element_type: DType, **kwargs: Any) -> Array:
    """``conv_general_dilated`` accumulating in :func:`accumulation_dtype`.

    The result has ``preferred_element_type`` if given, else ``dtype`` (a
    narrow integer result is the wide accumulator cast back, wrapping like C).
    """
    out = lax.conv_general_dilated(
        lhs, rhs, precision=precision,
        preferred_element_type=accumulation_dtype(dtype, preferred_element_type), **kwargs
    )
    return out.astype(preferred_element_type if preferred_element_type is not None else dtype)


def _pad_spatial(a: Array, axes: Sequence[int], pads: Pads,
                 interior: Sequence[int] | None = None) -> Array:
    """``lax.pad`` on the given axes: (low, high) per axis, optional interior."""
    config = [(0, 0, 0)] * a.ndim
    for j, (ax, (lo, hi)) in enumerate(zip(axes, pads)):
        config[ax] = (lo, hi, 0 if interior is None else interior[j])
    if all(c == (0, 0, 0) for c in config):
        return a
    return lax.pad(a, jnp.zeros((), a.dtype), config)


def _fit(a: Array, axes: Sequence[int], pads: Pads,
         caps: Sequence[int]) -> tuple[Array, list[tuple[int, int]]]:
    """Splits (low, high) pads between ``a`` and the convolution's own padding.

    The convolution gets ``min(pad, cap)`` of each non-negative pad: padding
    inside the convolution is what XLA handles best (an explicit ``lax.pad``
    is materialized). Negative pads crop ``a``; padding beyond ``cap`` is
    applied explicitly. ``cap`` is the window's dilated extent minus one: the
    transposes JAX derives under ``grad`` then never get a negative pad next to
    an input dilation, the pattern that aborts jaxlib 0.10.2 (docs/semantics.md).
    """
    config = [(0, 0, 0)] * a.ndim
    conv_pads = []
    for ax, (lo, hi), cap in zip(axes, pads, caps):
        in_lo, in_hi = min(max(lo, 0), cap), min(max(hi, 0), cap)
        config[ax] = (lo - in_lo, hi - in_hi, 0)
        conv_pads.append((in_lo, in_hi))
    if any(c != (0, 0, 0) for c in config):
        a = lax.pad(a, jnp.zeros((), a.dtype), config)  # negative widths crop
    return a, conv_pads


# ---------------------------------------------------------------------------
# Forward:  y[n, g*OCg+oc, o] = sum_{ic,k} x[n, g*ICg+ic, o*S + k*D - pb] W[g*OCg+oc, ic, k]
#
# "conv": pad x by (pb, pe - rem) so the windows fit exactly (the never-read
# remainder is cropped), then a VALID strided, dilated convolution,
# feature_group_count = g.
# "dot": the same sum read tap by tap. For each kernel offset k the window
# x[o*S + k*D] over all o is one strided slice of padded x, and
#     y = sum_k slice_k(x) . W[:, :, k]
# contracts the channels with one dot_general per tap, batched over the groups
# (no grouped convolution reaches XLA).
# "shifted" (ICg = 1: depthwise, channel multiplier m = OCg): the per-tap
# product has nothing to contract, y = sum_k slice_k(x) * W[:, 0, k] is a
# multiply-add XLA fuses into one loop over y.
# ---------------------------------------------------------------------------
def _forward_conv(x: Array, w: Array, p: ConvProblem, precision: Precision,
                  preferred_element_type: DType) -> Array:
    # Explicit lax.pad + VALID: padding inside this convolution would let the
    # transpose JAX derives for grad abort jaxlib 0.10.2 (tests/test_hazards.py).
    xp = _pad_spatial(x, p.data.spatial_axes, p.fit_pads)
    return _conv(
        xp, w, dtype=x.dtype, precision=precision, preferred_element_type=preferred_element_type,
        window_strides=p.strides, padding="VALID", rhs_dilation=p.dilations,
        dimension_numbers=p.dimension_numbers(), feature_group_count=p.groups,
    )


def _forward_taps(x: Array, w: Array, p: ConvProblem, precision: Precision,
                  preferred_element_type: DType, *, elementwise: bool = False) -> Array:
    d, g = p.data, p.groups
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    icg, ocg = p.in_channels // g, p.out_channels // g
    xl = _channels_last(_pad_spatial(x, d.spatial_axes, p.fit_pads), p)
    # (ICg, G*OCg, *K) -> (G, ICg, OCg, *K): O is group-major
    wc = jnp.moveaxis(jnp.transpose(w, (i_ax, o_ax, *w_sp)).reshape(icg, g, ocg, *p.kernel), 1, 0)
    reads = []
    for k in np.ndindex(*p.kernel):
        starts = [kk * dl for kk, dl in zip(k, p.dilations)]
        reads.append((starts, p.output_size, p.strides, k))
    acc = accumulation_dtype(x.dtype, preferred_element_type)
    y = _tap_products(xl, wc, reads, precision, acc, elementwise=elementwise)
    return _from_channels_last(y, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


_FORWARD: dict[str, Callable[..., Array]] = {
    "conv": _forward_conv,
    "dot": _forward_taps,
    "shifted": functools.partial(_forward_taps, elementwise=True),
    "per_group": lambda x, w, p, **kw: _per_group("forward", x, w, p, **kw),
    "block_diagonal": lambda x, w, p, **kw: _block_diagonal("forward", x, w, p, **kw),
}
FORWARD_METHODS = tuple(_FORWARD)


def forward(x: Array, w: Array, p: ConvProblem, *, precision: Precision = None,
            preferred_element_type: DType = None, method: str = "auto") -> Array:
    """y from x and W; ``method`` one of :data:`FORWARD_METHODS` or ``"auto"``."""
    return _dispatch(_FORWARD, backends.forward_method, x, w, p, precision,
                     preferred_element_type, method)


def strided_and_dilated(p: ConvProblem) -> bool:
    """A stride and a dilation (on any axes): where JAX's own transposes can abort jaxlib 0.10.2.

    The aborting pattern (docs/semantics.md, "A toolchain hazard") needs both; ``"vjp"`` hands such
    problems to a form that keeps the padding explicit.
    """
    return any(s > 1 for s in p.strides) and any(d > 1 for d in p.dilations)


def _dispatch(kernels: dict[str, Callable[..., Array]], choose: Callable[[ConvProblem, str], str],
              a: Array, b: Array, p: ConvProblem, precision: Precision,
              preferred_element_type: DType, method: str) -> Array:
    """``kernels[method](a, b)``; for ``"auto"``, the method of ``choose(p, backend)`` per backend.

    The per-backend choice is staged with ``lax.platform_dependent``: the
    platform the program is lowered for keeps its branch (the compiler never
    sees the others). When every backend picks the same method, that method is
    called directly.
    """
    def branch(m: str) -> Callable[[Array, Array], Array]:
        if m not in kernels:
            raise ValueError(f"lowering: method must be 'auto' or one of {list(kernels)}, got {m!r}")
        return functools.partial(kernels[m], p=p, precision=precision,
                                 preferred_element_type=preferred_element_type)
    if method != "auto":
        return branch(method)(a, b)
    methods = {bk: choose(p, bk) for bk in backends.BACKENDS}
    if len(set(methods.values())) == 1:
        return branch(methods["cpu"])(a, b)
    fns = {m: branch(m) for m in set(methods.values())}  # one callable per method: joined
    per_platform = {plat: fns[methods[bk]] for bk in backends.BACKENDS
                    for plat in backends.PLATFORMS[bk]}
    out: Array = lax.platform_dependent(a, b, default=fns[methods["default"]], **per_platform)
    return out


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
#: the methods that rework a grouped problem, and what each does to it (for messages)
_NEEDS_GROUPS = {"feature_group": "regroups", "per_group": "splits", "block_diagonal": "expands"}


def method_inapplicable(method: str, p: ConvProblem) -> str | None:
    """Why a forced method (of any kernel: a name means the same in each) does not apply to
    ``p``, or None if it does."""
    if method == "shifted" and p.in_channels != p.groups:
        return (f"'shifted' needs one input channel per group (depthwise), got "
                f"{p.in_channels} input channels in {p.groups} group(s)")
    if method in _NEEDS_GROUPS and p.groups == 1:
        return f"'{method}' {_NEEDS_GROUPS[method]} a grouped problem, got groups=1"
    return None


def _per_group(kind: Literal["forward", "data", "weight"], a: Array, b: Array, p: ConvProblem,
               precision: Precision, preferred_element_type: DType) -> Array:
    g, c = p.groups, p.data.channel_axis
    w_ax = p.filter_layout.spec(swap=p.filter_swap)[0]  # the filter axis of the G*OCg outputs
    sub = dataclasses.replace(p, groups=1, in_channels=p.in_channels // g,
                              out_channels=p.out_channels // g)
    kernel = {"forward": forward, "data": data_grad, "weight": weight_grad}[kind]
    b_ax, out_ax = {"forward": (w_ax, c), "data": (w_ax, c), "weight": (c, w_ax)}[kind]
    parts = [kernel(ai, bi, sub, precision=precision, preferred_element_type=preferred_element_type)
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


def _block_diagonal(kind: Literal["forward", "data", "weight"], a: Array, b: Array, p: ConvProblem,
                    precision: Precision, preferred_element_type: DType) -> Array:
    dense = dataclasses.replace(p, groups=1)
    kw = dict(precision=precision, preferred_element_type=preferred_element_type)
    if kind == "forward":
        return forward(a, _block_diagonal_filter(b, p), dense, **kw)
    if kind == "data":
        return data_grad(a, _block_diagonal_filter(b, p), dense, **kw)
    g = p.groups
    dw_oik, back = _filter_to_oik(weight_grad(a, b, dense, **kw), dense)
    o, i, *k = dw_oik.shape
    d = dw_oik.reshape(g, o // g, g, i // g, *k)
    return jnp.transpose(jnp.concatenate([d[j, :, j] for j in range(g)], axis=0), back)


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
def _regroup_for_transpose(w: Array, p: ConvProblem,
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
    if strided_and_dilated(p):
        return _data_grad_grid(dy, w, p, precision, preferred_element_type)
    wt, rhs_spec = _regroup_for_transpose(w, p)
    spec = p.data.spec
    return _conv(
        dy, wt, dtype=dy.dtype, precision=precision,
        preferred_element_type=preferred_element_type, padding=_transpose_pads(p),
        window_strides=(1,) * p.rank, lhs_dilation=p.strides, rhs_dilation=p.dilations,
        dimension_numbers=lax.ConvDimensionNumbers(spec, rhs_spec, spec),
        feature_group_count=p.groups,
    )


def _data_grad_grid(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                    preferred_element_type: DType) -> Array:
    pads = _transpose_pads(p)
    wt, rhs_spec = _regroup_for_transpose(w, p)
    spec = p.data.spec
    padding: str | Pads
    if all(s == 1 for s in p.strides) and all(lo >= 0 and hi >= 0 for lo, hi in pads):
        # No grid: the padding goes inside the convolution (what jax.vjp emits; an
        # explicit pad is materialized). Without a stride the transposes JAX derives
        # from it are plain convolutions too: the hazard needs a stride and a dilation.
        lhs, padding = dy, pads
    else:
        # Explicit grid (lax.pad with interior padding) + VALID: an input dilation
        # inside the convolution aborts jaxlib 0.10.2 under grad (tests/test_hazards.py).
        lhs = _pad_spatial(dy, p.data.spatial_axes, pads, [s - 1 for s in p.strides])
        padding = "VALID"
    return _conv(
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
# phases are then interleaved: dx[r + S*u] = dx_r[u]. No input dilation and no
# zero grid: S^rank times less work than the grid form.
def _channels_last(a: Array, p: ConvProblem) -> Array:
    """An array in the data layout as (N, *X, C)."""
    d = p.data
    return jnp.transpose(a, (d.batch_axis, *d.spatial_axes, d.channel_axis))


def _from_channels_last(a: Array, p: ConvProblem) -> Array:
    """(N, *X, C) back to the data layout."""
    d = p.data
    spec = (d.batch_axis, *d.spatial_axes, d.channel_axis)
    return jnp.transpose(a, [spec.index(ax) for ax in range(a.ndim)])


Read = tuple[Sequence[int], Sequence[int], Sequence[int], tuple[int, ...]]


def _tap_products(a: Array, wc: Array, reads: Sequence[Read], precision: Precision, acc: DType,
                  *, elementwise: bool = False) -> Array:
    """``sum_j window_j(a) . wc[..., tap_j]``, contracting the channels: the per-tap kernels.

    ``a`` is channels-last (N, *X, G*Cin_g); ``wc`` is (G, Cin_g, Cout_g, *K); each read is
    (starts, counts, steps, tap): the window ``a[start + u*step]`` for ``u < count`` on each
    spatial axis, multiplied by the filter tap ``tap``. The contraction is one
    ``dot_general`` per tap, batched over the groups when there are several (no XLA
    grouped convolution). With one group there is no batch dimension: a size-1 batch
    dimension next to the contracted ones is what aborted XLA:GPU's Triton GEMM fusion
    (docs/performance.md). ``elementwise`` (Cin_g = 1) multiplies instead of contracting,
    a multiply-add XLA fuses. Returns (N, *U, G*Cout_g) in ``acc`` (the input dtype if None).
    """
    g, cin, cout = wc.shape[:3]
    n = a.ndim - 2
    flat = elementwise and cout == 1  # no size-1 minor axis: it costs XLA:CPU its vectorization
    if (g > 1 or elementwise) and not flat:
        a = a.reshape(*a.shape[:-1], g, cin)  # (N, *X, G, Cin_g)
    total: Array | None = None
    for starts, counts, steps, tap in reads:
        lo = [0, *starts, *(0,) * (a.ndim - 1 - n)]
        hi = [a.shape[0], *(s + (c - 1) * st + 1 for s, c, st in zip(starts, counts, steps)),
              *a.shape[n + 1:]]
        window = lax.slice(a, lo, hi, [1, *steps, *(1,) * (a.ndim - 1 - n)])
        wk = wc[(slice(None),) * 3 + tuple(tap)]  # (G, Cin_g, Cout_g)
        if elementwise:  # (N, *U, G, 1) * (G, Cout_g), or (N, *U, G) * (G,) when flat
            wk = wk[:, 0, 0] if flat else wk[:, 0]
            wk = wk.reshape((1,) * (window.ndim - wk.ndim) + wk.shape)  # explicit broadcast
            part = window * wk if acc is None else window.astype(acc) * wk.astype(acc)
        elif g > 1:  # -> (G, N, *U, Cout_g)
            part = lax.dot_general(window, wk, (((n + 2,), (1,)), ((n + 1,), (0,))),
                                   precision=precision, preferred_element_type=acc)
        else:  # -> (N, *U, Cout)
            part = lax.dot_general(window, wk[0], (((n + 1,), (0,)), ((), ())),
                                   precision=precision, preferred_element_type=acc)
        total = part if total is None else total + part
    assert total is not None  # at least one tap
    if flat:
        return total
    if elementwise:
        return total.reshape(*total.shape[:-2], g * cout)
    if g > 1:
        return jnp.moveaxis(total, 0, -2).reshape(*total.shape[1:-1], g * cout)
    return total


def _phase_dots(dyp: Array, w: Array, p: ConvProblem, taps: Sequence[Sequence[int]],
                u_max: Sequence[int], dil: Sequence[int], precision: Precision,
                preferred_element_type: DType) -> Array:
    """One phase of the "dot" data gradient: ``dx_r[u] = sum_j dyp[u + j*D'] W[taps[j]]``.

    The channel contraction (OCg -> ICg) is :func:`_tap_products`'. Returns the
    phase in the data layout.
    """
    g = p.groups
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    ocg, icg = p.out_channels // g, p.in_channels // g
    wc = jnp.transpose(w, (o_ax, i_ax, *w_sp)).reshape(g, ocg, icg, *p.kernel)
    reads = [([jj * dd for jj, dd in zip(j, dil)], u_max, (1,) * p.rank,
              tuple(t[jj] for t, jj in zip(taps, j)))
             for j in itertools.product(*(range(len(t)) for t in taps))]
    acc = accumulation_dtype(dyp.dtype, preferred_element_type)
    total = _tap_products(_channels_last(dyp, p), wc, reads, precision, acc,
                          elementwise=g > 1 and ocg == icg == 1)  # depthwise: multiply-adds
    return _from_channels_last(total, p).astype(
        preferred_element_type if preferred_element_type is not None else dyp.dtype)


def _data_grad_phases(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                      preferred_element_type: DType, dot: bool = False) -> Array:
    _, _, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    d = p.data
    n = p.rank
    # per spatial axis: [(taps (k list, decreasing), c_last) or None per phase]
    phase_axes: list[list[tuple[list[int], int] | None]] = []
    for i, k, s, dl, pb in zip(p.input_size, p.kernel, p.strides, p.dilations, p.pads_begin):
        per: list[tuple[list[int], int] | None] = []
        for r in range(s):
            taps = [kk for kk in range(k) if (r + pb - kk * dl) % s == 0]
            per.append(None if not taps else (taps[::-1], (r + pb - taps[-1] * dl) // s))
        phase_axes.append(per)
    u_max = [-(-i // s) for i, s in zip(p.input_size, p.strides)]
    dil = [dl // math.gcd(s, dl) for s, dl in zip(p.strides, p.dilations)]
    out_dtype = preferred_element_type if preferred_element_type is not None else dy.dtype
    parts = {}
    for combo in itertools.product(*(range(s) for s in p.strides)):
        picked = [phase_axes[a][r] for a, r in enumerate(combo)]
        sel = [v for v in picked if v is not None]
        if len(sel) < n:  # a phase no tap reaches: zeros
            continue
        # dy padded (or cropped) so that the phase's taps read u + j*D' for u < ceil(I / S)
        pads = []
        for (taps, c_last), o, u, dd in zip(sel, p.output_size, u_max, dil):
            span = (len(taps) - 1) * dd + 1
            pads.append((-c_last, u - 1 + span + c_last - o))
        dyp = _pad_spatial(dy, d.spatial_axes, pads)
        if dot:
            parts[combo] = _phase_dots(dyp, w, p, [t for t, _ in sel], u_max, dil, precision,
                                       preferred_element_type)
            continue
        # sub-kernel: taps in decreasing k (the reversal), on each spatial axis of the filter
        wsub = w
        for ax, (taps, _) in zip(w_sp, sel):
            wsub = jnp.take(wsub, np.asarray(taps), axis=ax)
        wt, rhs_spec = _regroup_for_transpose(wsub, p, flip=False)  # taps already reversed
        spec = d.spec
        parts[combo] = _conv(
            dyp, wt, dtype=dy.dtype, precision=precision,
            preferred_element_type=preferred_element_type, padding="VALID",
            window_strides=(1,) * n, rhs_dilation=tuple(dil),
            dimension_numbers=lax.ConvDimensionNumbers(spec, rhs_spec, spec),
            feature_group_count=p.groups)
    some = next(iter(parts.values()))
    zeros = jnp.zeros(some.shape, out_dtype)
    # interleave, last spatial axis first: stack phases after the axis, merge, crop
    def assemble(prefix: tuple[int, ...]) -> Array:
        a = len(prefix)
        if a == n:
            return parts.get(prefix, zeros)
        ax = d.spatial_axes[a]
        pieces = [assemble(prefix + (r,)) for r in range(p.strides[a])]
        if len(pieces) == 1:
            return pieces[0]
        st = jnp.stack(pieces, axis=ax + 1)
        shape = st.shape[:ax] + (st.shape[ax] * st.shape[ax + 1],) + st.shape[ax + 2:]
        return st.reshape(shape)
    return lax.slice(assemble(()), (0,) * len(p.x_shape), p.x_shape)  # crop to I per axis


_DATA_GRAD: dict[str, Callable[..., Array]] = {
    "grid": _data_grad_grid,
    "phases": _data_grad_phases,
    "dot": functools.partial(_data_grad_phases, dot=True),
    "vjp": _data_grad_vjp,
    "per_group": lambda dy, w, p, **kw: _per_group("data", dy, w, p, **kw),
    "block_diagonal": lambda dy, w, p, **kw: _block_diagonal("data", dy, w, p, **kw),
}
DATA_GRAD_METHODS = tuple(_DATA_GRAD)


def data_grad(dy: Array, w: Array, p: ConvProblem, *, precision: Precision = None,
              preferred_element_type: DType = None, method: str = "auto") -> Array:
    """dx from dy and W; ``method`` one of :data:`DATA_GRAD_METHODS` or ``"auto"``."""
    return _dispatch(_DATA_GRAD, backends.data_grad_method, dy, w, p, precision,
                     preferred_element_type, method)


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
# most what the windows read and crops the rest explicitly (see _fit).
#
# "feature_group": XLA expands batch_group_count into g times the work. Move
# the group factor of x's channels next to its batch instead, group-major
# (one transpose of x), so that the lhs feature axis is (g, N) and
# feature_group_count = g pairs group j of x with group j of dy.
#
# "shifted" (ICg = 1: depthwise, channel multiplier m = OCg): for each kernel
# offset k, dW[:, 0, k] = sum_{n,t} xs_k * dy, where xs_k is the strided slice
# of padded x starting at k*D; one fused multiply-reduce per offset.
#
# "dot" (every K = 1): dW[oc, ic] = sum_{n,t} xs[n, ic, t] dy[n, oc, t] with xs
# the strided slice of padded x: a dot_general contracting batch and spatial
# axes (batched over the groups when there are several). (Every O = 1: the
# window covers the padded input once, dW[oc, ic, k] = sum_n x[n, ic, k*D - pb]
# dy[n, oc]: a dot_general contracting the batch only, or, for a few output
# channels, those N outer products summed element-wise: one fused pass over x.)
# ---------------------------------------------------------------------------
def _weight_out(dw_gio: Array, p: ConvProblem) -> Array:
    """(G, ICg, OCg, *K) -> the filter layout (O = G*OCg, I = ICg)."""
    g, icg, ocg = dw_gio.shape[:3]
    k = dw_gio.shape[3:]
    dw = jnp.moveaxis(dw_gio, 0, 1).reshape(icg, g * ocg, *k)  # (I, O, *K), O group-major
    o_ax, i_ax, *sp = p.filter_layout.spec(swap=p.filter_swap)
    src = [i_ax, o_ax, *sp]
    perm = [src.index(ax) for ax in range(dw.ndim)]
    return jnp.transpose(dw, perm)


def _window(xc: Array, p: ConvProblem, starts: Sequence[int], counts: Sequence[int],
            steps: Sequence[int]) -> Array:
    """xc[..., start + j*step] for j in [0, count) on each spatial axis."""
    lo, hi, st = [0] * xc.ndim, list(xc.shape), [1] * xc.ndim
    for ax, a, n, s in zip(p.data.spatial_axes, starts, counts, steps):
        lo[ax], hi[ax], st[ax] = a, a + (n - 1) * s + 1, s
    return lax.slice(xc, lo, hi, st)


#: the bytes of x and dy a batch block of the "shifted" weight gradient reads (cache-sized)
_BLOCK_BYTES = 2 ** 22


#: the most kernel taps one variadic reduce of the "shifted" weight gradient accumulates
_TAPS_PER_REDUCE = 27
#: the "shifted" weight gradient's partial sums: its first and second spatial axes are cut
#: into about this many blocks each, and every block is summed on its own before the blocks
#: are added up (see _partial_sum_plan)
_PARTIAL_BLOCKS = (32, 4)


def _near_divisor(n: int, target: int) -> int:
    """The divisor of ``n`` nearest to ``target`` (the smaller one on a tie)."""
    return min((r for r in range(1, n + 1) if n % r == 0), key=lambda r: (abs(r - target), r))


def _partial_sum_plan(shape: Sequence[int], summed: Sequence[int],
                      spatial: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """How to sum ``summed`` axes of an array of ``shape`` in blocks of positions.

    Each of the first ``len(_PARTIAL_BLOCKS)`` ``spatial`` axes of extent n is cut
    into ``r`` blocks (the divisor of n nearest the target) by a free reshape
    n -> (r, n/r). Returns the reshaped shape, the axes the first sum runs over
    (in it), and the block axes of that sum's result, summed second.
    """
    targets = dict(zip(spatial, _PARTIAL_BLOCKS))
    new: list[int] = []
    first: list[int] = []
    blocks: list[int] = []  # positions among the axes the first sum keeps
    kept = 0
    for ax, n in enumerate(shape):
        r = _near_divisor(n, targets[ax]) if ax in targets else 1
        if r > 1:
            blocks.append(kept)
            kept += 1
            new.append(r)
            first.append(len(new))
            new.append(n // r)
        elif ax in summed:
            first.append(len(new))
            new.append(n)
        else:
            kept += 1
            new.append(n)
    return tuple(new), tuple(first), tuple(blocks)


def _add_each(a: Sequence[Array], b: Sequence[Array]) -> list[Array]:
    """The reducer of a variadic sum: element-wise sums of two tuples of accumulators."""
    return [u + v for u, v in zip(a, b)]


def _batch_chunk(batch: int, bytes_per_example: int) -> int:
    """The largest divisor of ``batch`` whose examples fit :data:`_BLOCK_BYTES` (at least 1)."""
    fits = [c for c in range(1, batch + 1) if batch % c == 0 and c * bytes_per_example <= _BLOCK_BYTES]
    return max(fits, default=1)


def _weight_grad_sliced(x: Array, dy: Array, p: ConvProblem, method: WeightGradMethod,
                        precision: Precision, acc: DType) -> Array:
    """The "dot" and "shifted" methods, in the data's own layout: (G, ICg, OCg, *K).

    With one group the products have no batch dimension: a size-1 batch
    dimension next to the contracted ones is what aborted XLA:GPU's Triton
    GEMM fusion (docs/performance.md, "GPU").
    """
    d, g, c = p.data, p.groups, p.data.channel_axis
    grouped = g > 1 or method == "shifted"
    xc = _pad_spatial(x, d.spatial_axes, p.fit_pads)

    def split(a: Array, per: int) -> Array:  # the channel axis in place into (G, per group): a free reshape
        return a.reshape(a.shape[:c] + (g, per) + a.shape[c + 1:]) if grouped else a

    def moved(ax: int) -> int:  # an axis index after that split
        return ax + 1 if grouped and ax > c else ax

    b, sp = moved(d.batch_axis), [moved(a) for a in d.spatial_axes]
    ch = c + 1 if grouped else c  # the per-group channel axis
    batch = ((c,), (c,)) if grouped else ((), ())
    dyg = split(dy, p.out_channels // g)
    if method == "shifted":  # ICg == 1, channel multiplier m
        m = p.out_channels // g
        if m == 1:  # no split: a size-1 minor axis costs XLA:CPU its vectorization (1.5x)
            dyg, b, sp = dy, d.batch_axis, list(d.spatial_axes)
            split = lambda a, per: a  # noqa: E731
        dyg = dyg if acc is None else dyg.astype(acc)
        # The sums over batch and positions run in float32 at least: a variadic reduce adds
        # one element at a time, and 16-bit sums of ~10^4 terms lose 1e-2 (the result is
        # rounded to the accumulation dtype once, at the end).
        narrow = jnp.issubdtype(dyg.dtype, jnp.floating) and jnp.dtype(dyg.dtype).itemsize < 4
        total_dtype = jnp.dtype(jnp.float32) if narrow else jnp.dtype(dyg.dtype)

        def every_tap(xc: Array, dyg: Array) -> Array:  # (G, m, prod(K))
            # One variadic reduce per run of taps: a single loop over x and dy that
            # accumulates every tap of the run, where one reduce per tap would
            # stream both arrays once per tap (2.5-5x on XLA:CPU, 3x3 depthwise).
            # Partial sums: XLA:CPU emits the reduce as a loop over its outputs with
            # an inner loop over what they sum (our reading of its optimized HLO and
            # of the timings), so with only the channels kept every channel's loop
            # walks all of x and dy, one element per cache line. Cut into blocks of
            # positions (the rows into ~32 blocks, the columns into ~4), each output
            # sums one block, the channels of a block read the same cache lines, and
            # a second, small sum adds the blocks. Measured on XLA:CPU only (2-core
            # Intel Xeon): 1.1-3.3x on benchdnn's mobilenet_dw rows (N1), up to 2.4x
            # on N4-N16 depthwise gradients, level on N8 56x56 C144
            # (docs/performance.md); only the CPU table picks "shifted".
            products = []
            for k in np.ndindex(*p.kernel):
                start = [kk * dl for kk, dl in zip(k, p.dilations)]
                xs = split(_window(xc, p, start, p.output_size, p.strides), 1).astype(dyg.dtype)
                products.append(xs * dyg)
            shape, first, blocks = _partial_sum_plan(products[0].shape, (b, *sp), sp)
            taps = []
            for i in range(0, len(products), _TAPS_PER_REDUCE):
                run = [t.astype(total_dtype).reshape(shape) for t in products[i:i + _TAPS_PER_REDUCE]]
                zeros = [jnp.zeros((), total_dtype)] * len(run)
                taps += lax.reduce(run, zeros, _add_each, first)
            return jnp.sum(jnp.stack(taps, axis=-1), axis=blocks).reshape(g, m, len(taps))

        nb = x.shape[d.batch_axis]
        chunk = _batch_chunk(nb, (math.prod(xc.shape) + math.prod(dy.shape)) // nb
                             * np.dtype(dyg.dtype).itemsize)
        if chunk == nb:
            dw = every_tap(xc, dyg)
        else:
            # Every tap re-reads x and dy: over the whole batch that is memory-bound (each
            # pass streams both arrays). A loop over batch blocks that fit the cache does
            # all taps of one block while it is there (1.4x on 56x56 C144 N8, 3x3).
            # The blocks are sliced in place (a dynamic slice that XLA fuses into the
            # reduction), not stacked by a reshape: that would copy x and dy first.
            def body(i: Array, total: Array) -> Array:
                start = i * chunk
                return total + every_tap(lax.dynamic_slice_in_dim(xc, start, chunk, d.batch_axis),
                                         lax.dynamic_slice_in_dim(dyg, start, chunk, b))

            zero = jnp.zeros((g, m, math.prod(p.kernel)), total_dtype)
            dw = lax.fori_loop(0, nb // chunk, body, zero)
        return dw.astype(dyg.dtype).reshape(g, m, *p.kernel)[:, None]  # (G, 1, m, *K)
    if any(o != 1 for o in p.output_size):  # dot: per kernel tap, contract batch and positions
        taps = []
        for k in np.ndindex(*p.kernel):
            start = [kk * dl for kk, dl in zip(k, p.dilations)]
            xs = split(_window(xc, p, start, p.output_size, p.strides), p.in_channels // g)
            taps.append(lax.dot_general(xs, dyg, (([b, *sp], [b, *sp]), batch),
                                        precision=precision, preferred_element_type=acc))
        dw = jnp.stack(taps, axis=-1).reshape(*taps[0].shape, *p.kernel)  # ([G,] ICg, OCg, *K)
        return dw if grouped else dw[None]
    # dot, every O == 1: the window covers the padded input once; contract the batch only
    xs = split(_window(xc, p, (0,) * p.rank, p.kernel, p.dilations), p.in_channels // g)
    dyg = dyg.reshape([n for a, n in enumerate(dyg.shape) if a not in sp])  # drop the 1s
    b_dy = b - sum(a < b for a in sp)
    nb, ocg = x.shape[d.batch_axis], p.out_channels // g
    if ocg <= _OUTER_SUM_MAX_OC and 0 < nb <= _OUTER_SUM_MAX_BATCH:
        dw = _outer_sum(xs, jnp.moveaxis(dyg, b_dy, 0), b, c if grouped else None, acc)
    else:
        dims = (((b,), (b_dy,)), ((c,), (c - sum(a < c for a in sp),)) if grouped else ((), ()))
        dw = lax.dot_general(xs, dyg, dims, precision=precision, preferred_element_type=acc)
    # dw: [G,] x's free axes, OCg
    free = [a for a in range(xs.ndim) if a != b and not (grouped and a == c)]
    lead = 1 if grouped else 0
    order = ((0,) if grouped else ()) + (
        lead + free.index(ch), dw.ndim - 1, *(lead + free.index(a) for a in sp))
    dw = jnp.transpose(dw, order)  # ([G,] ICg, OCg, *K)
    return dw if grouped else dw[None]


#: the "dot" weight gradient with every output extent 1 sums the outer products
#: x[n] (x) dy[n] element-wise (one fused loop) up to these sizes, a dot_general beyond
_OUTER_SUM_MAX_OC = 8
_OUTER_SUM_MAX_BATCH = 64


def _outer_sum(xs: Array, dyn: Array, b: int, g_axis: int | None, acc: DType) -> Array:
    """sum_n xs[n] (x) dyn[n]: ([G,] x's free axes, OCg), like the dot_general it replaces.

    ``dyn`` is (N, [G,] OCg). The dot_general contracting a batch of a few examples
    (XLA:CPU: an (elements x N) by (N x OCg) matrix product) ran 3-6x slower than
    this unrolled sum, which XLA fuses into one pass over x (3d_conv_large_shape:2,
    2 x 192^3 x 32: 0.4 s against 2.1-2.5 s for the product and jax.vjp). Measured on
    XLA:CPU only; the GPU table's "dot" (dense 3D) reaches it too, unmeasured there.
    """
    rest = xs.ndim - 1  # x's axes without the batch
    g_rest = None if g_axis is None else g_axis - (b < g_axis)
    shape = [1] * rest + [dyn.shape[-1]]
    if g_rest is not None:
        shape[g_rest] = dyn.shape[1]
    dtype = acc if acc is not None else xs.dtype
    total = None
    for n in range(xs.shape[b]):
        term = lax.index_in_dim(xs, n, b, keepdims=False).astype(dtype)[..., None] \
            * dyn[n].reshape(shape).astype(dtype)
        total = term if total is None else total + term
    assert total is not None
    return total if g_rest is None else jnp.moveaxis(total, g_rest, 0)


def _weight_grad_conv(x: Array, dy: Array, p: ConvProblem, method: WeightGradMethod,
                      precision: Precision, preferred_element_type: DType) -> Array:
    """The "conv", "feature_group" and "vjp" methods: one relabelled convolution.

    Its padding goes inside the convolution (an explicit ``lax.pad`` is
    materialized by XLA: 2x on N16 C64 56x56 k3). On a problem with a stride
    and a dilation (on any axes) the transposes JAX derives from that
    convolution for second-order grads abort jaxlib 0.10.2
    (tests/test_hazards.py), so there the primal keeps the fast form ("vjp"
    there takes the form of "conv") and a ``custom_jvp`` makes every
    derivative go through the explicitly padded form instead: the kernel is
    bilinear, so its JVP is ``wgrad(tx, dy) + wgrad(x, tdy)``, and JAX never
    transposes the fast one.
    """
    kernel = functools.partial(_relabelled_weight_grad, p=p, method=method, precision=precision,
                               preferred_element_type=preferred_element_type)
    if not strided_and_dilated(p):
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


def _relabelled_weight_grad(x: Array, dy: Array, *, p: ConvProblem, method: WeightGradMethod,
                            precision: Precision, preferred_element_type: DType,
                            inside: Literal["all", "capped", "none"]) -> Array:
    """``inside``: "all" the padding (jax.vjp's program), "capped" (see ``_fit``) or "none"."""
    d = p.data
    if inside == "all":
        xc, pads = x, list(p.fit_pads)
    else:
        caps = [(o - 1) * s if inside == "capped" else 0 for o, s in zip(p.output_size, p.strides)]
        xc, pads = _fit(x, d.spatial_axes, p.fit_pads, caps)
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    out_spec = (i_ax, o_ax, *w_sp)
    rhs_spec = (d.channel_axis, d.batch_axis, *d.spatial_axes)
    common = dict(
        dtype=x.dtype, precision=precision, preferred_element_type=preferred_element_type,
        window_strides=p.dilations, padding=pads, rhs_dilation=p.strides,
    )
    if method == "feature_group" and p.groups > 1:
        g = p.groups
        xn = jnp.transpose(xc, d.spec)  # (N, C, *X)
        nb, c, *sp = xn.shape
        xg = jnp.moveaxis(xn.reshape(nb, g, c // g, *sp), 1, 0).reshape(g * nb, c // g, *sp)
        lhs_spec = (1, 0, *range(2, 2 + p.rank))  # batch = ICg, feature = (g, N)
        return _conv(xg, dy, dimension_numbers=lax.ConvDimensionNumbers(
            lhs_spec, rhs_spec, out_spec), feature_group_count=g, **common)
    lhs_spec = (d.channel_axis, d.batch_axis, *d.spatial_axes)
    return _conv(xc, dy, dimension_numbers=lax.ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec),
                 batch_group_count=p.groups, **common)


def _weight_grad_dot(x: Array, dy: Array, p: ConvProblem, precision: Precision,
                     preferred_element_type: DType, *,
                     method: WeightGradMethod = "dot") -> Array:
    acc = accumulation_dtype(x.dtype, preferred_element_type)
    dw = _weight_grad_sliced(x, dy, p, method, precision, acc)
    return _weight_out(dw, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


_WEIGHT_GRAD: dict[str, Callable[..., Array]] = {
    "conv": functools.partial(_weight_grad_conv, method="conv"),
    "feature_group": functools.partial(_weight_grad_conv, method="feature_group"),
    "shifted": functools.partial(_weight_grad_dot, method="shifted"),
    "dot": _weight_grad_dot,
    "vjp": functools.partial(_weight_grad_conv, method="vjp"),
    "per_group": lambda x, dy, p, **kw: _per_group("weight", x, dy, p, **kw),
    "block_diagonal": lambda x, dy, p, **kw: _block_diagonal("weight", x, dy, p, **kw),
}
WEIGHT_GRAD_METHODS = tuple(_WEIGHT_GRAD)


def weight_grad(x: Array, dy: Array, p: ConvProblem, *, precision: Precision = None,
                preferred_element_type: DType = None, method: str = "auto") -> Array:
    """dW from x and dy; ``method`` one of :data:`WEIGHT_GRAD_METHODS` or ``"auto"``."""
    return _dispatch(_WEIGHT_GRAD, backends.weight_grad_method, x, dy, p, precision,
                     preferred_element_type, method)
