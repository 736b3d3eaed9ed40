"""A oneDNN call in a program XLA's SPMD partitioner splits across devices.

The partitioner cannot see inside a custom call: left to itself it would gather the operands
onto every device. So the call is wrapped in ``jax.experimental.custom_partitioning`` with a
Shardy rule that names, for each dimension of each operand, the factor it holds; the sharded
factors a local call can compute on are kept sharded, and each device runs oneDNN on its
blocks (a sub-problem with fewer examples, channels, groups or rows):

    forward  x[n, c, s], W[o, c, k]  -> y[n, o, s]    c summed over
    data     dy[n, o, s], W[o, c, k] -> dx[n, c, s]   o summed over
    weight   x[n, c, s], dy[n, o, s] -> dW[o, c, k]   n, s summed over

With several groups the channels of x, y and W's output axis are one factor g (a block of
whole groups), W's per-group input axis is replicated. The rows ``s`` of a spatial axis are
one factor in x and y alike, though the two may differ in size (as in Shardy's own rule for a
convolution, the factor takes the smaller size): a block of output rows reads a block of
input rows and a halo of its neighbours' (``_Halo``).

A factor that appears in both operands and not in the result is a reduction factor: sharded,
each device's call computes a partial result from its slices of the sum, and one all-reduce
(``psum``) adds them; the other factors pass through. So a batch-sharded step runs its forward
and data gradient shard-local and each weight gradient with one all-reduce; channels sharded
as in tensor parallelism (the filter's output channels and the activations' channels with
them) compute shard-local or with one all-reduce of the result; rows with halos fetched by
collective permutes (a halo longer than a block from as many blocks as it spans). No
activation is gathered for any of these.

What no local call computes is replicated before the call (the partitioner gathers it): the
groups where a block would split one, and the later (in
the order n, c, o, g, s0, ...) of two factors split over the same mesh axis (a weight gradient
of activations whose input and output channels are both sharded over it: its result could not
be sharded both ways). Blocks that do not divide a size are XLA's (ceil(size / count) each, the
last ones padded), their padding masked to zeros where a call would read it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, Kernel

#: a local problem's kernel call: (a, b, the problem of this device's blocks, its threads: 0
#: the handler's own rule, 1 one thread) -> result
Local = Callable[[Array, Array, ConvProblem, int], Array]

#: the tensors (x: the convolution's input, w: its filter, y: its output) that are a kernel's
#: operands a, b and its result
_ROLES = {Kernel.FORWARD: ("x", "w", "y"), Kernel.DATA: ("y", "w", "x"),
          Kernel.WEIGHT: ("x", "y", "w")}
#: the factors a local call computes on (besides the rows), and the fields of the problem each
#: one divides
_SPLIT = {"n": ("batch",), "c": ("in_channels",), "o": ("out_channels",),
          "g": ("groups", "in_channels", "out_channels")}


def _factors(tensor: str, p: ConvProblem) -> list[str]:
    """The factor each dimension of ``tensor`` holds: "n", "c", "o", "g" (the groups: with
    several, the channels of x and y and the filter's output axis), "s<k>" (the rows of spatial
    axis k, in x and y alike) where a local call can compute on a block of it, else a name of
    its own (replicated)."""
    dims = [""] * (p.rank + 2)
    grouped = p.groups > 1
    if tensor == "w":
        o_axis, i_axis, *spatial = p.filter_layout.spec(swap=p.filter_swap)
        dims[o_axis] = "g" if grouped else "o"
        dims[i_axis] = "w_i" if grouped else "c"  # a group's input channels: never split
        for k, axis in enumerate(spatial):
            dims[axis] = f"w_s{k}"
        return dims
    dims[p.data.batch_axis] = "n"
    dims[p.data.channel_axis] = "g" if grouped else ("c" if tensor == "x" else "o")
    for k, axis in enumerate(p.data.spatial_axes):
        dims[axis] = f"s{k}"
    return dims


def _splittable(f: str) -> bool:
    return f in _SPLIT or (f[0] == "s" and f[1:].isdigit())


def _rule(kernel: Kernel, p: ConvProblem) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The Shardy rule (einsum-like), its reduction factors (in the operands, not the result:
    the kernel sums over them) and the factors that need replication (the unsplittable ones),
    each in the order they first appear (Shardy's verifier wants them sorted by the index it
    gives each factor)."""
    maps = [_factors(t, p) for t in _ROLES[kernel]]
    names = [f for dims in maps for f in dims]
    replicated = tuple(dict.fromkeys(f for f in names if not _splittable(f)))
    reduction = tuple(dict.fromkeys(f for f in names if f not in maps[2] and _splittable(f)))
    rule = f"{' '.join(maps[0])}, {' '.join(maps[1])} -> {' '.join(maps[2])}"
    return rule, reduction, replicated


