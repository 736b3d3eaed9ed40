"""Child-process scripts for tests/core/test_hazards.py (HAZARDS.md section 1).

jaxlib 0.10.2 on CPU aborts the whole process (SIGABRT in XLA's
AlgebraicSimplifier, "Window dimensions do not match RHS shape") when compiling
the input gradient of a strided + dilated convolution whose padded input has an
unused remainder. These scripts run in a subprocess so that an abort fails a
test instead of killing the test run.

usage: python -m tests.hazards.xla_vjp_abort plain|jaxconv|jaxconv-full
  plain    the upstream reproducer: jax.vjp of lax.conv_general_dilated (aborts on 0.10.2)
  jaxconv  the same configuration and its neighbours through every jaxconv op
           (convolution and ConvTranspose families), each gradient op also with
           lowering="vjp" (JAX's own program, the default off CPU and GPU),
           their gradients and second derivatives (must exit 0); jaxconv-full
           takes every lowering of the gradient ops
"""

from __future__ import annotations

import functools
import itertools
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

# The reproducer: NCHW (1, 2, 6, 3), HWIO (2, 3, 2, 4), strides (2, 2),
# pads H (1, 1) W (3, 2), rhs_dilation (1, 2).
X_SHAPE, W_SHAPE = (1, 2, 6, 3), (2, 3, 2, 4)
ATTRS = dict(strides=(2, 2), pads_begin=(1, 3), pads_end=(1, 2), dilations=(1, 2))


def plain() -> None:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(X_SHAPE), jnp.float32)
    w = jnp.asarray(rng.standard_normal(W_SHAPE), jnp.float32)

    def f(x):
        return lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (3, 2)], rhs_dilation=(1, 2),
                                        dimension_numbers=("NCHW", "HWIO", "NCHW"))

    y, vjp = jax.vjp(f, x)
    print(vjp(jnp.ones_like(y))[0].shape, flush=True)


def neighbours(full: bool):
    """The reproducer and a family around it: strides, dilations and pads nearby."""
    yield X_SHAPE[2:], W_SHAPE[:2], ATTRS
    sizes = [(6, 3), (7, 5)] if full else [(6, 3)]
    begins = [(1, 3), (0, 1)] if full else [(1, 3)]
    for (h, wd), (kh, kw), (sh, sw), (dh, dw), (pt, pl), (pb, pr) in itertools.product(
        sizes, [(2, 3)], [(2, 2), (3, 2)], [(1, 2), (2, 3)], begins, [(1, 2), (0, 0)],
    ):
        yield (h, wd), (kh, kw), dict(strides=(sh, sw), pads_begin=(pt, pl), pads_end=(pb, pr),
                                      dilations=(dh, dw))


def ours(full: bool = False) -> None:
    import jaxconv

    rng = np.random.default_rng(0)
    count = 0
    for spatial, kernel, attrs in neighbours(full):
        a = dict(attrs, data_format="NCX", filter_format="XIO")
        x = jnp.asarray(rng.standard_normal((1, 2, *spatial)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((*kernel, 2, 4)), jnp.float32)
        try:
            y = jaxconv.convolution(x, w, **a)
        except ValueError:  # kernel larger than the padded input: not a valid problem
            continue
        dy = jnp.ones_like(y)

        def conv(x, w):
            return jaxconv.convolution(x, w, **a)

        def bwd_data(dy, w, m="auto"):
            return jaxconv.convolution_backward_data(dy, w, x.shape, **a, lowering=m)

        def bwd_filter(x, dy, m="auto"):
            return jaxconv.convolution_backprop_filters(x, dy, w.shape, **a, lowering=m)

        # The ConvTranspose of the same geometry: input = y's shape, output = x's.
        t = dict(attrs, data_format="NCX", filter_format="XIO")
        t["output_padding"] = tuple(
            (i + b + e - ((k - 1) * dl + 1)) % s
            for i, k, s, dl, b, e in zip(spatial, kernel, attrs["strides"], attrs["dilations"],
                                         attrs["pads_begin"], attrs["pads_end"]))
        wt = jnp.asarray(rng.standard_normal((*kernel, 4, 2)), jnp.float32)  # XIO: IC=4, OC/g=2

        def convt(y, wt, m="auto"):
            return jaxconv.conv_transpose(y, wt, **t, lowering=m)

        def convt_data(dx, wt):
            return jaxconv.conv_transpose_backward_data(dx, wt, **t)

        def convt_weights(y, dx, m="auto"):
            return jaxconv.conv_transpose_backprop_filters(y, dx, wt.shape, **t, lowering=m)

        data_methods = ("auto", "grid", "phases", "dot", "vjp") if full else ("auto", "vjp")
        weight_methods = ("auto", "conv", "dot", "vjp") if full else ("auto", "vjp")
        cases = [(conv, (x, w)), (convt_data, (x, wt))]
        for m in data_methods:
            cases += [(functools.partial(bwd_data, m=m), (dy, w)),
                      (functools.partial(convt, m=m), (dy, wt))]
        for m in weight_methods:
            cases += [(functools.partial(bwd_filter, m=m), (x, dy)),
                      (functools.partial(convt_weights, m=m), (dy, x))]
        for f, args in cases:
            loss = lambda *args, f=f: jnp.sum(f(*args) ** 2)  # noqa: E731
            jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1)))(*args))
            # second order: the gradient of a gradient
            g2 = jax.grad(lambda a0, a1, loss=loss: jnp.sum(jax.grad(loss)(a0, a1) ** 2),
                          argnums=1)
            jax.block_until_ready(jax.jit(g2)(*args))
        count += 1
    print(f"ok {count} configurations", flush=True)


if __name__ == "__main__":
    {"plain": plain, "jaxconv": ours, "jaxconv-full": lambda: ours(full=True)}[sys.argv[1]]()
