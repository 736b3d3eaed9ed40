"""A oneDNN call in a program XLA's SPMD partitioner splits across devices.

The partitioner cannot see inside a custom call: left to itself it would gather the operands
onto every device. So the call is wrapped in ``jax.experimental.custom_partitioning`` with a
Shardy rule that names, for each dimension of each operand, the factor it holds; the sharded
factors a local call can compute on are kept sharded, and each device runs oneDNN on its
blocks (a sub-problem with fewer examples, channels or rows):

    forward  x[n, c, s], W[o, c, k]  -> y[n, o, s]    c summed over
    data     dy[n, o, s], W[o, c, k] -> dx[n, c, s]   o summed over
    weight   x[n, c, s], dy[n, o, s] -> dW[o, c, k]   n, s summed over

A factor that appears in both operands and not in the result is a reduction factor: sharded,
each device's call computes a partial result from its slices of the sum, and one all-reduce
(``psum``) adds them; the other factors pass through. So a batch-sharded step runs its forward
and data gradient shard-local and each weight gradient with one all-reduce; channels sharded
as in tensor parallelism (the filter's output channels and the activations' channels with
them) compute shard-local or with one all-reduce of the result. The rows ``s`` of a spatial
axis whose input and output are of one size (stride 1, "same" padding) stay sharded too: a
window reads its neighbours' rows, so each device fetches a halo of them (``_Halo``: collective
permutes, no gather). No activation is gathered for any of these.

What no local call computes is replicated before the call (``need_replication_factors``: the
partitioner gathers it): the spatial axes of any other convolution (strided, or valid: their
blocks of input and output rows do not line up), and, where there are several groups, the
channels (a group's channels would have to stay on one device). A factor whose size the mesh
axes do not divide is gathered too (uneven slices would hold padding), as are the rows split
over more than one mesh axis or with halos longer than a block, and the later (in the order
n, c, o, s0, ...) of two factors split over the same mesh axis (a weight gradient of
activations whose input and output channels are both sharded over it: its result could not
be sharded both ways).
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
#: the factors a local call computes on, and the field of the problem each one divides
_SPLIT = {"n": "batch", "c": "in_channels", "o": "out_channels"}


def _rows(p: ConvProblem, k: int) -> bool:
    """Whether spatial axis ``k`` may stay sharded: a "same" convolution (input and output of
    one size, stride 1), so a device's block of output rows reads the windows that start in
    its own block of input rows (and a halo of its neighbours' rows). (With a stride s and an
    input s times the output the same holds, but the rule would have to name x's axis a
    compound of output rows and phases, and Shardy then splits a mesh axis into sub-axes
    where the rows do not divide evenly, which custom_partitioning cannot take: a
    ``KeyError`` in JAX's sharding conversion, on 12 rows of stride 2 over 4 devices.)"""
    return p.strides[k] == 1 and p.input_size[k] == p.output_size[k]


def _factors(tensor: str, p: ConvProblem) -> list[str]:
    """The factor each dimension of ``tensor`` holds: "n", "c", "o", "s<k>" (the rows of spatial
    axis k, in x and y alike) where a local call can compute on a block of it, else a name of
    its own (replicated)."""
    dims = [""] * (p.rank + 2)
    grouped = p.groups > 1  # a slice of the channels would split groups
    if tensor == "w":
        o_axis, i_axis, *spatial = p.filter_layout.spec(swap=p.filter_swap)
        dims[o_axis] = "w_o" if grouped else "o"
        dims[i_axis] = "w_i" if grouped else "c"
        for k, axis in enumerate(spatial):
            dims[axis] = f"w_s{k}"
        return dims
    dims[p.data.batch_axis] = "n"
    dims[p.data.channel_axis] = f"{tensor}_c" if grouped else ("c" if tensor == "x" else "o")
    for k, axis in enumerate(p.data.spatial_axes):
        dims[axis] = f"s{k}" if _rows(p, k) else f"{tensor}_s{k}"
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


def _permute(x: Array, mesh_axis: str, pairs: list[tuple[int, int]]) -> Array:
    """``x`` sent from device i to j along ``mesh_axis`` for each (i, j); zeros where none
    is received."""
    out: Array = lax.ppermute(x, mesh_axis, pairs)  # type: ignore[no-untyped-call]
    return out


@dataclasses.dataclass(frozen=True)
class _Halo:
    """Spatial axis ``axis`` (of the data operands) split over mesh axis ``mesh_axis`` into
    ``count`` blocks of ``rows`` rows (input and output alike). The windows of a block's outputs
    read ``left`` rows of the previous block (the begin pad) and ``right`` of the next
    (negative: its own last rows go unread):

        right = (kernel - 1) * dilation - pad_begin

    so each device computes a valid (unpadded) convolution of its rows with those halos:
    forward and weight gradient fetch the halos first (zeros beyond the edge blocks: the
    padding); a data gradient computes that convolution's input gradient and hands the halo
    rows' part to the neighbours, who add it to theirs."""

    axis: int
    mesh_axis: str
    count: int
    rows: int
    left: int
    right: int

    def fetch(self, x: Array) -> Array:
        """This block's rows with its halos (zeros beyond the edge blocks)."""
        n = self.count
        parts = []
        if self.left:
            tail = lax.slice_in_dim(x, self.rows - self.left, self.rows, axis=self.axis)
            parts.append(_permute(tail, self.mesh_axis, [(i, i + 1) for i in range(n - 1)]))
        parts.append(x if self.right >= 0 else
                     lax.slice_in_dim(x, 0, self.rows + self.right, axis=self.axis))
        if self.right > 0:
            head = lax.slice_in_dim(x, 0, self.right, axis=self.axis)
            parts.append(_permute(head, self.mesh_axis, [(i + 1, i) for i in range(n - 1)]))
        return lax.concatenate(parts, self.axis) if len(parts) > 1 else parts[0]

    def give_back(self, dx: Array) -> Array:
        """The inverse of ``fetch`` for a gradient: this block's rows of ``dx`` (its rows with
        halos), plus the neighbours' gradients of its rows that were their halos."""
        n, r = self.count, self.right
        own = lax.slice_in_dim(dx, self.left, self.left + self.rows + min(r, 0), axis=self.axis)
        if r < 0:  # rows no window read: no gradient
            pad = [(0, 0)] * dx.ndim
            pad[self.axis] = (0, -r)
            own = jnp.pad(own, pad)
        if self.left:  # the previous block's last rows, read by this block's windows
            head = lax.slice_in_dim(dx, 0, self.left, axis=self.axis)
            got = _permute(head, self.mesh_axis, [(i + 1, i) for i in range(n - 1)])
            own = lax.dynamic_update_slice_in_dim(
                own, lax.slice_in_dim(own, self.rows - self.left, self.rows, axis=self.axis)
                + got, self.rows - self.left, axis=self.axis)
        if r > 0:  # the next block's first rows
            tail = lax.slice_in_dim(dx, self.left + self.rows, self.left + self.rows + r,
                                    axis=self.axis)
            got = _permute(tail, self.mesh_axis, [(i, i + 1) for i in range(n - 1)])
            own = lax.dynamic_update_slice_in_dim(
                own, lax.slice_in_dim(own, 0, r, axis=self.axis) + got, 0, axis=self.axis)
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
        # exists (its axes divide its size; a spatial one over one mesh axis, with halos no
        # longer than a block) and no factor before it (n, c, o, s0, ...) took one of its
        # axes: the result's sharding must name each mesh axis once
        found: dict[str, tuple[str, ...]] = {}
        for dims, shape in zip(maps, arg_shapes):
            spec = tuple(shape.sharding.spec) + (None,) * len(dims)
            for d, entry in zip(dims, spec):
                if _splittable(d) and _mesh_axes(entry):
                    found.setdefault(d, _mesh_axes(entry))
        split: dict[str, tuple[str, ...]] = {}
        fields: dict[str, typing.Any] = {}
        halos: list[_Halo] = []
        order = [*_SPLIT, *(f"s{k}" for k in range(p.rank))]
        for f in (f for f in order if f in found):
            axes, taken = found[f], {ax for a in split.values() for ax in a}
            count = math.prod(mesh.shape[ax] for ax in axes)
            if taken.intersection(axes):
                continue
            if f in _SPLIT:
                if getattr(p, _SPLIT[f]) % count == 0:
                    split[f], fields[_SPLIT[f]] = axes, getattr(p, _SPLIT[f]) // count
                continue
            k = int(f[1:])
            if len(axes) != 1 or p.output_size[k] % count:
                continue
            rows = p.input_size[k] // count
            left = p.pads_begin[k]
            right = (p.kernel[k] - 1) * p.dilations[k] - left
            if 0 <= left <= rows and -rows < right <= rows:
                split[f] = axes
                halos.append(_Halo(p.data.spatial_axes[k], axes[0], count, rows, left, right))
                for name, value in (("input_size", rows + left + right),
                                    ("output_size", p.output_size[k] // count),
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
            if kernel is not Kernel.DATA:  # a is x: its rows with their halos
                for h in halos:
                    a = h.fetch(a)
            y = local(a, b, sub, threads)
            if kernel is Kernel.DATA:  # dx of the rows with halos: the halos' part given back
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
