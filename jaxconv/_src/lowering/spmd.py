"""A oneDNN call in a program XLA's SPMD partitioner splits across devices.

The partitioner cannot see inside a custom call: left to itself it would gather the operands
onto every device. So the call is wrapped in ``jax.experimental.custom_partitioning`` with a
Shardy rule that names, for each dimension of each operand, the factor it holds; the sharded
factors a local call can compute on are kept sharded, and each device runs oneDNN on its
blocks (a sub-problem with fewer examples or channels):

    forward  x[n, c, ...], W[o, c, ...]  -> y[n, o, ...]    c summed over
    data     dy[n, o, ...], W[o, c, ...] -> dx[n, c, ...]   o summed over
    weight   x[n, c, ...], dy[n, o, ...] -> dW[o, c, ...]   n summed over

A factor that appears in both operands and not in the result is a reduction factor: sharded,
each device's call computes a partial result from its slices of the sum, and one all-reduce
(``psum``) adds them; the other factors pass through (shard-local, no communication). So a
batch-sharded step runs its forward and data gradient shard-local and each weight gradient with
one all-reduce; channels sharded as in tensor parallelism (the filter's output channels and
the activations' channels with them) compute shard-local or with one all-reduce of the
result, and never gather an activation.

What no local call computes is replicated before the call (``need_replication_factors``: the
partitioner gathers it): the spatial axes (a window reads its neighbours' rows: a halo
exchange this rule does not do) and, where there are several groups, the channels (a group's
channels would have to stay on one device). A factor whose size the mesh axes do not divide is
gathered too (uneven slices would hold padding), and so is the later (in the order n, c, o) of
two factors split over the same mesh axis (a weight gradient of activations whose input and
output channels are both sharded over it: its result could not be sharded both ways).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, Kernel

#: a local problem's kernel call: (a, b, the problem of this device's blocks, its threads: 0
#: the handler's own rule, 1 one thread) -> result
Local = Callable[[Array, Array, ConvProblem, int], Array]

#: the tensors (x: the convolution's input, w: its filter, y: its output) that are a kernel's
#: operands a, b and its result, and the factor it sums over
_ROLES = {Kernel.FORWARD: ("x", "w", "y"), Kernel.DATA: ("y", "w", "x"),
          Kernel.WEIGHT: ("x", "y", "w")}
_REDUCED = {Kernel.FORWARD: "c", Kernel.DATA: "o", Kernel.WEIGHT: "n"}
#: the factors a local call computes on, and the field of the problem each one divides
_SPLIT = {"n": "batch", "c": "in_channels", "o": "out_channels"}


def _factors(tensor: str, p: ConvProblem) -> list[str]:
    """The factor each dimension of ``tensor`` holds: "n", "c", "o" where a local call can
    compute on a slice of it, else a name of its own (replicated)."""
    dims = [""] * (p.rank + 2)
    grouped = p.groups > 1  # a slice of the channels would split groups
    if tensor == "w":
        o_axis, i_axis, *spatial = p.filter_layout.spec(swap=p.filter_swap)
        dims[o_axis] = "w_o" if grouped else "o"
        dims[i_axis] = "w_i" if grouped else "c"
    else:
        spatial = list(p.data.spatial_axes)
        dims[p.data.batch_axis] = "n"
        dims[p.data.channel_axis] = f"{tensor}_c" if grouped else ("c" if tensor == "x" else "o")
    for k, axis in enumerate(spatial):
        dims[axis] = f"{tensor}_s{k}"
    return dims


def _rule(kernel: Kernel, p: ConvProblem) -> tuple[str, tuple[str, ...]]:
    """The Shardy rule (einsum-like) and the factors that need replication (all but
    ``_SPLIT``'s), in the order they first appear (Shardy's verifier wants them sorted by the
    index it gives each factor)."""
    maps = [_factors(t, p) for t in _ROLES[kernel]]
    replicated = list(dict.fromkeys(f for dims in maps for f in dims if f not in _SPLIT))
    return (f"{' '.join(maps[0])}, {' '.join(maps[1])} -> {' '.join(maps[2])}",
            tuple(replicated))


def _mesh_axes(entry: object) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names (None: none)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (typing.cast(str, entry),)


def call(kernel: Kernel, a: Array, b: Array, p: ConvProblem, local: Local) -> Array:
    """``local(a, b, p)`` in a partitioned program: per device's blocks, as the module says."""
    maps = [_factors(t, p) for t in _ROLES[kernel]]
    reduced = _REDUCED[kernel]

    @custom_partitioning
    def whole(a: Array, b: Array) -> Array:
        return local(a, b, p, 0)

    def partition(mesh, arg_shapes, result_shape):  # type: ignore[no-untyped-def]
        # the mesh axes each factor is split over, read from the operands as they come (the
        # first operand's where two differ); a factor is kept split where its axes divide its
        # size and no factor before it (n, c, o) took one of them: the result's sharding must
        # name each mesh axis once
        found: dict[str, tuple[str, ...]] = {}
        for dims, shape in zip(maps, arg_shapes):
            spec = tuple(shape.sharding.spec) + (None,) * len(dims)
            for f, entry in zip(dims, spec):
                if f in _SPLIT and _mesh_axes(entry):
                    found.setdefault(f, _mesh_axes(entry))
        split: dict[str, tuple[str, ...]] = {}
        counts: dict[str, int] = {}
        for f in (f for f in _SPLIT if f in found):
            axes, taken = found[f], {ax for a in split.values() for ax in a}
            count = math.prod(mesh.shape[ax] for ax in axes)
            if getattr(p, _SPLIT[f]) % count == 0 and not taken.intersection(axes):
                split[f], counts[f] = axes, count

        def named(dims: list[str]) -> NamedSharding:
            spec = [None if f not in split else
                    (split[f][0] if len(split[f]) == 1 else split[f]) for f in dims]
            return NamedSharding(mesh, P(*spec))  # type: ignore[no-untyped-call]
        args = (named(maps[0]), named(maps[1]))
        out = named(maps[2])
        sub = dataclasses.replace(p, **{_SPLIT[f]: getattr(p, _SPLIT[f]) // counts[f]
                                        for f in split})

        # several of this process's devices run their shards' calls at once on the same cores:
        # each on one thread (the handler's rule would have them queue for its OpenMP team)
        mine = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
        threads = 1 if mine > 1 else 0

        def lower(a: Array, b: Array) -> Array:
            y = local(a, b, sub, threads)
            if reduced in split:  # each device holds a partial sum
                y = jax.lax.psum(y, split[reduced])  # type: ignore[no-untyped-call]
            return y
        return mesh, lower, out, args

    rule, replicated = _rule(kernel, p)
    whole.def_partition(  # type: ignore[no-untyped-call]
        partition=partition, sharding_rule=rule, need_replication_factors=replicated,
        reduction_factors=(reduced,) if any(reduced in dims for dims in maps) else ())
    out: Array = whole(a, b)
    return out
