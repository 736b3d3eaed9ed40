"""What the formulations share: accumulation types, padding, windows and per-tap products.

Padding stays explicit (``lax_refs.pad``: ``lax.pad`` with its crops done by ``lax.slice``, so
that no negative pad reaches XLA, docs/semantics.md, "Negative pads") wherever the
transposes JAX derives under ``grad`` would otherwise reach the pattern that aborts jaxlib
0.10.2 on CPU (the strided + dilated convolution bug: docs/semantics.md, "A toolchain
hazard", tests/core/test_hazards.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import lax_refs
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Precision

Pads = Sequence[tuple[int, int]]

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
        return np.dtype(np.float32)
    if jnp.issubdtype(dt, jnp.integer) and dt.itemsize < 4:
        return np.dtype(np.int32)
    return None


def conv(lhs: Array, rhs: Array, *, dtype: DType, precision: Precision,
         preferred_element_type: DType, **kwargs: Any) -> Array:
    """``conv_general_dilated`` accumulating in :func:`accumulation_dtype`.

    The result has ``preferred_element_type`` if given, else ``dtype`` (a
    narrow integer result is the wide accumulator cast back, wrapping like C).
    """
    out = lax_refs.conv(
        lhs, rhs, precision=precision,
        preferred_element_type=accumulation_dtype(dtype, preferred_element_type), **kwargs
    )
    return out.astype(preferred_element_type if preferred_element_type is not None else dtype)


def pad_spatial(a: Array, axes: Sequence[int], pads: Pads,
                interior: Sequence[int] | None = None) -> Array:
    """``lax.pad`` on the given axes: (low, high) per axis, optional interior."""
    config = [(0, 0, 0)] * a.ndim
    for j, (ax, (lo, hi)) in enumerate(zip(axes, pads)):
        config[ax] = (lo, hi, 0 if interior is None else interior[j])
    return lax_refs.pad(a, jnp.zeros((), a.dtype), config)  # negative widths: a slice


def fit(a: Array, axes: Sequence[int], pads: Pads,
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
    return lax_refs.pad(a, jnp.zeros((), a.dtype), config), conv_pads  # crops: a slice


def strided_and_dilated(p: ConvProblem) -> bool:
    """A stride and a dilation (on any axes): where JAX's own transposes can abort jaxlib 0.10.2.

    The aborting pattern (docs/semantics.md, "A toolchain hazard") needs both; ``"vjp"`` hands such
    problems to a form that keeps the padding explicit.
    """
    return any(s > 1 for s in p.strides) and any(d > 1 for d in p.dilations)


def channels_last(a: Array, p: ConvProblem) -> Array:
    """An array in the data layout as (N, *X, C)."""
    d = p.data
    return jnp.transpose(a, (d.batch_axis, *d.spatial_axes, d.channel_axis))


def from_channels_last(a: Array, p: ConvProblem) -> Array:
    """(N, *X, C) back to the data layout."""
    d = p.data
    spec = (d.batch_axis, *d.spatial_axes, d.channel_axis)
    return jnp.transpose(a, [spec.index(ax) for ax in range(a.ndim)])


Read = tuple[Sequence[int], Sequence[int], Sequence[int], tuple[int, ...]]


def product(a: Array, b: Array, dims: lax.DotDimensionNumbers, precision: Precision,
            acc: DType, *, fence: bool = False) -> Array:
    """``lax.dot_general(a, b, dims)``; with ``fence``, its operands and its result pass
    through ``lax.optimization_barrier``, so XLA fuses nothing into the product.

    XLA:GPU's Triton GEMM fusion (jaxlib 0.11.2) aborts the process where it fuses a product
    with the strided slice, reshapes and transposes around it (the "dot" kernels of a 2D 1x1
    problem with strides 3 x 1; fenced, they compile and are exact: docs/lowerings.md, "GPU
    (CUDA, ROCm)"). The "dot" method fences the product of a kernel that is one product, in
    the programs of the backends its record names (``Method.fenced_on``, ``taps._one_product``).
    """
    if fence:
        a, b = lax.optimization_barrier((a, b))  # type: ignore[no-untyped-call]
    out = lax.dot_general(a, b, dims, precision=precision, preferred_element_type=acc)
    if fence:
        out = lax.optimization_barrier(out)  # type: ignore[no-untyped-call]
    return out


def tap_products(a: Array, wc: Array, reads: Sequence[Read], precision: Precision, acc: DType,
                 *, elementwise: bool = False, fence: bool = False) -> Array:
    """``sum_j window_j(a) . wc[..., tap_j]``, contracting the channels: the per-tap kernels.

    ``a`` is channels-last (N, *X, G*Cin_g); ``wc`` is (G, Cin_g, Cout_g, *K); each read is
    (starts, counts, steps, tap): the window ``a[start + u*step]`` for ``u < count`` on each
    spatial axis, multiplied by the filter tap ``tap``. The contraction is one
    ``dot_general`` per tap, batched over the groups when there are several (no XLA
    grouped convolution). With one group there is no batch dimension: a size-1 batch
    dimension next to the contracted ones is what aborted XLA:GPU's Triton GEMM fusion
    (docs/performance.md). ``elementwise`` (Cin_g = 1) multiplies instead of contracting,
    a multiply-add XLA fuses. ``fence``: each product fenced (:func:`product`). Returns
    (N, *U, G*Cout_g) in ``acc`` (the input dtype if None).
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
        win = lax.slice(a, lo, hi, [1, *steps, *(1,) * (a.ndim - 1 - n)])
        wk = wc[(slice(None),) * 3 + tuple(tap)]  # (G, Cin_g, Cout_g)
        if elementwise:  # (N, *U, G, 1) * (G, Cout_g), or (N, *U, G) * (G,) when flat
            wk = wk[:, 0, 0] if flat else wk[:, 0]
            wk = wk.reshape((1,) * (win.ndim - wk.ndim) + wk.shape)  # explicit broadcast
            part = win * wk if acc is None else win.astype(acc) * wk.astype(acc)
        elif g > 1:  # -> (G, N, *U, Cout_g)
            part = product(win, wk, (((n + 2,), (1,)), ((n + 1,), (0,))), precision, acc,
                           fence=fence)
        else:  # -> (N, *U, Cout)
            part = product(win, wk[0], (((n + 1,), (0,)), ((), ())), precision, acc,
                           fence=fence)
        total = part if total is None else total + part
    assert total is not None  # at least one tap
    if flat:
        return total
    if elementwise:
        return total.reshape(*total.shape[:-2], g * cout)
    if g > 1:
        return jnp.moveaxis(total, 0, -2).reshape(*total.shape[1:-1], g * cout)
    return total


def weight_out(dw_gio: Array, p: ConvProblem) -> Array:
    """(G, ICg, OCg, *K) -> the filter layout (O = G*OCg, I = ICg)."""
    g, icg, ocg = dw_gio.shape[:3]
    k = dw_gio.shape[3:]
    dw = jnp.moveaxis(dw_gio, 0, 1).reshape(icg, g * ocg, *k)  # (I, O, *K), O group-major
    o_ax, i_ax, *sp = p.filter_layout.spec(swap=p.filter_swap)
    src = [i_ax, o_ax, *sp]
    perm = [src.index(ax) for ax in range(dw.ndim)]
    return jnp.transpose(dw, perm)


def window(xc: Array, p: ConvProblem, starts: Sequence[int], counts: Sequence[int],
           steps: Sequence[int]) -> Array:
    """xc[..., start + j*step] for j in [0, count) on each spatial axis."""
    lo, hi, st = [0] * xc.ndim, list(xc.shape), [1] * xc.ndim
    for ax, a, n, s in zip(p.data.spatial_axes, starts, counts, steps):
        lo[ax], hi[ax], st[ax] = a, a + (n - 1) * s + 1, s
    return lax.slice(xc, lo, hi, st)


