"""A oneDNN call in a program XLA's SPMD partitioner splits across devices.

The partitioner cannot see inside a custom call: left to itself it would gather the operands
onto every device. So the call is wrapped in ``jax.experimental.custom_partitioning`` with a
Shardy rule in which the batch is the only factor that may stay sharded (every other factor of
every operand needs replication): a batch-sharded forward or data gradient then runs the call
on each device's slice of the batch, shard-local; a weight gradient, whose batch is a reduction
factor (in both operands, not in the result), runs it on each slice and sums the partial
gradients with one all-reduce (``psum``). Any other sharding is made to fit by the partitioner
before the call: a filter sharded over its output channels is gathered, and so are activations
sharded along a channel or spatial axis (within their batch shard); no rule here splits those.

    forward  x[n, ...], W[...]  -> y[n, ...]     n sharded: y sharded like x
    data     dy[n, ...], W[...] -> dx[n, ...]    n sharded: dx sharded like dy
    weight   x[n, ...], dy[n, ...] -> dW[...]    n sharded: psum of the slices' dW
"""

from __future__ import annotations

import dataclasses
import string
import typing
from collections.abc import Callable

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, Kernel

#: a local problem's kernel call: (a, b, the problem of this device's slice, its threads: 0 the
#: handler's own rule, 1 one thread) -> result
Local = Callable[[Array, Array, ConvProblem, int], Array]


def _batch_axes(kernel: Kernel, p: ConvProblem) -> tuple[int | None, int | None, int | None]:
    """The batch axis of a, b and the result (None: the operand has no batch)."""
    n = p.data.batch_axis
    return {Kernel.FORWARD: (n, None, n), Kernel.DATA: (n, None, n),
            Kernel.WEIGHT: (n, n, None)}[kernel]


def _rule(kernel: Kernel, p: ConvProblem) -> tuple[str, tuple[str, ...]]:
    """The Shardy rule (einsum-like: every dimension its own factor, except the batch "n" of the
    operands that have one) and the factors that need replication: all but the batch (a
    reduction factor in a weight gradient)."""
    names = iter(string.ascii_lowercase.replace("n", ""))
    maps, others = [], []
    for axis in _batch_axes(kernel, p):
        dims = []
        for d in range(p.rank + 2):
            dims.append("n" if d == axis else next(names))
            if d != axis:
                others.append(dims[-1])
        maps.append(" ".join(dims))
    return f"{maps[0]}, {maps[1]} -> {maps[2]}", tuple(others)


def call(kernel: Kernel, a: Array, b: Array, p: ConvProblem, local: Local) -> Array:
    """``local(a, b, p)`` in a partitioned program: per batch shard, as the module says."""
    n_a, n_b, n_out = _batch_axes(kernel, p)
    rank = p.rank + 2

    @custom_partitioning
    def whole(a: Array, b: Array) -> Array:
        return local(a, b, p, 0)

    def partition(mesh, arg_shapes, result_shape):  # type: ignore[no-untyped-def]
        spec_a = tuple(arg_shapes[0].sharding.spec) + (None,) * rank
        # the mesh axes the batch is split over (None: not split)
        batch = spec_a[typing.cast(int, n_a)]
        axes = () if batch is None else (batch if isinstance(batch, tuple) else (batch,))
        shards = 1
        for ax in axes:
            shards *= mesh.shape[ax]
        if p.batch % shards:  # uneven slices would hold padding: the whole batch everywhere
            batch, axes, shards = None, (), 1

        def named(batch_axis: int | None) -> NamedSharding:
            spec = [None] * rank
            if batch_axis is not None:
                spec[batch_axis] = batch
            return NamedSharding(mesh, P(*spec))  # type: ignore[no-untyped-call]
        args = (named(n_a), named(n_b))
        out = named(n_out)

        # several of this process's devices run their shards' calls at once on the same cores:
        # each on one thread (the handler's rule would have them queue for its OpenMP team)
        mine = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
        threads = 1 if mine > 1 else 0

        def lower(a: Array, b: Array) -> Array:
            sub = dataclasses.replace(p, batch=p.batch // shards)
            y = local(a, b, sub, threads)
            if kernel is Kernel.WEIGHT and axes:
                y = jax.lax.psum(y, axes)  # type: ignore[no-untyped-call]  # partial gradients
            return y
        return mesh, lower, out, args

    rule, replicated = _rule(kernel, p)
    whole.def_partition(  # type: ignore[no-untyped-call]
        partition=partition, sharding_rule=rule, need_replication_factors=replicated,
        reduction_factors=("n",) if kernel is Kernel.WEIGHT else ())
    out: Array = whole(a, b)
    return out
