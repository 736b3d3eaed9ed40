"""``"dot"``: every kernel as matrix products, one per kernel tap (no grouped convolution).

Forward:  y[n, g*OCg+oc, o] = sum_{ic,k} x[n, g*ICg+ic, o*S + k*D - pb] W[g*OCg+oc, ic, k]
read tap by tap. For each kernel offset k the window x[o*S + k*D] over all o is one
strided slice of padded x, and

    y = sum_k slice_k(x) . W[:, :, k]

contracts the channels with one dot_general per tap, batched over the groups (no grouped
convolution reaches XLA). (``"shifted"`` reuses it with a multiply for ICg = 1.)

Data gradient: the stride phases of ``phases.py``, each as per-tap products.

One input position per example (every input extent 1: a generator's first layer projects a
vector onto an image): output position o reads x only through the tap k(o) with
o*S + k*D - pb = 0, so
    yk[n, k, oc] = sum_ic x[n, ic] W[oc, ic, k]          (every tap at once)
    y[n, o, oc] = yk[n, k(o), oc]  (0 where no tap reaches o)
is one dot_general batched over the taps (W read as it lies), then a selection of taps per
axis, where the per-tap loop would multiply the padding prod(K) times.

Few input channels (fewer than ``SPREAD_MAX_CHANNELS`` per group, one group: a generator's
last layer, to 1-3 image channels): per-tap products would each fill a few of a vector's
lanes. Instead, every tap's share of dx at once,
    cols[n, t, k, ic] = sum_oc dy[n, t, oc] W[oc, ic, k]  (N*T x prod(K)*IC: one product)
and each tap's slice cols[:, :, k] lands on dx[t*S + k*D - pb], in one stride phase of dx:
moved there by ``lax.pad`` (negative widths crop), summed per phase, the phases interleaved.

One window over the whole (padded) input, every O = 1 (a classifier head written as a
convolution, benchdnn's 3d_conv_large_shape): the taps are no loop but axes of one product.
The window xw[n, k, ic] = x[n, k*D - pb, ic] gives
    y[n, oc] = sum_{k,ic} xw[n, k, ic] W[oc, ic, k]      (contract the window and channels)
    dxw[n, k, ic] = sum_oc dy[n, oc] W[oc, ic, k]        (contract the output channels)
and dx is dxw spread back to the positions k*D - pb (``lax.pad``: interior D - 1, edges -pb
and I + pb - dk, negative widths crop): one dot_general each, batched over the groups,
where the loop would emit prod(K) of them (35,937 for a 33^3 window: minutes to compile).

Weight gradient: dW[oc, ic, k] = sum_{n,t} xs_k[n, ic, t] dy[n, oc, t] with xs_k the
strided slice of padded x at k*D: a dot_general per tap contracting batch and spatial axes
(batched over the groups when there are several). Every O = 1: the window covers the padded
input once, dW[oc, ic, k] = sum_n x[n, ic, k*D - pb] dy[n, oc]: a dot_general contracting
the batch only, or, for a few output channels, those N outer products summed element-wise
(one fused pass over x).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import lax_refs
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import common, phases
from jaxconv._src.lowering.method import Method


#: the "dot" data gradient spreads one product (module docstring) below this many input
#: channels per group: a float32 vector's lanes (AVX-512), which a per-tap product of fewer
#: result channels fills only in part
SPREAD_MAX_CHANNELS = 16
#: ... where its products (prod(K) * T per example and channel) hold at most this many times
#: dx's elements (per-tap "dot" keeps about 8x its result: tables.DOT_MAX_RESULT_ELEMENTS)
SPREAD_MAX_RATIO = 8


def spreads(p: ConvProblem) -> bool:
    """Whether the "dot" data gradient of ``p`` is one product spread tap by tap (module
    docstring): one group, fewer than :data:`SPREAD_MAX_CHANNELS` input channels and more
    than one output channel, more than one tap, not one window over the input, and at most
    :data:`SPREAD_MAX_RATIO` times dx's elements in the product."""
    return (p.groups == 1 and p.in_channels < SPREAD_MAX_CHANNELS and p.out_channels > 1
            and math.prod(p.kernel) > 1 and not p.whole_window
            and math.prod(p.output_size) * math.prod(p.kernel)
            <= SPREAD_MAX_RATIO * math.prod(p.input_size))


