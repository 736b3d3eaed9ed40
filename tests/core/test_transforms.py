"""Every public op under jit, vmap and grad (check_grads to order 2, fwd and rev).

``PROBLEMS`` maps a problem id to a builder that returns, for every op of the
family, the op as a function of its array arguments only and those arguments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h

HIGHEST = lax.Precision.HIGHEST
SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 5)}
SMALL = {1: (4,), 2: (3, 4), 3: (3, 2, 3)}
KERNEL = {1: (3,), 2: (3, 2), 3: (2, 2, 2)}


def convolution_family(n, df, ff, attrs, ic, oc):
    def build(dtype=jnp.float32, seed=0, batch=2):
        a = dict(attrs, data_format=df, filter_format=ff, precision=HIGHEST)
        rng = np.random.default_rng(seed)
        x = h.random(rng, h.data_shape(df, batch, ic, SPATIAL[n]), dtype)
        w = h.random(rng, h.conv_filter_shape(ff, oc, ic // a.get("groups", 1), KERNEL[n]), dtype)
        dy = h.random(rng, jaxconv.convolution(x, w, **a).shape, dtype)
        return {
            "convolution": (lambda x, w: jaxconv.convolution(x, w, **a), (x, w)),
            "convolution_backward_data": (
                lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **a), (dy, w)),
            "convolution_backprop_filters": (
                lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **a), (x, dy)),
            "convolution_backward_weights": (
                lambda x, dy: jaxconv.convolution_backward_weights(
                    x, dy, w.shape, **{k: v for k, v in a.items() if k != "filter_format"},
                    weights_format=ff), (x, dy)),
        }
    return build


def conv_transpose_family(n, df, wf, attrs, ic, oc, output_shape=None):
    def build(dtype=jnp.float32, seed=0, batch=2):
        a = dict(attrs, data_format=df, precision=HIGHEST)
        g = a.get("groups", 1)
        rng = np.random.default_rng(seed)
        x = h.random(rng, h.data_shape(df, batch, ic, SMALL[n]), dtype)
        w = h.random(rng, h.convt_filter_shape(wf, ic, oc // g, KERNEL[n]), dtype)
        y = jaxconv.conv_transpose(x, w, **a, filter_format=wf)
        dy = h.random(rng, y.shape, dtype)
        ops = {
            "conv_transpose": (
                lambda x, w: jaxconv.conv_transpose(x, w, **a, filter_format=wf), (x, w)),
            "conv_transpose_backward_data": (
                lambda dy, w: jaxconv.conv_transpose_backward_data(dy, w, **a, filter_format=wf),
                (dy, w)),
            "conv_transpose_backward_weights": (
                lambda x, dy: jaxconv.conv_transpose_backward_weights(
                    x, dy, w.shape, **a, weights_format=wf), (x, dy)),
            "conv_transpose_backprop_filters": (
                lambda x, dy: jaxconv.conv_transpose_backprop_filters(
                    x, dy, w.shape, **a, filter_format=wf), (x, dy)),
        }
        if output_shape is not None:
            ops["conv_transpose[output_shape]"] = (
                lambda x, w: jaxconv.conv_transpose(
                    x, w, output_shape, **{k: v for k, v in a.items() if k != "output_padding"},
                    filter_format=wf), (x, w))
        return ops
    return build


def openvino_family(n, attrs, g, ci, co, output_shape=None):
    def build(dtype=jnp.float32, seed=0, batch=2):
        a = dict(attrs, precision=HIGHEST)
        rng = np.random.default_rng(seed)
        x = h.random(rng, (batch, g * ci, *SMALL[n]), dtype)
        w = h.random(rng, (g, ci, co, *KERNEL[n]), dtype)
        fwd_attrs = {k: v for k, v in a.items() if k in ("strides", "dilations", "precision")}
        y = jaxconv.group_convolution_backprop_data(x, w, output_shape, **a)
        return {
            "group_convolution_backprop_data": (
                lambda x, w: jaxconv.group_convolution_backprop_data(x, w, output_shape, **a),
                (x, w)),
            "convolution_backprop_data": (
                lambda x, w: jaxconv.convolution_backprop_data(x[:, :ci], w[0], output_shape, **a),
                (x, w)),
            "group_convolution": (
                lambda y, w: jaxconv.group_convolution(y, w, **fwd_attrs), (y, w)),
        }
    return build


PROBLEMS = {
    "conv-2d-NXC-XIO-g2-stride-dil": convolution_family(
        2, "NXC", "XIO",
        dict(strides=(2, 1), dilations=(1, 2), pads_begin=(1, 0), pads_end=(0, 2), groups=2), 4, 6),
    "conv-1d-NCX-OIX-depthwise-same": convolution_family(
        1, "NCX", "OIX", dict(strides=2, auto_pad="same_lower", groups=3), 3, 6),
    "conv-3d-NCX-XIO-valid": convolution_family(
        3, "NCX", "XIO", dict(strides=(1, 2, 1), auto_pad="valid"), 2, 3),
    "convT-2d-NXC-XOI-g2-outpad": conv_transpose_family(
        2, "NXC", "XOI", dict(strides=(2, 3), dilations=(1, 2), pads_begin=(1, 0),
                              pads_end=(0, 1), output_padding=(1, 2), groups=2), 4, 6,
        output_shape=(9, 11)),
    "convT-1d-NCX-IOX-depthwise-same": conv_transpose_family(
        1, "NCX", "IOX", dict(strides=2, auto_pad="same_upper", groups=3), 3, 6),
    "convT-3d-NCX-OIX-valid": conv_transpose_family(
        3, "NCX", "OIX", dict(strides=(1, 2, 1), auto_pad="valid", output_padding=(0, 1, 0)),
        2, 3),
}
PROBLEMS.update({
    "ov-2d-G2-same_upper-oshape": openvino_family(
        2, dict(strides=(2, 1), auto_pad="same_upper", output_padding=(1, 0)), 2, 2, 3,
        output_shape=(6, 5)),
    "ov-1d-depthwise-explicit": openvino_family(
        1, dict(strides=2, dilations=2, pads_begin=1, pads_end=0, output_padding=3), 3, 1, 1),
})
IDS = list(PROBLEMS)


@pytest.mark.parametrize("pid", IDS)
def test_jit_equals_eager(pid):
    for name, (f, args) in PROBLEMS[pid]().items():
        h.assert_close(jax.jit(f)(*args), f(*args), jnp.float32)


@pytest.mark.parametrize("pid", IDS)
def test_vmap_over_a_stack_equals_a_loop(pid):
    stack = [PROBLEMS[pid](seed=s) for s in range(3)]
    for name in stack[0]:
        f = stack[0][name][0]
        args = [jnp.stack(a) for a in zip(*(p[name][1] for p in stack))]
        got = jax.vmap(f)(*args)
        want = jnp.stack([f(*p[name][1]) for p in stack])
        h.assert_close(got, want, jnp.float32)


def test_vmap_other_axes_and_unbatched_arguments():
    f, (x, dy) = PROBLEMS[IDS[0]]()["convolution_backprop_filters"]
    dys = jnp.stack([dy, 2 * dy, -dy], axis=2)  # batch on axis 2, x shared
    got = jax.vmap(lambda dy: f(x, dy), in_axes=2, out_axes=-1)(dys)
    want = jnp.stack([f(x, dy), f(x, 2 * dy), f(x, -dy)], axis=-1)
    h.assert_close(got, want, jnp.float32)


# Second derivatives through every kernel (the 3D "dot" path once aborted XLA:GPU): isolated.
# The default run checks the oneDNN convolution and ConvTranspose families (2D, grouped,
# strided and dilated) and the 3D one (12-25 s each: every op of the family to order 2); the
# others, the OpenVINO family included (its data gradient runs the ConvTranspose kernels),
# run with ``-m slow``.
ORDER_2_DEFAULT = ("conv-2d-NXC-XIO-g2-stride-dil", "conv-3d-NCX-XIO-valid",
                   "convT-2d-NXC-XOI-g2-outpad")


@pytest.mark.isolated
@pytest.mark.parametrize("pid", [pytest.param(i, marks=[] if i in ORDER_2_DEFAULT else [pytest.mark.slow])
                                 for i in IDS])
def test_check_grads_order_2(pid):
    with jax.enable_x64(True):
        for name, (f, args) in PROBLEMS[pid](dtype=jnp.float64, batch=1).items():
            h.check_grads(f, args, order=2)


# The OpenVINO family has no gradient ops (test_openvino.py checks
# group_convolution_backprop_data against jax.vjp of group_convolution).
@pytest.mark.parametrize("pid", [i for i in IDS if not i.startswith("ov-")])
def test_gradient_ops_are_the_vjp_of_the_forward(pid):
    """grad through the family's forward op equals its two gradient ops; jvp is linear."""
    ops = PROBLEMS[pid]()
    fwd_name = "convolution" if "convolution" in ops else "conv_transpose"
    f, (x, w) = ops[fwd_name]
    y, vjp = jax.vjp(f, x, w)
    data_name = fwd_name + "_backward_data"
    dy = ops[data_name][1][0]
    dx, dw = vjp(dy)
    h.assert_close(ops[data_name][0](dy, w), dx, jnp.float32)
    for name in ops:
        if name.endswith(("_backprop_filters", "_backward_weights")):
            h.assert_close(ops[name][0](x, dy), dw, jnp.float32)
    _, tangent = jax.jvp(lambda x: f(x, w), (x,), (x,))
    h.assert_close(tangent, y, jnp.float32)


def test_numpy_inputs_and_jax_array_shapes():
    f, (x, dy) = PROBLEMS[IDS[0]]()["convolution_backprop_filters"]
    w_shape = (3, 2, 2, 6)
    kw = dict(strides=(2, 1), dilations=(1, 2), pads_begin=(1, 0), pads_end=(0, 2), groups=2,
              precision=HIGHEST)
    got = jaxconv.convolution_backprop_filters(np.asarray(x), np.asarray(dy),
                                               np.asarray(w_shape), **kw)
    ref = jaxconv.convolution_backprop_filters(x, dy, jnp.asarray(w_shape), **kw)
    np.testing.assert_array_equal(got, ref)
