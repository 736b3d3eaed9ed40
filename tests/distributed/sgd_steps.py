"""One process of a data-parallel training run (tests/core/test_distributed.py, docs/distributed.md).

    python -m tests.distributed.sgd_steps PROCESS_ID NUM_PROCESSES COORDINATOR OUT.npz

Each process joins JAX's distributed runtime (``jax.distributed.initialize``, CPU collectives
over gloo), takes its slice of one global batch and runs 3 SGD steps of a convolution block
whose gradients are jaxconv's kernels: inside ``shard_map`` over the processes' devices, each
computes the gradient of the batch's mean loss (``pmean`` of the slices' losses: the gradient
of the shared parameters is all-reduced across processes). Without
``PROCESS_ID`` arguments (``single``) it runs the same steps on the whole batch in one process:
the reference. Process 0 (or the single run) writes the final parameters to OUT.npz.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxconv  # noqa: E402

GLOBAL_BATCH, STEPS, LR = 8, 3, 0.05


def init() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The block's parameters and the global batch (the same in every process)."""
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((3, 3, 4, 8)).astype(np.float32) / 6,
              "w2": rng.standard_normal((3, 3, 8, 8)).astype(np.float32) / 8}
    x = rng.standard_normal((GLOBAL_BATCH, 12, 12, 4)).astype(np.float32)
    target = rng.standard_normal((GLOBAL_BATCH, 6, 6, 8)).astype(np.float32)
    return params, x, target


def loss(params, x, target):
    """A stride-2 convolution, ReLU, a second convolution; mean squared error."""
    h = jax.nn.relu(jaxconv.convolution(x, params["w1"], strides=2, pads_begin=1, pads_end=0))
    y = jaxconv.convolution(h, params["w2"], pads_begin=1, pads_end=1)
    return jnp.mean((y - target) ** 2)


def sgd(params, grads):
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)


def single(out: str) -> None:
    params, x, target = init()
    step = jax.jit(lambda p, x, t: sgd(p, jax.grad(loss)(p, x, t)))
    for _ in range(STEPS):
        params = step(params, x, target)
    np.savez(out, **jax.device_get(params))


def distributed(process_id: int, num_processes: int, coordinator: str, out: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id,
                               initialization_timeout=120)
    mesh = Mesh(np.array(jax.devices()), ("data",))  # every process's devices
    params, x, target = init()
    rows = GLOBAL_BATCH // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    batch = NamedSharding(mesh, P("data"))
    xs = jax.make_array_from_process_local_data(batch, x[mine], x.shape)
    ts = jax.make_array_from_process_local_data(batch, target[mine], target.shape)
    replicated = NamedSharding(mesh, P())
    params = jax.tree_util.tree_map(
        lambda p: jax.make_array_from_process_local_data(replicated, p, p.shape), params)

    def local_step(p, x, t):  # one device's slice; the loss is the mean over the mesh's
        # (the parameters are the same on every device: their gradient is reduced across the
        # mesh by shard_map's own transpose, one all-reduce per parameter)
        grads = jax.grad(lambda p: jax.lax.pmean(loss(p, x, t), "data"))(p)
        return sgd(p, grads)

    step = jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                 out_specs=P()))
    for _ in range(STEPS):
        params = step(params, xs, ts)
    values = {k: np.asarray(jax.device_get(v.addressable_data(0))) for k, v in params.items()}
    if jax.process_index() == 0:
        np.savez(out, **values)
    jax.distributed.shutdown()
    print(f"process {process_id}: done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "single":
        single(sys.argv[2])
    else:
        distributed(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