def _mesh_axes(entry: object) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names (None: none)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (typing.cast(str, entry),)


def _masked(t: Array, axis: int, first: Array, extent: int) -> Array:
    """``t``, whose entries along ``axis`` are entries ``first`` on of the whole, with those
    past ``extent`` (the padding of XLA's uneven blocks) zeros."""
    shape = [1] * t.ndim
    shape[axis] = t.shape[axis]
    index = first + lax.broadcasted_iota(jnp.int32, shape, axis)
    return jnp.where(index < extent, t, jnp.zeros((), t.dtype))


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """The blocks of a dimension split over ``axes`` (a PartitionSpec entry: the first axis
    major), of ``sizes`` devices each. ppermute and axis_index number the devices of several
    mesh axes in the mesh's order (``order``), which the entry need not follow."""

    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    order: tuple[str, ...]

    @property
    def count(self) -> int:
        return math.prod(self.sizes)

    @staticmethod
    def of(mesh: typing.Any, axes: tuple[str, ...]) -> _Blocks:
        return _Blocks(axes, tuple(mesh.shape[a] for a in axes),
                       tuple(a for a in mesh.axis_names if a in axes))

    def index(self) -> Array:
        """This device's block."""
        i: typing.Any = 0
        for a, size in zip(self.axes, self.sizes):
            i = i * size + lax.axis_index(a)
        return typing.cast(Array, i)

    def _device(self, block: int) -> int:
        """The number ppermute gives the devices of block ``block``."""
        digits = {}
        for a, size in reversed(list(zip(self.axes, self.sizes))):
            block, digits[a] = divmod(block, size)
        sizes = dict(zip(self.axes, self.sizes))
        out = 0
        for a in self.order:
            out = out * sizes[a] + digits[a]
        return out

    def permute(self, x: Array, pairs: list[tuple[int, int]]) -> Array:
        """``x`` sent from block i to j for each (i, j); zeros where none is received."""
        perm = [(self._device(i), self._device(j)) for i, j in pairs]
        out: Array = lax.ppermute(x, self.order, perm)  # type: ignore[no-untyped-call]
        return out


