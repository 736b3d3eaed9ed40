"""jax.grad, jax.jvp and jax.vmap of every op go through jaxconv's kernels (the jaxconv_conv primitive).

The values are checked elsewhere against PyTorch (test_<family>.py) and with check_grads to order
2 (test_transforms.py, test_lowerings.py); here: that the derivatives JAX builds are jaxconv's
kernels and never lax's transposes, in every mode, and the dtype rules of gradients.
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


def _kernels(fn, *args) -> set[str]:
    eqns = h.equations(fn, *args)
    assert not [e for e in eqns if e.primitive.name == "conv_general_dilated"], \
        "a lax convolution outside jaxconv's kernels"
    return {e.params["kernel"] for e in eqns if e.primitive.name == "jaxconv_conv"}


rng = np.random.default_rng(0)
X = h.random(rng, (2, 9, 8, 4))      # NXC
W = h.random(rng, (3, 3, 2, 6))      # XIO, groups 2
A = dict(strides=2, dilations=(1, 2), pads_begin=1, pads_end=0, groups=2, precision=HIGHEST)
XO = h.random(rng, (1, 4, 6, 6))      # OpenVINO: NCX
WO = h.random(rng, (2, 2, 2, 3, 3))   # [G, C_IN, C_OUT, *K] / [G, C_OUT, C_IN, *K]

FORWARD_OPS = {
    "convolution": (lambda x, w: jaxconv.convolution(x, w, **A), (X, W)),
    "conv_transpose": (lambda x, w: jaxconv.conv_transpose(x, w, strides=2, groups=2,
                                                           filter_format="XIO",
                                                           precision=HIGHEST),
                       (h.random(rng, (2, 4, 4, 6)), h.random(rng, (3, 3, 6, 2)))),
    "group_convolution": (lambda x, w: jaxconv.group_convolution(x, w, strides=2), (XO, WO)),
    "convolution_backprop_data": (lambda x, w: jaxconv.convolution_backprop_data(x, w, strides=2),
                                  (XO, h.random(rng, (4, 3, 3, 3)))),
    "group_convolution_backprop_data": (
        lambda x, w: jaxconv.group_convolution_backprop_data(x, w, strides=2), (XO, WO)),
}


@pytest.mark.parametrize("name", sorted(FORWARD_OPS))
def test_grad_of_each_forward_op_is_made_of_jaxconv_kernels(name):
    f, args = FORWARD_OPS[name]

    def loss(*a):
        return jnp.sum(f(*a) ** 2)

    first = _kernels(jax.grad(loss, (0, 1)), *args)
    assert len(first) == 3  # the value's kernel and the two transposes
    second = _kernels(jax.grad(lambda *a: jnp.sum(jax.grad(loss)(*a) ** 2), 1), *args)
    assert second == {"forward", "data", "weight"}


def test_jvp_is_the_kernel_applied_to_each_tangent():
    tx, tw = h.random(rng, X.shape), h.random(rng, W.shape)
    y, ty = jax.jvp(lambda x, w: jaxconv.convolution(x, w, **A), (X, W), (tx, tw))
    h.assert_close(y, jaxconv.convolution(X, W, **A), jnp.float32)
    h.assert_close(ty, jaxconv.convolution(tx, W, **A) + jaxconv.convolution(X, tw, **A),
                   jnp.float32)
    assert _kernels(lambda x, w, tx, tw: jax.jvp(
        lambda x, w: jaxconv.convolution(x, w, **A), (x, w), (tx, tw)), X, W, tx, tw) == {"forward"}


def test_gradients_equal_lax_and_hessian_by_forward_over_reverse():
    dn = ("NHWC", "HWIO", "NHWC")

    def lax_conv(x, w):
        return lax.conv_general_dilated(x, w, (2, 2), [(1, 0), (1, 0)], rhs_dilation=(1, 2),
                                        dimension_numbers=dn, feature_group_count=2,
                                        precision=HIGHEST)

    def loss(conv):
        return lambda x, w: jnp.sum(jnp.tanh(conv(x, w)))

    ours = jax.grad(loss(lambda x, w: jaxconv.convolution(x, w, **A)), (0, 1))(X, W)
    ref = jax.grad(loss(lax_conv), (0, 1))(X, W)
    for a, b in zip(ours, ref):
        h.assert_close(a, b, jnp.float32)
    w_small = W[:, :, :, :2].reshape(3, 3, 2, 2)
    a1 = dict(A, groups=2)
    hess = jax.jacfwd(jax.grad(lambda w: jnp.sum(jnp.tanh(jaxconv.convolution(X, w, **a1)))))(
        w_small)
    hess_ref = jax.jacfwd(jax.grad(lambda w: jnp.sum(jnp.tanh(lax_conv(X, w)))))(w_small)
    h.assert_close(hess, hess_ref, jnp.float32)


def test_per_example_gradients_with_vmap_of_grad():
    def loss(w, x):
        return jnp.sum(jaxconv.convolution(x[None], w, **A) ** 2)

    per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0))(W, X)
    loop = jnp.stack([jax.grad(loss)(W, x) for x in X])
    h.assert_close(per_example, loop, jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_gradients_come_back_in_the_input_dtype(dtype):
    """preferred_element_type widens the result, not the gradients (jax's rule for lax convs)."""
    x, w = X.astype(dtype), W.astype(dtype)

    def loss(x, w):
        return jnp.sum(jaxconv.convolution(x, w, **A, preferred_element_type=jnp.float32))

    gx, gw = jax.grad(loss, (0, 1))(x, w)
    assert gx.dtype == dtype and gw.dtype == dtype
    rx, rw = jax.grad(loss, (0, 1))(X, W)
    h.assert_close(gx, rx, dtype)
    h.assert_close(gw, rw, dtype)