def one_product(kernel: Kernel, p: ConvProblem) -> bool:
    """Whether the "dot" kernel ``kernel`` computes ``p`` with one matrix product (a forward
    of one input position, a data gradient that :func:`spreads`, or :func:`_one_product`)."""
    if kernel is Kernel.FORWARD and p.one_input_position:
        return True
    if kernel is Kernel.DATA and spreads(p):
        return True
    return _one_product(p)


def _one_product(p: ConvProblem) -> bool:
    """Whether the "dot" kernels compute ``p`` with one matrix product: a window of one tap
    (1x1) or one window over the whole input. Only such a product is fenced where the method's
    record asks for it (:func:`common.product`): the two programs XLA:GPU aborted on were 1x1,
    and fencing every product of a multi-tap kernel made it 2-4x slower (docs/lowerings.md,
    "GPU (CUDA, ROCm)")."""
    return math.prod(p.kernel) == 1 or p.whole_window


def forward_taps(x: Array, w: Array, p: ConvProblem, precision: Precision,
                 preferred_element_type: DType, *, elementwise: bool = False,
                 fence: bool = False) -> Array:
    """y from x and W, one product (``elementwise``: one multiply-add) per kernel tap
    (``fence``: a kernel of one product fenced, :func:`_one_product`)."""
    if p.one_input_position and not elementwise:
        return _forward_one_position(x, w, p, precision, preferred_element_type,
                                     fence=fence)
    fence = fence and _one_product(p)
    if p.whole_window:
        return _forward_whole_window(x, w, p, precision, preferred_element_type, fence)
    d, g = p.data, p.groups
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    icg, ocg = p.in_channels // g, p.out_channels // g
    xl = common.channels_last(common.pad_spatial(x, d.spatial_axes, p.fit_pads), p)
    # (ICg, G*OCg, *K) -> (G, ICg, OCg, *K): O is group-major
    wc = jnp.moveaxis(jnp.transpose(w, (i_ax, o_ax, *w_sp)).reshape(icg, g, ocg, *p.kernel), 1, 0)
    reads = []
    for k in np.ndindex(*p.kernel):
        starts = [kk * dl for kk, dl in zip(k, p.dilations)]
        reads.append((starts, p.output_size, p.strides, k))
    acc = common.accumulation_dtype(x.dtype, preferred_element_type)
    y = common.tap_products(xl, wc, reads, precision, acc, elementwise=elementwise, fence=fence)
    return common.from_channels_last(y, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


def _forward_one_position(x: Array, w: Array, p: ConvProblem, precision: Precision,
                          preferred_element_type: DType, *, fence: bool) -> Array:
    """The forward of one input position (module docstring): one product batched over the
    taps (and groups), then each axis's taps picked for its output positions."""
    r, g = p.rank, p.groups
    icg, ocg = p.in_channels // g, p.out_channels // g
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    # W as (*K, ICg, G, OCg) -> (*K, G, ICg, OCg): for XIO and one group, W as it lies
    wk = jnp.transpose(w, (*w_sp, i_ax, o_ax)).reshape(*p.kernel, icg, g, ocg)
    wk = jnp.moveaxis(wk, r + 1, r)
    xc = common.channels_last(x, p).reshape(x.shape[p.data.batch_axis], g, icg)
    xk = jnp.broadcast_to(jnp.moveaxis(xc, 0, 1), (*p.kernel, g, *xc.shape[:1], icg))
    acc = common.accumulation_dtype(x.dtype, preferred_element_type)
    batch = tuple(range(r + (g > 1)))  # the taps, and the groups where there are several
    if g == 1:
        xk, wk = xk[(slice(None),) * r + (0,)], wk[(slice(None),) * r + (0,)]
    yk = common.product(xk, wk, (((xk.ndim - 1,), (wk.ndim - 2,)), (batch, batch)),
                        precision, acc, fence=fence)  # (*K, [G,] N, OCg)
    if g > 1:  # -> (*K, N, G, OCg)
        yk = jnp.moveaxis(yk, r, r + 1)
    y = jnp.moveaxis(yk, r, 0).reshape(yk.shape[r], *p.kernel, p.out_channels)  # (N, *K, OC)
    for a, (k, o, s, dl, pb) in enumerate(zip(p.kernel, p.output_size, p.strides, p.dilations,
                                              p.pads_begin)):
        taps = [(pb - u * s) // dl if (pb - u * s) % dl == 0 and 0 <= (pb - u * s) // dl < k
                else k for u in range(o)]  # k: no tap reaches u (a zero)
        y = _pick(y, a + 1, taps, k)
    return common.from_channels_last(y, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


def _pick(a: Array, axis: int, index: list[int], size: int) -> Array:
    """``a`` indexed by ``index`` along ``axis`` of ``size`` entries, ``size`` meaning a zero:
    a (reversed) strided slice where the indices are an arithmetic progression, else a
    gather from ``a`` with a zero appended."""
    step = index[1] - index[0] if len(index) > 1 else 1
    if size not in index and step != 0 and all(
            b - c == step for b, c in zip(index[1:], index)):
        if step < 0:
            a, index, step = lax.rev(a, (axis,)), [size - 1 - i for i in index], -step
        return lax.slice_in_dim(a, index[0], index[-1] + 1, step, axis)
    if size in index:
        a = common.pad_spatial(a, (axis,), [(0, 1)])
    return jnp.take(a, np.asarray(index), axis=axis)


def _window_channels_last(x: Array, p: ConvProblem) -> Array:
    """The one window of x, (N, *K, G, ICg): x[n, k*D - pb, g*ICg + ic]."""
    xc = common.pad_spatial(x, p.data.spatial_axes, p.fit_pads)
    xw = common.channels_last(common.window(xc, p, (0,) * p.rank, p.kernel, p.dilations), p)
    return xw.reshape(*xw.shape[:-1], p.groups, p.in_channels // p.groups)


def _filter_by_role(w: Array, p: ConvProblem) -> tuple[Array, list[str]]:
    """W in its own layout with the O axis split in place into (G, OCg) (a free reshape), and
    the role of each axis: the products contract it as it lies (no copy of a 33^3 window)."""
    o_ax, i_ax, *w_sp = p.filter_layout.spec(swap=p.filter_swap)
    roles = {o_ax: ["g", "oc"], i_ax: ["ic"], **{a: [f"k{j}"] for j, a in enumerate(w_sp)}}
    g = p.groups
    wg = w.reshape(w.shape[:o_ax] + (g, p.out_channels // g) + w.shape[o_ax + 1:])
    return wg, [r for a in range(w.ndim) for r in roles[a]]


def _product(a: Array, a_axes: list[str], b: Array, b_axes: list[str], contract: list[str],
             out: list[str], precision: Precision, acc: DType, fence: bool) -> Array:
    """dot_general by axis names: contract ``contract``, batch over the groups ("g") when
    there are several (one group: no size-1 batch dimension, docs/lowerings.md, "GPU (CUDA, ROCm)"),
    result in the order ``out``."""
    batch = ["g"] if a.shape[a_axes.index("g")] > 1 else []
    if not batch:
        a, a_axes = lax.index_in_dim(a, 0, a_axes.index("g"), False), [x for x in a_axes if x != "g"]
        b, b_axes = lax.index_in_dim(b, 0, b_axes.index("g"), False), [x for x in b_axes if x != "g"]
    dims = (([a_axes.index(x) for x in contract], [b_axes.index(x) for x in contract]),
            ([a_axes.index(x) for x in batch], [b_axes.index(x) for x in batch]))
    res = common.product(a, b, dims, precision, acc, fence=fence)
    got = batch + [x for axes in (a_axes, b_axes) for x in axes if x not in contract + batch]
    return jnp.transpose(res, [got.index(x) for x in out if x in got])


def _forward_whole_window(x: Array, w: Array, p: ConvProblem, precision: Precision,
                          preferred_element_type: DType, fence: bool) -> Array:
    ks = [f"k{j}" for j in range(p.rank)]
    xw = _window_channels_last(x, p)  # (N, *K, G, ICg)
    wg, w_axes = _filter_by_role(w, p)
    acc = common.accumulation_dtype(x.dtype, preferred_element_type)
    y = _product(xw, ["n", *ks, "g", "ic"], wg, w_axes, [*ks, "ic"], ["n", "g", "oc"],
                 precision, acc, fence)
    y = y.reshape(y.shape[0], *(1,) * p.rank, p.out_channels)  # (N, 1.., G*OCg)
    return common.from_channels_last(y, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


def _filter_first(batch: int, ocg: int) -> bool:
    """Whether the whole-window data gradient puts W before dy in its product.

    XLA:CPU copies one side transposed: dy first, W with O innermost (prod(K) * ICg * OCg
    elements); W first, the result ((prod(K) * ICg) x N, a transpose with N innermost, slow
    for a small batch). W first where OCg >= 4N and >= 16, dy first below (docs/lowerings.md,
    "Thresholds").
    """
    return ocg >= max(16, 4 * batch)


def _data_grad_whole_window(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                            preferred_element_type: DType, fence: bool) -> Array:
    g, r = p.groups, p.rank
    ks = [f"k{j}" for j in range(r)]
    dyc = common.channels_last(dy, p).reshape(dy.shape[p.data.batch_axis], g, p.out_channels // g)
    wg, w_axes = _filter_by_role(w, p)
    acc = common.accumulation_dtype(dy.dtype, preferred_element_type)
    if _filter_first(dyc.shape[0], p.out_channels // g):
        dxw = _product(wg, w_axes, dyc, ["n", "g", "oc"], ["oc"], ["n", *ks, "g", "ic"],
                       precision, acc, fence)
    else:
        dxw = _product(dyc, ["n", "g", "oc"], wg, w_axes, ["oc"], ["n", *ks, "g", "ic"],
                       precision, acc, fence)
    dxw = common.from_channels_last(dxw.reshape(*dxw.shape[:r + 1], p.in_channels), p)
    out_dtype = preferred_element_type if preferred_element_type is not None else dy.dtype
    config = [(0, 0, 0)] * dxw.ndim
    for ax, i, pb, dk, dl in zip(p.data.spatial_axes, p.input_size, p.pads_begin,
                                 p.dilated_kernel, p.dilations):
        config[ax] = (-pb, i + pb - dk, dl - 1)  # tap k lands on k*D - pb; negative widths crop
    return lax_refs.pad(dxw.astype(out_dtype), jnp.zeros((), out_dtype), config)


def _data_grad_spread(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                      preferred_element_type: DType, fence: bool) -> Array:
    """The data gradient of few input channels (module docstring): one product, every tap's
    share of dx at once; each share lands in the stride phase it reaches, moved by a plain
    ``lax.pad``, the shares of a phase summed, the phases interleaved (``phases.interleave``).
    (Each share padded onto dx itself, interior S - 1, cost XLA:CPU's fusion a division per
    element of every pad: DCGAN's last layer at batch 1 took 0.20 ms against 0.067 on the
    2-core Xeon.)"""
    r = p.rank
    ts, ks = [f"t{j}" for j in range(r)], [f"k{j}" for j in range(r)]
    dyc = common.channels_last(dy, p)
    dyc = dyc.reshape(*dyc.shape[:-1], 1, p.out_channels)  # (N, *T, G = 1, OC)
    wg, w_axes = _filter_by_role(w, p)
    acc = common.accumulation_dtype(dy.dtype, preferred_element_type)
    cols = _product(dyc, ["n", *ts, "g", "oc"], wg, w_axes, ["oc"], ["n", *ts, *ks, "ic"],
                    precision, acc, fence)  # (N, *T, *K, IC)
    zero = jnp.zeros((), cols.dtype)
    u_max = [-(-i // s) for i, s in zip(p.input_size, p.strides)]  # positions per phase
    sums: dict[tuple[int, ...], Array] = {}
    for k in np.ndindex(*p.kernel):
        # tap k of dy[t] lands on dx[t*S + k*D - pb] = dx[phase + S*(t + q)]
        phase, config = [], [(0, 0, 0)]
        for kk, t, u, s, dl, pb in zip(k, p.output_size, u_max, p.strides, p.dilations,
                                       p.pads_begin):
            q, rem = divmod(kk * dl - pb, s)
            phase.append(rem)
            config.append((q, u - q - t, 0))
        piece = lax_refs.pad(cols[(slice(None),) * (r + 1) + k], zero, [*config, (0, 0, 0)])
        key = tuple(phase)
        sums[key] = piece if key not in sums else sums[key] + piece
    out_dtype = preferred_element_type if preferred_element_type is not None else dy.dtype
    dx = phases.interleave({key: common.from_channels_last(v, p) for key, v in sums.items()},
                           p, cols.dtype)
    return dx.astype(out_dtype)  # rounded once, after the sums


def _data_grad_dot(dy: Array, w: Array, p: ConvProblem, precision: Precision,
                   preferred_element_type: DType, *, fence: bool = False) -> Array:
    if spreads(p):
        return _data_grad_spread(dy, w, p, precision, preferred_element_type, fence)
    fence = fence and _one_product(p)
    if p.whole_window:
        return _data_grad_whole_window(dy, w, p, precision, preferred_element_type, fence)
    return phases.data_grad_dot(dy, w, p, precision, preferred_element_type, fence=fence)


def _weight_grad_sliced(x: Array, dy: Array, p: ConvProblem, precision: Precision,
                        acc: DType, fence: bool) -> Array:
    """The "dot" weight gradient, in the data's own layout: (G, ICg, OCg, *K).

    With one group the products have no batch dimension: a size-1 batch
    dimension next to the contracted ones is what aborted XLA:GPU's Triton
    GEMM fusion (docs/lowerings.md, "GPU (CUDA, ROCm)").
    """
    d, g, c = p.data, p.groups, p.data.channel_axis
    grouped = g > 1
    xc = common.pad_spatial(x, d.spatial_axes, p.fit_pads)

    def split(a: Array, per: int) -> Array:  # the channel axis in place into (G, per group): a free reshape
        return a.reshape(a.shape[:c] + (g, per) + a.shape[c + 1:]) if grouped else a

    def moved(ax: int) -> int:  # an axis index after that split
        return ax + 1 if grouped and ax > c else ax

    b, sp = moved(d.batch_axis), [moved(a) for a in d.spatial_axes]
    ch = c + 1 if grouped else c  # the per-group channel axis
    batch = ((c,), (c,)) if grouped else ((), ())
    dyg = split(dy, p.out_channels // g)
    if any(o != 1 for o in p.output_size):  # per kernel tap, contract batch and positions
        taps = []
        for k in np.ndindex(*p.kernel):
            start = [kk * dl for kk, dl in zip(k, p.dilations)]
            xs = split(common.window(xc, p, start, p.output_size, p.strides), p.in_channels // g)
            taps.append(common.product(xs, dyg, (([b, *sp], [b, *sp]), batch), precision, acc,
                                       fence=fence))
        dw = jnp.stack(taps, axis=-1).reshape(*taps[0].shape, *p.kernel)  # ([G,] ICg, OCg, *K)
        return dw if grouped else dw[None]
    # every O == 1: the window covers the padded input once; contract the batch only
    xs = split(common.window(xc, p, (0,) * p.rank, p.kernel, p.dilations), p.in_channels // g)
    dyg = dyg.reshape([n for a, n in enumerate(dyg.shape) if a not in sp])  # drop the 1s
    b_dy = b - sum(a < b for a in sp)
    nb, ocg = x.shape[d.batch_axis], p.out_channels // g
    window = math.prod(p.kernel) * (p.in_channels // g)  # x's elements per example and group
    if (ocg <= _OUTER_SUM_MAX_OC and 0 < nb <= _OUTER_SUM_MAX_BATCH
            and window >= _OUTER_SUM_MIN_WINDOW):
        dw = _outer_sum(xs, jnp.moveaxis(dyg, b_dy, 0), b, c if grouped else None, acc)
    else:
        dims = (((b,), (b_dy,)), ((c,), (c - sum(a < c for a in sp),)) if grouped else ((), ()))
        dw = common.product(xs, dyg, dims, precision, acc, fence=fence)
    # dw: [G,] x's free axes, OCg
    free = [a for a in range(xs.ndim) if a != b and not (grouped and a == c)]
    lead = 1 if grouped else 0
    order = ((0,) if grouped else ()) + (
        lead + free.index(ch), dw.ndim - 1, *(lead + free.index(a) for a in sp))
    dw = jnp.transpose(dw, order)  # ([G,] ICg, OCg, *K)
    return dw if grouped else dw[None]


#: the "dot" weight gradient with every output extent 1 sums the outer products
#: x[n] (x) dy[n] element-wise (one fused loop) up to these sizes, a dot_general beyond
#: (docs/lowerings.md, "Weight gradient" and "Thresholds"; the GPU table's dense 3D "dot" takes
#: the same rule, not measured there)
_OUTER_SUM_MAX_OC = 8
_OUTER_SUM_MAX_BATCH = 64
_OUTER_SUM_MIN_WINDOW = 4096


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


def _weight_grad_dot(x: Array, dy: Array, p: ConvProblem, precision: Precision,
                     preferred_element_type: DType, *, fence: bool = False) -> Array:
    fence = fence and _one_product(p)
    acc = common.accumulation_dtype(x.dtype, preferred_element_type)
    dw = _weight_grad_sliced(x, dy, p, precision, acc, fence)
    return common.weight_out(dw, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


DOT = Method(
    "dot", "one matrix product per kernel tap, or one for all of them: a forward of one input "
    "position, a data gradient of few input channels (docs/lowerings.md)",
    {Kernel.FORWARD: forward_taps, Kernel.DATA: _data_grad_dot,
     Kernel.WEIGHT: _weight_grad_dot},
    fenced_on=("gpu",))
