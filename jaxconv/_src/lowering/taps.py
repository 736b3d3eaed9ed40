"""``"dot"``: every kernel as matrix products, one per kernel tap (no grouped convolution).

Forward:  y[n, g*OCg+oc, o] = sum_{ic,k} x[n, g*ICg+ic, o*S + k*D - pb] W[g*OCg+oc, ic, k]
read tap by tap. For each kernel offset k the window x[o*S + k*D] over all o is one
strided slice of padded x, and

    y = sum_k slice_k(x) . W[:, :, k]

contracts the channels with one dot_general per tap, batched over the groups (no grouped
convolution reaches XLA). (``"shifted"`` reuses it with a multiply for ICg = 1.)

Data gradient: the stride phases of ``phases.py``, each as per-tap products.

Weight gradient: dW[oc, ic, k] = sum_{n,t} xs_k[n, ic, t] dy[n, oc, t] with xs_k the
strided slice of padded x at k*D: a dot_general per tap contracting batch and spatial axes
(batched over the groups when there are several). Every O = 1: the window covers the padded
input once, dW[oc, ic, k] = sum_n x[n, ic, k*D - pb] dy[n, oc]: a dot_general contracting
the batch only, or, for a few output channels, those N outer products summed element-wise
(one fused pass over x).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import common, phases
from jaxconv._src.lowering.method import Method


def forward_taps(x: Array, w: Array, p: ConvProblem, precision: Precision,
                 preferred_element_type: DType, *, elementwise: bool = False) -> Array:
    """y from x and W, one product (``elementwise``: one multiply-add) per kernel tap."""
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
    y = common.tap_products(xl, wc, reads, precision, acc, elementwise=elementwise)
    return common.from_channels_last(y, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


def _weight_grad_sliced(x: Array, dy: Array, p: ConvProblem, precision: Precision,
                        acc: DType) -> Array:
    """The "dot" weight gradient, in the data's own layout: (G, ICg, OCg, *K).

    With one group the products have no batch dimension: a size-1 batch
    dimension next to the contracted ones is what aborted XLA:GPU's Triton
    GEMM fusion (docs/performance.md, "GPU").
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
            taps.append(lax.dot_general(xs, dyg, (([b, *sp], [b, *sp]), batch),
                                        precision=precision, preferred_element_type=acc))
        dw = jnp.stack(taps, axis=-1).reshape(*taps[0].shape, *p.kernel)  # ([G,] ICg, OCg, *K)
        return dw if grouped else dw[None]
    # every O == 1: the window covers the padded input once; contract the batch only
    xs = split(common.window(xc, p, (0,) * p.rank, p.kernel, p.dilations), p.in_channels // g)
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


def _weight_grad_dot(x: Array, dy: Array, p: ConvProblem, precision: Precision,
                     preferred_element_type: DType) -> Array:
    acc = common.accumulation_dtype(x.dtype, preferred_element_type)
    dw = _weight_grad_sliced(x, dy, p, precision, acc)
    return common.weight_out(dw, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


DOT = Method(
    "dot", "one matrix product per kernel tap",
    {Kernel.FORWARD: forward_taps, Kernel.DATA: phases.data_grad_dot,
     Kernel.WEIGHT: _weight_grad_dot})
