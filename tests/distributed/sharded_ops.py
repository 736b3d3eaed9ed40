"""Runs in a child process with 8 simulated CPU devices (tests/core/test_sharding.py).

Every op under ``jax.jit`` with ``NamedSharding`` inputs (batch-sharded data, replicated or
sharded filters) and inside ``shard_map`` (weight gradients reduced across the data axis with
``psum``), each compared with the single-device result. Prints ``ok N`` on success.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # as a script only: pytest imports this module (doctests) too
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxconv  # noqa: E402
from jaxconv import tbe  # noqa: E402

try:
    from jax import shard_map  # jax >= 0.6
except ImportError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map

HIGHEST = lax.Precision.HIGHEST
TOL = 1e-5


def close(a, b, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = np.max(np.abs(a - b)) / max(1.0, np.max(np.abs(b)))
    assert a.shape == b.shape and err <= TOL, f"{what}: {a.shape} vs {b.shape}, error {err:.2e}"


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    # N16 (4 per data shard), NXC, 4 -> 8 channels in 2 groups, stride 2, same_upper
    x = jnp.asarray(rng.standard_normal((16, 12, 12, 4)), jnp.float32)
    a = dict(strides=2, auto_pad="same_upper", groups=2, precision=HIGHEST)
    w = jnp.asarray(rng.standard_normal((3, 3, 2, 8)), jnp.float32)  # XIO
    y = jaxconv.convolution(x, w, **a)
    dy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)

    batch = NamedSharding(mesh, P("data"))
    repl = NamedSharding(mesh, P())
    out_ch = NamedSharding(mesh, P(None, None, None, "model"))  # filters sharded over O
    xs, dys = jax.device_put(x, batch), jax.device_put(dy, batch)
    count = 0

    ops = {
        "convolution": (lambda x, w: jaxconv.convolution(x, w, **a), (xs, jax.device_put(w, repl))),
        "convolution (O-sharded filter)": (lambda x, w: jaxconv.convolution(x, w, **a),
                                           (xs, jax.device_put(w, out_ch))),
        "convolution_backward_data": (
            lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **a),
            (dys, jax.device_put(w, repl))),
        "convolution_backprop_filters": (
            lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **a), (xs, dys)),
        "conv_transpose": (
            lambda dy, w: jaxconv.conv_transpose(dy, w, filter_format="XIO", strides=2,
                                                 pads_begin=0, pads_end=1, groups=2,
                                                 precision=HIGHEST),
            (dys, jax.device_put(jnp.swapaxes(w, 2, 3).reshape(3, 3, 8, 2), repl))),
        "conv_transpose_backward_weights": (
            lambda dy, x: jaxconv.conv_transpose_backward_weights(
                dy, x, (3, 3, 2, 8), strides=2, pads_begin=0, pads_end=1, groups=2,
                precision=HIGHEST), (dys, xs)),
    }
    xn = jnp.asarray(rng.standard_normal((16, 8, 6, 6)), jnp.float32)  # NCX data for OpenVINO
    f = jnp.asarray(rng.standard_normal((2, 4, 3, 3, 3)), jnp.float32)  # [G, C_IN, C_OUT, K]
    ops["group_convolution_backprop_data"] = (
        lambda d, f: jaxconv.group_convolution_backprop_data(d, f, strides=2, pads_begin=1,
                                                             pads_end=1, precision=HIGHEST),
        (jax.device_put(xn, batch), jax.device_put(f, repl)))
    x5 = tbe.to_5hd(jnp.transpose(x, (0, 3, 1, 2)))
    dy5 = tbe.to_5hd(jnp.transpose(dy, (0, 3, 1, 2)))
    para = {"strides": [2, 2], "padding": [0, 1, 0, 1], "dilations": [1, 1, 1, 1], "groups": 2}
    ops["conv2d_backprop_filter"] = (
        lambda a5, b5: jaxconv.conv2d_backprop_filter(a5, b5, (8, 2, 3, 3), para),
        (jax.device_put(x5, batch), jax.device_put(dy5, batch)))

    for name, (fn, args) in ops.items():
        single = fn(*[jax.device_put(v, jax.devices()[0]) for v in args])
        sharded = jax.jit(fn)(*args)
        close(sharded, single, f"jit + NamedSharding: {name}")
        assert len(sharded.sharding.device_set) == 8, (name, sharded.sharding)  # ran on all 8
        count += 1

    # shard_map: per-shard weight gradients, summed across the data axis
    def local(x, dy):
        return lax.psum(jaxconv.convolution_backprop_filters(x, dy, w.shape, **a), "data")

    dw_sm = jax.jit(shard_map(local, mesh=mesh, in_specs=(P("data"), P("data")),
                              out_specs=P()))(xs, dys)
    close(dw_sm, jaxconv.convolution_backprop_filters(x, dy, w.shape, **a), "shard_map + psum")
    count += 1

    # jax.grad inside shard_map: the replicated filter's gradient is reduced across the mesh by
    # shard_map's own transpose (jaxconv's results vary over the axes their operands vary over)
    def mse(w, x, t):
        return jnp.mean((jaxconv.convolution(x, w, **a) - t) ** 2)

    def local_grads(w, x, t):
        return jax.grad(lambda w, x: lax.pmean(mse(w, x, t), "data"), argnums=(0, 1))(w, x)

    t = y * 0.5
    gw, gx = jax.jit(shard_map(local_grads, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                               out_specs=(P(), P("data"))))(jax.device_put(w, repl), xs,
                                                            jax.device_put(t, batch))
    want_w, want_x = jax.grad(mse, argnums=(0, 1))(w, x, t)
    close(gw, want_w, "jax.grad in shard_map: replicated filter")
    close(gx, want_x, "jax.grad in shard_map: batch-sharded data")
    count += 1

    # a data-parallel training step whose conv gradient is jaxconv's
    def step(w, x, t):
        y = jaxconv.convolution(x, w, **a)
        dy = (y - t) / y.size
        return w - 0.1 * jaxconv.convolution_backprop_filters(x, dy, w.shape, **a)

    t = jax.device_put(t, batch)
    w1 = jax.jit(step)(jax.device_put(w, repl), xs, t)
    close(w1, step(w, x, y * 0.5), "data-parallel step")
    assert w1.sharding.is_fully_replicated
    count += 1

    # jaxconv.accelerate of an unmodified lax step: under sharded jit, and inside shard_map
    def lax_loss(w, x):
        y = lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=(
            "NHWC", "HWIO", "NHWC"), feature_group_count=2, precision=HIGHEST)
        return jnp.mean((y - 0.5) ** 2)

    grads = jax.grad(lax_loss, argnums=(0, 1))
    want = grads(w, x)
    fast = jax.jit(jaxconv.accelerate(grads))
    assert "jaxconv_conv" in str(jax.make_jaxpr(jaxconv.accelerate(grads))(w, x))
    for got, ref, what in zip(fast(jax.device_put(w, repl), xs), want, ("filter", "data")):
        close(got, ref, f"accelerate under sharded jit: {what}")
    count += 1

    def local_accelerated(w, x):  # as "jax.grad in shard_map" above, lax's convolution
        return jaxconv.accelerate(jax.grad(lambda w, x: lax.pmean(lax_loss(w, x), "data"),
                                           argnums=(0, 1)))(w, x)

    mapped = shard_map(local_accelerated, mesh=mesh, in_specs=(P(), P("data")),
                       out_specs=(P(), P("data")))
    assert "conv_general_dilated[" not in str(jax.make_jaxpr(mapped)(w, x))
    gw, gx = jax.jit(mapped)(jax.device_put(w, repl), xs)
    close(gw, want[0], "accelerate in shard_map: filter")
    close(gx, want[1], "accelerate in shard_map: data")
    count += 1
    print(f"ok {count}", flush=True)


if __name__ == "__main__":
    main()
