"""The data gradient by stride phases: ``"phases"`` (a convolution per phase) and the
data-gradient kernel of ``"dot"`` (per-tap products per phase).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import common, convolution
from jaxconv._src.lowering.method import Method


# Stride phases: split the output positions s = r + S*u by their phase r in
# [0, S). A tap k reaches phase r iff (r + pb - k*D) % S == 0, and then reads
# dy[u + c_k] with c_k = (r + pb - k*D) / S. Those taps are k0, k0 + step, ...
# with step = S / gcd(S, D), and c_k falls by D' = D / gcd(S, D) per tap, so
#     dx_r[u] = sum_j dy[u + c_last + j*D'] * W[k_last - j*step]
# is a stride-1 correlation with the reversed sub-kernel, dilation D', on dy
# padded (or cropped) by -c_last at the start, with ceil(I / S) outputs. The
# phases are then interleaved: dx[r + S*u] = dx_r[u]. No input dilation and no
# zero grid: S^rank times less work than the grid form.
def _phase_dots(dyp: Array, w: Array, p: ConvProblem, taps: Sequence[Sequence[int]],
                u_max: Sequence[int], dil: Sequence[int], precision: Precision,
                preferred_element_type: DType, fence: bool) -> Array:
    """One phase of the "dot" data gradient: ``dx_r[u] = sum_j dyp[u + j*D'] W[taps[j]]``.

    The channel contraction (OCg -> ICg) is :func:`common.tap_products`' (``fence``: each
    product fenced, :func:`common.product`). Returns the phase in the data layout.
    """
    g = p.groups
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    ocg, icg = p.out_channels // g, p.in_channels // g
    wc = jnp.transpose(w, (o_ax, i_ax, *w_sp)).reshape(g, ocg, icg, *p.kernel)
    reads = [([jj * dd for jj, dd in zip(j, dil)], u_max, (1,) * p.rank,
              tuple(t[jj] for t, jj in zip(taps, j)))
             for j in itertools.product(*(range(len(t)) for t in taps))]
    acc = common.accumulation_dtype(dyp.dtype, preferred_element_type)
    total = common.tap_products(common.channels_last(dyp, p), wc, reads, precision, acc,
                                elementwise=g > 1 and ocg == icg == 1,  # depthwise: multiply-adds
                                fence=fence)
    return common.from_channels_last(total, p).astype(
        preferred_element_type if preferred_element_type is not None else dyp.dtype)


def _data_grad_phases(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                      preferred_element_type: DType, dot: bool = False,
                      fence: bool = False) -> Array:
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
        dyp = common.pad_spatial(dy, d.spatial_axes, pads)
        if dot:
            parts[combo] = _phase_dots(dyp, w, p, [t for t, _ in sel], u_max, dil, precision,
                                       preferred_element_type, fence)
            continue
        # sub-kernel: taps in decreasing k (the reversal), on each spatial axis of the filter
        wsub = w
        for ax, (taps, _) in zip(w_sp, sel):
            wsub = jnp.take(wsub, np.asarray(taps), axis=ax)
        wt, rhs_spec = convolution.regroup_for_transpose(wsub, p, flip=False)  # taps already reversed
        spec = d.spec
        parts[combo] = common.conv(
            dyp, wt, dtype=dy.dtype, precision=precision,
            preferred_element_type=preferred_element_type, padding="VALID",
            window_strides=(1,) * n, rhs_dilation=tuple(dil),
            dimension_numbers=lax.ConvDimensionNumbers(spec, rhs_spec, spec),
            feature_group_count=p.groups)
    return interleave(parts, p, out_dtype)


def interleave(parts: dict[tuple[int, ...], Array], p: ConvProblem, dtype: DType) -> Array:
    """dx from its stride phases: ``parts[r]`` (in the data layout, ceil(I / S) positions
    per spatial axis; a phase no tap reaches absent: zeros) is dx[r + S*u]. Interleaved last
    spatial axis first (the phases stacked after the axis, merged), then cropped to I."""
    d, n = p.data, p.rank
    some = next(iter(parts.values()))
    zeros = jnp.zeros(some.shape, dtype)

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


#: the "dot" method's data-gradient kernel: per-tap matrix products in each phase
data_grad_dot = functools.partial(_data_grad_phases, dot=True)

PHASES = Method("phases", "one convolution per stride phase, no zero grid",
                {Kernel.DATA: _data_grad_phases})
