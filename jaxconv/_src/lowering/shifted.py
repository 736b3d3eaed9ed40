"""``"shifted"``: depthwise problems (one input channel per group) as multiply-adds per tap.

Forward: the per-tap product has nothing to contract (ICg = 1, channel multiplier
m = OCg), ``y = sum_k slice_k(x) * W[:, 0, k]`` is a multiply-add XLA fuses into one loop
over y (``taps.forward_taps`` with ``elementwise``).

Weight gradient: for each kernel offset k, ``dW[:, 0, k] = sum_{n,t} xs_k * dy``, where xs_k
is the strided slice of padded x starting at k*D: the products of every tap summed by one
variadic ``lax.reduce``, in blocks of positions, over cache-sized batch blocks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import common, taps
from jaxconv._src.lowering.method import Method, depthwise_only

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


def _weight_grad_shifted(x: Array, dy: Array, p: ConvProblem, precision: Precision,
                         preferred_element_type: DType) -> Array:
    """dW of a depthwise problem (channel multiplier m), in the filter layout."""
    acc = common.accumulation_dtype(x.dtype, preferred_element_type)
    d, g = p.data, p.groups
    m = p.out_channels // g
    xc = common.pad_spatial(x, d.spatial_axes, p.fit_pads)
    # The channel axis split in place into (G, m) (a free reshape); with m == 1 no split:
    # a size-1 minor axis costs XLA:CPU its vectorization (1.5x).
    c = d.channel_axis

    def split(a: Array, per: int) -> Array:
        return a if m == 1 else a.reshape(a.shape[:c] + (g, per) + a.shape[c + 1:])

    def moved(ax: int) -> int:  # an axis index after that split
        return ax + 1 if m > 1 and ax > c else ax

    b, sp = moved(d.batch_axis), [moved(a) for a in d.spatial_axes]
    dyg = split(dy, m)
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
        # a second, small sum adds the blocks (measured on XLA:CPU: docs/lowerings.md,
        # "Weight gradient"); only the CPU table picks "shifted".
        products = []
        for k in np.ndindex(*p.kernel):
            start = [kk * dl for kk, dl in zip(k, p.dilations)]
            xs = split(common.window(xc, p, start, p.output_size, p.strides), 1).astype(dyg.dtype)
            products.append(xs * dyg)
        shape, first, blocks = _partial_sum_plan(products[0].shape, (b, *sp), sp)
        sums: list[Array] = []
        for i in range(0, len(products), _TAPS_PER_REDUCE):
            run = [t.astype(total_dtype).reshape(shape) for t in products[i:i + _TAPS_PER_REDUCE]]
            zeros = [jnp.zeros((), total_dtype)] * len(run)
            sums += lax.reduce(run, zeros, _add_each, first)
        return jnp.sum(jnp.stack(sums, axis=-1), axis=blocks).reshape(g, m, len(sums))

    nb = x.shape[d.batch_axis]
    chunk = _batch_chunk(nb, (math.prod(xc.shape) + math.prod(dy.shape)) // max(nb, 1)
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
    dw = dw.astype(dyg.dtype).reshape(g, m, *p.kernel)[:, None]  # (G, 1, m, *K)
    return common.weight_out(dw, p).astype(
        preferred_element_type if preferred_element_type is not None else x.dtype)


SHIFTED = Method(
    "shifted", "depthwise only: one multiply-add per tap",
    {Kernel.FORWARD: functools.partial(taps.forward_taps, elementwise=True),
     Kernel.WEIGHT: _weight_grad_shifted},
    depthwise_only)
