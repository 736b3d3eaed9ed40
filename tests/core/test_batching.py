"""Every op under vmap stays the jaxconv_conv primitive, under every transform stacked on it.

The batching rule (jaxconv/_src/batching.py) folds a batched operand into the problem and binds
the primitive again, so that a derivative taken outside a ``vmap`` (equinox's idiom: unbatched
layers, ``jax.vmap(model)`` inside the gradient) still runs jaxconv's kernels. For every public
array op and each transform below: the jaxpr holds ``jaxconv_conv`` equations and no lax
convolution, and the value equals the same transform of an independent reference built from
``lax.conv_general_dilated`` and ``jax.vjp`` alone (as ``jaxconv check`` does).

The problem: NCX/OIX, 4 -> 6 channels in 2 groups, 5x4, kernel 3x2, strides (2, 1), dilations
(1, 2), pads (1, 0) / (1, 1): a stride and a dilation, on an exact fit (no unread remainder), so
that the lax reference's own higher derivatives stay clear of jaxlib 0.10.2's abort.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv import tbe
from jaxconv._src import registry
from tests.support import helpers as h

HIGHEST = lax.Precision.HIGHEST
N, CX, CY, G = 1, 4, 6, 2
SPATIAL, KERNEL = (5, 4), (3, 2)
STRIDES, DILATIONS, PB, PE = (2, 1), (1, 2), (1, 0), (1, 1)
DN = ("NCHW", "OIHW", "NCHW")
B = 3  # the vmapped size

rng = np.random.default_rng(0)
X = h.random(rng, (N, CX, *SPATIAL))
W = h.random(rng, (CY, CX // G, *KERNEL))  # OIX
W1 = h.random(rng, (CY, CX, *KERNEL))  # OpenVINO ConvolutionBackpropData: [C_IN, C_OUT, *K], g = 1


def conv(x, w, groups=G):
    return lax.conv_general_dilated(x, w, STRIDES, list(zip(PB, PE)), rhs_dilation=DILATIONS,
                                    dimension_numbers=DN, feature_group_count=groups,
                                    precision=HIGHEST)


def ct(dy, w, groups=G):
    """The transposed convolution: jax.vjp of the convolution w.r.t. its input."""
    x_shape = (dy.shape[0], w.shape[1] * groups, *SPATIAL)
    return jax.vjp(lambda x: conv(x, w, groups), jnp.zeros(x_shape, dy.dtype))[1](dy)[0]


def wgrad(x, dy):
    return jax.vjp(lambda w: conv(x, w), jnp.zeros(W.shape, x.dtype))[1](dy)[0]


DY = h.random(rng, conv(X, W).shape)
A = dict(strides=STRIDES, dilations=DILATIONS, pads_begin=PB, pads_end=PE, data_format="NCX",
         groups=G, precision=HIGHEST)
OV = dict(strides=STRIDES, dilations=DILATIONS, pads_begin=PB, pads_end=PE, precision=HIGHEST)
OVF = (G, CY // G, CX // G, *KERNEL)  # OpenVINO's grouped filters: the OIX array reshaped
PARA = {"strides": list(STRIDES), "padding": [PB[0], PE[0], PB[1], PE[1]],
        "dilations": [1, 1, *DILATIONS], "groups": G}

# op -> (jaxconv(a, b), lax reference(a, b), a, b)
OPS: dict[str, tuple[Callable, Callable, jax.Array, jax.Array]] = {
    "convolution": (lambda x, w: jaxconv.convolution(x, w, filter_format="OIX", **A), conv, X, W),
    "convolution_backward_data": (
        lambda dy, w: jaxconv.convolution_backward_data(dy, w, SPATIAL, filter_format="OIX", **A),
        ct, DY, W),
    "convolution_backprop_filters": (
        lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, W.shape, filter_format="OIX",
                                                           **A), wgrad, X, DY),
    "convolution_backward_weights": (
        lambda x, dy: jaxconv.convolution_backward_weights(x, dy, W.shape, weights_format="OIX",
                                                           **A), wgrad, X, DY),
    # ConvTranspose IOX weights are the convolution's OIX array
    "conv_transpose": (lambda dy, w: jaxconv.conv_transpose(dy, w, filter_format="IOX", **A),
                       ct, DY, W),
    "conv_transpose_backward_data": (
        lambda x, w: jaxconv.conv_transpose_backward_data(x, w, filter_format="IOX", **A),
        conv, X, W),
    "conv_transpose_backward_weights": (
        lambda dy, x: jaxconv.conv_transpose_backward_weights(dy, x, W.shape,
                                                              weights_format="IOX", **A),
        lambda dy, x: wgrad(x, dy), DY, X),
    "conv_transpose_backprop_filters": (
        lambda dy, x: jaxconv.conv_transpose_backprop_filters(dy, x, W.shape, filter_format="IOX",
                                                              **A),
        lambda dy, x: wgrad(x, dy), DY, X),
    "group_convolution": (lambda x, f: jaxconv.group_convolution(x, f, **OV),
                          lambda x, f: conv(x, f.reshape(W.shape)), X, W.reshape(OVF)),
    "convolution_backprop_data": (lambda dy, f: jaxconv.convolution_backprop_data(dy, f, **OV),
                                  lambda dy, f: ct(dy, f, 1), DY, W1),
    "group_convolution_backprop_data": (
        lambda dy, f: jaxconv.group_convolution_backprop_data(dy, f, **OV),
        lambda dy, f: ct(dy, f.reshape(W.shape)), DY, W.reshape(OVF)),
    "conv2d_backprop_filter": (  # 5HD in; the FRACTAL_Z result unpacked to OIHW
        lambda x5, dy5: tbe.from_fractal_z(jaxconv.conv2d_backprop_filter(
            x5, dy5, W.shape, PARA), W.shape, G),
        lambda x5, dy5: wgrad(tbe.from_5hd(x5, CX), tbe.from_5hd(dy5, CY)),
        tbe.to_5hd(X), tbe.to_5hd(DY)),
    "conv_general_dilated": (
        lambda x, w: jaxconv.conv_general_dilated(
            x, w, STRIDES, list(zip(PB, PE)), rhs_dilation=DILATIONS, dimension_numbers=DN,
            feature_group_count=G, precision=HIGHEST), conv, X, W),
}


def test_every_array_op_is_in_the_table():
    assert sorted(OPS) == sorted(registry.ARRAY_OPS)


def _stack(a, n=B, seed=1):
    r = np.random.default_rng(seed)
    return jnp.stack([a * (1 + 0.1 * k) + 0.1 * h.random(r, a.shape) for k in range(n)])


def _loss(v):
    return jnp.sum(jnp.tanh(v))


# transform name -> fn(op, a, b): the value of that transform of ``op`` at (a, b)
TRANSFORMS: dict[str, Callable] = {
    # vmap over the first operand, the gradient outside it (w.r.t. both)
    "grad_vmap_a": lambda op, a, b: jax.grad(
        lambda A, b: _loss(jax.vmap(op, (0, None))(A, b)), (0, 1))(_stack(a), b),
    # vmap over the second operand
    "grad_vmap_b": lambda op, a, b: jax.grad(
        lambda a, Bb: _loss(jax.vmap(op, (None, 0))(a, Bb)), (0, 1))(a, _stack(b)),
    # per-example gradients: vmap of grad over both operands
    "vmap_grad": lambda op, a, b: jax.vmap(jax.grad(lambda a, b: _loss(op(a, b)), (0, 1)))(
        _stack(a), _stack(b)),
    "jacfwd_vmap": lambda op, a, b: jax.jacfwd(lambda b: jax.vmap(op, (0, None))(_stack(a), b))(b),
    "jacrev": lambda op, a, b: jax.jacrev(op, (0, 1))(a, b),
    "hessian": lambda op, a, b: jax.hessian(lambda b: _loss(op(a, b)))(b),
    "grad_vmap_vmap": lambda op, a, b: jax.grad(
        lambda AA, b: _loss(jax.vmap(jax.vmap(op, (0, None)), (0, None))(AA, b)), (0, 1))(
            jnp.stack([_stack(a, seed=2), _stack(a, seed=3)]), b),
}


def _lax_free(fn, *args):
    """The jaxconv_conv equations of fn's jaxpr; fails on any lax convolution."""
    eqns = h.equations(fn, *args)
    convs = [e for e in eqns if e.primitive.name == "conv_general_dilated"]
    assert not convs, f"{len(convs)} lax convolution(s) outside jaxconv's kernels"
    return [e for e in eqns if e.primitive.name == "jaxconv_conv"]


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_transforms_of_every_op_hold_only_jaxconv_kernels_and_equal_lax(name, transform):
    op, ref, a, b = OPS[name]
    t = TRANSFORMS[transform]
    assert _lax_free(lambda a, b: t(op, a, b), a, b)
    got, want = jax.jit(lambda a, b: t(op, a, b))(a, b), t(ref, a, b)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == r.shape
        h.assert_close(g, r, jnp.float32)


