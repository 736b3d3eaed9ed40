"""The oneDNN convolution family under jit, vmap and grad (to order 2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxconv
from tests import helpers as h

HIGHEST = lax.Precision.HIGHEST

# (name, rank, data_format, filter_format, attrs, IC, OC)
CONFIGS = [
    ("2d-NXC-XIO-g2-stride-dil", 2, "NXC", "XIO",
     dict(strides=(2, 1), dilations=(1, 2), pads_begin=(1, 0), pads_end=(0, 2), groups=2), 4, 6),
    ("1d-NCX-OIX-depthwise-same", 1, "NCX", "OIX",
     dict(strides=2, auto_pad="same_lower", groups=3), 3, 6),
    ("3d-NCX-XIO-valid", 3, "NCX", "XIO", dict(strides=(1, 2, 1), auto_pad="valid"), 2, 3),
]
SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 5)}
KERNEL = {1: (3,), 2: (3, 2), 3: (2, 2, 2)}


def _problem(cfg, dtype=jnp.float32, seed=0, batch=2):
    name, n, df, ff, attrs, ic, oc = cfg
    attrs = dict(attrs, data_format=df, filter_format=ff, precision=HIGHEST)
    rng = np.random.default_rng(seed)
    x = h.random(rng, h.data_shape(df, batch, ic, SPATIAL[n]), dtype)
    w_shape = h.conv_filter_shape(ff, oc, ic // attrs.get("groups", 1), KERNEL[n])
    w = h.random(rng, w_shape, dtype)
    y = jaxconv.convolution(x, w, **attrs)
    dy = h.random(rng, y.shape, dtype)
    return x, w, dy, attrs


def _ops(x, w, dy, attrs):
    """The three ops as functions of their array arguments only."""
    return {
        "convolution": (lambda x, w: jaxconv.convolution(x, w, **attrs), (x, w)),
        "convolution_backward_data": (
            lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **attrs), (dy, w)),
        "convolution_backprop_filters": (
            lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs), (x, dy)),
    }


ids = [c[0] for c in CONFIGS]


@pytest.mark.parametrize("cfg", CONFIGS, ids=ids)
def test_jit_equals_eager(cfg):
    x, w, dy, attrs = _problem(cfg)
    for name, (f, args) in _ops(x, w, dy, attrs).items():
        np.testing.assert_allclose(jax.jit(f)(*args), f(*args), rtol=1e-6, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("cfg", CONFIGS, ids=ids)
def test_vmap_over_a_stack_equals_a_loop(cfg):
    stack = [_problem(cfg, seed=s) for s in range(3)]
    attrs = stack[0][3]
    xs, ws, dys = (jnp.stack([p[i] for p in stack]) for i in range(3))
    for name in _ops(*stack[0]):
        def f(x, w, dy, name=name):
            return _ops(x, w, dy, attrs)[name][0](*_ops(x, w, dy, attrs)[name][1])

        got = jax.vmap(f)(xs, ws, dys)
        want = jnp.stack([f(*p[:3]) for p in stack])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_vmap_other_axes_and_unbatched_arguments():
    x, w, dy, attrs = _problem(CONFIGS[0])
    dys = jnp.stack([dy, 2 * dy, -dy], axis=2)  # batch on axis 2, x shared
    f = lambda dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs)  # noqa: E731
    got = jax.vmap(f, in_axes=2, out_axes=-1)(dys)
    want = jnp.stack([f(dy), f(2 * dy), f(-dy)], axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", CONFIGS, ids=ids)
def test_check_grads_order_2(cfg):
    with jax.enable_x64(True):
        x, w, dy, attrs = _problem(cfg, dtype=jnp.float64, batch=1)
        for name, (f, args) in _ops(x, w, dy, attrs).items():
            check_grads(f, args, order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6, eps=1e-4)


@pytest.mark.parametrize("cfg", CONFIGS, ids=ids)
def test_gradient_ops_are_the_vjp_of_the_forward(cfg):
    """grad through jaxconv.convolution equals the two gradient ops (and jvp is linear)."""
    x, w, dy, attrs = _problem(cfg)
    ops = _ops(x, w, dy, attrs)
    _, vjp = jax.vjp(ops["convolution"][0], x, w)
    dx, dw = vjp(dy)
    np.testing.assert_allclose(ops["convolution_backward_data"][0](dy, w), dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ops["convolution_backprop_filters"][0](x, dy), dw, rtol=1e-5,
                               atol=1e-5)
    # Linear in each argument: jvp in x alone is the forward op on the tangent.
    _, tangent = jax.jvp(lambda x: ops["convolution"][0](x, w), (x,), (x,))
    np.testing.assert_allclose(tangent, ops["convolution"][0](x, w), rtol=1e-6, atol=1e-6)


def test_numpy_inputs_and_jax_array_shapes():
    x, w, dy, attrs = _problem(CONFIGS[0])
    got = jaxconv.convolution_backprop_filters(np.asarray(x), np.asarray(dy),
                                               np.asarray(w.shape), **attrs)
    ref = jaxconv.convolution_backprop_filters(x, dy, jnp.asarray(w.shape), **attrs)
    np.testing.assert_array_equal(got, ref)