@dataclasses.dataclass(frozen=True)
class _Halo:
    """Spatial axis ``axis`` (of the data operands) split into ``count`` ``blocks`` (over one
    mesh axis or several): ``rows`` input rows and ``out_rows`` output rows on each device.

    Device i's outputs [i Q, (i + 1) Q) (Q = ``out_rows``, stride S, dilation D, kernel K, pad P)
    read the input rows from i Q S - P on, ``length`` = (Q - 1) S + (K - 1) D + 1 of them: an
    offset ``off(i) = i (Q S - R) - P`` from its own block's first row (R = ``rows``), the same on
    every device where the blocks line up (Q S = R: a "same" or a strided "same" convolution),
    growing or shrinking with i elsewhere (a valid one). So each device fetches the last
    ``left`` rows of the previous block and the first ``right`` of the next (the most any device
    needs; zeros beyond the edge blocks: the padding), and takes its window of ``length`` rows
    from ``left + off(i)`` on: a valid (unpadded) convolution of it gives its outputs. A halo
    longer than a block comes from as many blocks as it spans, one collective permute each
    (block i - h sends its last rows h blocks on: ``_hops``). A data gradient computes that
    convolution's input gradient, places it at the window, and hands the halo rows' part back
    the same ways, and each block adds it to its own."""

    axis: int
    blocks: _Blocks
    rows: int
    out_rows: int
    step: int  # Q S - R: how far device i + 1's window moves past device i's, relative to its rows
    pad: int  # P
    length: int
    size: int  # the input's extent (rows from it on are padding)
    out_size: int  # the output's

    @staticmethod
    def of(p: ConvProblem, k: int, axis: int, blocks: _Blocks) -> _Halo:
        """The halo of spatial axis ``k`` split into ``blocks``. Blocks that do not divide an
        extent are XLA's: ceil(extent / count) rows each, the last ones padded (``masked``)."""
        count = blocks.count
        rows, q = -(-p.input_size[k] // count), -(-p.output_size[k] // count)
        length = (q - 1) * p.strides[k] + (p.kernel[k] - 1) * p.dilations[k] + 1
        return _Halo(axis, blocks, rows, q, q * p.strides[k] - rows, p.pads_begin[k],
                     length, p.input_size[k], p.output_size[k])

    @property
    def count(self) -> int:
        return self.blocks.count

    def _off(self, i: int) -> int:
        return i * self.step - self.pad

    @property
    def _ends(self) -> tuple[int, int]:
        """The first device and the last with outputs (past it, uneven blocks hold only XLA's
        padding: their windows are clamped into their rows, their dy zeros)."""
        return 0, min(self.count - 1, (self.out_size - 1) // self.out_rows)

    @property
    def left(self) -> int:
        return max(0, *(-self._off(i) for i in self._ends))

    @property
    def right(self) -> int:
        return max(0, *(self._off(i) + self.length - self.rows for i in self._ends))

    def _hops(self, halo: int) -> list[tuple[int, int, int]]:
        """A halo of ``halo`` rows as (h, n, at): the ``n`` rows next to this block of the block
        h away, at row ``at`` of the halo counted from this block outwards (h = 1, 2, ... as
        far as it reaches: the rows of one block, then the next block's)."""
        hops, at, h = [], 0, 1
        while at < halo:
            n = min(self.rows, halo - at)
            hops.append((h, n, at))
            at, h = at + n, h + 1
        return hops

    def _send(self, x: Array, h: int) -> Array:
        """``x`` of block i received by block i + h (h < 0: by i - |h|); zeros where no
        block is h away (the padding beyond the edge blocks)."""
        n = self.count
        if abs(h) >= n:
            return jnp.zeros_like(x)
        pairs = [(i, i + h) for i in range(n - h)] if h > 0 else [(i - h, i) for i in range(n + h)]
        return self.blocks.permute(x, pairs)

    def _start(self) -> Array | int:
        """Where this device's window starts in its rows with halos (clamped into them on the
        devices past the last with outputs)."""
        if self.step == 0:
            return self.left + self._off(0)
        start = self.left - self.pad + self.blocks.index() * self.step
        return jnp.clip(start, 0, self.left + self.rows + self.right - self.length)

    def fetch(self, x: Array) -> Array:
        """This device's window of input rows (zeros beyond the edge blocks)."""
        r, parts = self.rows, []
        for h, n, _ in reversed(self._hops(self.left)):  # the farthest block's rows first
            parts.append(self._send(lax.slice_in_dim(x, r - n, r, axis=self.axis), h))
        parts.append(x)
        for h, n, _ in self._hops(self.right):
            parts.append(self._send(lax.slice_in_dim(x, 0, n, axis=self.axis), -h))
        rows = lax.concatenate(parts, self.axis) if len(parts) > 1 else x
        start = self._start()
        if isinstance(start, int):
            window = lax.slice_in_dim(rows, start, start + self.length, axis=self.axis)
        else:
            window = lax.dynamic_slice_in_dim(rows, start, self.length, axis=self.axis)
        # uneven blocks: the rows past the input's extent are XLA's padding, zeros here
        if self.rows * self.count == self.size:
            return window
        i = self.blocks.index()
        return _masked(window, self.axis, i * self.rows - self.left + start, self.size)

    def masked(self, dy: Array) -> Array:
        """This device's output rows (a data or weight gradient's dy), those past the output's
        extent (XLA's padding of uneven blocks) zeros."""
        if self.out_rows * self.count == self.out_size:
            return dy
        return _masked(dy, self.axis, self.blocks.index() * self.out_rows, self.out_size)

    def give_back(self, dx: Array) -> Array:
        """The adjoint of ``fetch`` for a gradient: ``dx`` of this device's window placed in its
        rows with halos, its own rows kept, and the neighbours' gradients of its rows that were
        their halos added."""
        r, left, right = self.rows, self.left, self.right
        shape = list(dx.shape)
        shape[self.axis] = left + r + right
        start = self._start()
        if isinstance(start, int):
            pad = [(0, 0)] * dx.ndim
            pad[self.axis] = (start, shape[self.axis] - start - self.length)
            rows = jnp.pad(dx, pad)
        else:
            rows = lax.dynamic_update_slice_in_dim(jnp.zeros(shape, dx.dtype), dx, start,
                                                   axis=self.axis)
        own = lax.slice_in_dim(rows, left, left + r, axis=self.axis)
        for h, n, at in self._hops(left):  # this block's last n rows were block i + h's halo
            got = self._send(lax.slice_in_dim(rows, left - at - n, left - at, axis=self.axis), -h)
            own = lax.dynamic_update_slice_in_dim(
                own, lax.slice_in_dim(own, r - n, r, axis=self.axis) + got, r - n, axis=self.axis)
        for h, n, at in self._hops(right):  # its first n rows were block i - h's halo
            tail = lax.slice_in_dim(rows, left + r + at, left + r + at + n, axis=self.axis)
            own = lax.dynamic_update_slice_in_dim(
                own, lax.slice_in_dim(own, 0, n, axis=self.axis) + self._send(tail, h), 0,
                axis=self.axis)
        return own


def call(kernel: Kernel, a: Array, b: Array, p: ConvProblem, local: Local) -> Array:
    """``local(a, b, p)`` in a partitioned program: per device's blocks, as the module says."""
    maps = [_factors(t, p) for t in _ROLES[kernel]]
    rule, reduction, replicated = _rule(kernel, p)

    @custom_partitioning
    def whole(a: Array, b: Array) -> Array:
        return local(a, b, p, 0)

    def partition(mesh, arg_shapes, result_shape):  # type: ignore[no-untyped-def]
        # the mesh axes each factor is split over, read from the operands as they come (the
        # first operand's where two differ); a factor is kept split where the local problem
        # exists (a group is not split) and no factor
        # before it (n, c, o, g, s0, ...) took one of its axes: the result's sharding must name
        # each mesh axis once. Blocks that do not divide a size are XLA's (ceil(size / count),
        # the last ones padded): where the factor is summed over, its padding is masked to zeros
        # in both operands (its contents are not zeros, and 0 * NaN is not 0)
        found: dict[str, tuple[str, ...]] = {}
        for dims, shape in zip(maps, arg_shapes):
            spec = tuple(shape.sharding.spec) + (None,) * len(dims)
            for d, entry in zip(dims, spec):
                if _splittable(d) and _mesh_axes(entry):
                    found.setdefault(d, _mesh_axes(entry))
        split: dict[str, tuple[str, ...]] = {}
        fields: dict[str, typing.Any] = {}
        halos: list[_Halo] = []
        uneven: list[tuple[str, _Blocks, int, int]] = []  # factor, blocks, block, size
        order = [*_SPLIT, *(f"s{k}" for k in range(p.rank))]
        for f in (f for f in order if f in found):
            axes, taken = found[f], {ax for a in split.values() for ax in a}
            count = math.prod(mesh.shape[ax] for ax in axes)
            if taken.intersection(axes):
                continue
            if f == "g":  # each device whole groups
                if p.groups % count == 0:
                    split[f] = axes
                    fields.update({name: getattr(p, name) // count for name in _SPLIT[f]})
                continue
            if f in _SPLIT:
                (name,) = _SPLIT[f]
                size = getattr(p, name)
                split[f], fields[name] = axes, -(-size // count)
                if fields[name] * count != size and f in reduction:
                    uneven.append((f, _Blocks.of(mesh, axes), fields[name], size))
                continue
            k = int(f[1:])
            halo = _Halo.of(p, k, p.data.spatial_axes[k], _Blocks.of(mesh, axes))
            split[f] = axes
            halos.append(halo)
            for name, value in (("input_size", halo.length), ("output_size", halo.out_rows),
                                ("pads_begin", 0), ("pads_end", 0)):
                t = list(fields.get(name, getattr(p, name)))
                t[k] = value
                fields[name] = tuple(t)
        sub = dataclasses.replace(p, **fields)

        def named(dims: list[str]) -> NamedSharding:
            spec = [None if d not in split else (split[d][0] if len(split[d]) == 1 else split[d])
                    for d in dims]
            return NamedSharding(mesh, P(*spec))  # type: ignore[no-untyped-call]
        args = (named(maps[0]), named(maps[1]))
        out = named(maps[2])
        summed = tuple(ax for f in reduction if f in split for ax in split[f])

        # several of this process's devices run their shards' calls at once on the same cores:
        # each on one thread (the handler's rule would have them queue for its OpenMP team)
        mine = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
        threads = 1 if mine > 1 else 0

        def lower(a: Array, b: Array) -> Array:
            for f, blocks, block, size in uneven:  # padding summed over: zeros
                a = _masked(a, maps[0].index(f), blocks.index() * block, size)
                b = _masked(b, maps[1].index(f), blocks.index() * block, size)
            for h in halos:
                if kernel is not Kernel.DATA:  # a is x: each device's window of rows
                    a = h.fetch(a)
                if kernel is not Kernel.FORWARD:  # dy: its rows, padding zeroed
                    b, a = (h.masked(b), a) if kernel is Kernel.WEIGHT else (b, h.masked(a))
            y = local(a, b, sub, threads)
            if kernel is Kernel.DATA:  # dx of the window: the halos' part given back
                for h in reversed(halos):
                    y = h.give_back(y)
            if summed:  # each device holds a partial sum
                y = jax.lax.psum(y, summed)  # type: ignore[no-untyped-call]
            return y
        return mesh, lower, out, args

    whole.def_partition(  # type: ignore[no-untyped-call]
        partition=partition, sharding_rule=rule, need_replication_factors=replicated,
        reduction_factors=reduction)
    out: Array = whole(a, b)
    return out