@pytest.mark.parametrize("name", ["convolution", "convolution_backward_data",
                                  "convolution_backprop_filters"])
def test_check_grads_order_2_under_vmap(name):
    """Each kernel, vmapped over both operands, differentiated twice in both modes."""
    op, _, a, b = OPS[name]
    with jax.enable_x64(True):
        a64, b64 = (_stack(v).astype(jnp.float64) for v in (a, b))
        h.check_grads(jax.vmap(op), (a64, b64), order=2)


@pytest.mark.parametrize("method", ["conv", "shifted", "dot", "per_group"])
@pytest.mark.parametrize("batched", [(0, None), (None, 0), (0, 0)])
def test_forced_lowering_under_vmap_keeps_its_reach(method, batched):
    """A forced method stays applicable to the folded problem: a depthwise weight gradient with
    x alone batched would fold into B channels per group, out of "shifted"'s reach; it folds both
    operands into the groups instead (batching.py)."""
    x = h.random(rng, (2, 7, 6, 4))  # NXC, depthwise with channel multiplier 2
    dy = h.random(rng, (2, 4, 6, 8))
    kw = dict(strides=(2, 1), pads_begin=(1, 1), pads_end=(1, 1), groups=4, precision=HIGHEST)
    if method == "per_group":
        kw["groups"] = 2
    w_shape = (3, 3, 4 // kw["groups"], 8)

    def op(x, dy):
        return jaxconv.convolution_backprop_filters(x, dy, w_shape, **kw, lowering=method)

    xs, dys = (_stack(x) if batched[0] == 0 else x), (_stack(dy) if batched[1] == 0 else dy)
    got = jax.vmap(op, batched)(xs, dys)
    loop = jnp.stack([op(xs[i] if batched[0] == 0 else xs, dys[i] if batched[1] == 0 else dys)
                      for i in range(B)])
    h.assert_close(got, loop, jnp.float32)
    kernels = _lax_free(jax.vmap(op, batched), xs, dys)
    assert {e.params["method"] for e in kernels} == {method}


def test_vmap_of_size_zero_and_a_batched_filter_of_the_wrong_shape():
    op, _, x, w = OPS["convolution"]
    out = jax.vmap(op, (0, None))(jnp.zeros((0, *x.shape)), w)
    assert out.shape == (0, *conv(x, w).shape)
    wide = jax.vmap(lambda x, w: jaxconv.convolution(x, w, preferred_element_type=jnp.float32),
                    (0, None))(jnp.zeros((0, 1, 5, 4, 2), jnp.bfloat16), jnp.ones((3, 2, 2, 6), jnp.bfloat16))
    assert wide.shape == (0, 1, 3, 3, 6) and wide.dtype == jnp.float32
    with pytest.raises(ValueError, match=r"^convolution: filter"):  # the op's own check, per slice
        jax.vmap(op, (None, 0))(x, jnp.zeros((B, CY, CX, *KERNEL)))


def test_equinox_idiom_vmap_inside_filter_grad():
    """equinox's training idiom: unbatched layers, jax.vmap(model) inside eqx.filter_grad. The
    gradient holds jaxconv's kernels only, and equals the same model built from eqx.nn.Conv2d."""
    eqx = pytest.importorskip("equinox")
    from jaxconv import equinox as jeqx

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    ours = [jeqx.Conv(2, 12, 12, 3, padding=1, groups=12, key=keys[0]),
            jeqx.Conv(2, 12, 12, 3, stride=2, padding=1, groups=12, key=keys[1])]
    theirs = [eqx.nn.Conv2d(12, 12, 3, padding=1, groups=12, key=keys[0]),
              eqx.nn.Conv2d(12, 12, 3, stride=2, padding=1, groups=12, key=keys[1])]
    theirs = [eqx.tree_at(lambda m: (m.weight, m.bias), t, (o.weight, o.bias))
              for t, o in zip(theirs, ours)]
    x = h.random(rng, (4, 12, 9, 9))  # a batch of unbatched (C, H, W) inputs

    def loss(model, x):
        def one(xi):
            for layer in model:
                xi = jnp.tanh(layer(xi))
            return xi
        return jnp.sum(jax.vmap(one)(x) ** 2)

    kernels = _lax_free(lambda x: eqx.filter_grad(loss)(ours, x), x)
    assert {str(e.params["kernel"]) for e in kernels} == {"forward", "data", "weight"}
    got = eqx.filter_grad(loss)(ours, x)
    with jax.default_matmul_precision("highest"):
        want = eqx.filter_grad(loss)(theirs, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        h.assert_close(g, w, jnp.float32)
