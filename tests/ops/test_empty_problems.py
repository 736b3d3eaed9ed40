"""Empty (zero-size) problems: every family computes what its specification allows.

Zero batch, zero channels, a zero-size input axis and an output axis of size 0 are valid
problems in every family (oneDNN's shape inference and primitives take zero-size tensors);
each op returns lax's value for them (zeros, or an empty array) and its gradients are lax's.
Where a specification has no output, the error names its rule: oneDNN's output size may be 0
but never negative; OpenVINO's Convolution needs the dilated kernel to fit in the padded data.

The reference of each case is lax (``conv_general_dilated`` and its ``jax.vjp``), which
returns a zero-size result for every one of these shapes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import registry
from jaxconv._src.native import library
from tests.support import helpers as h

HIGHEST = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class Case:
    """A 2D convolution ``x (N, H, W, C) * w (KH, KW, C/g, OC) -> y`` with explicit pads."""

    name: str
    x: tuple[int, ...]
    w: tuple[int, ...]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    dilations: tuple[int, int] = (1, 1)
    groups: int = 1

    @property
    def attrs(self) -> dict:
        return dict(strides=self.strides, dilations=self.dilations, groups=self.groups,
                    pads_begin=tuple(p[0] for p in self.pads),
                    pads_end=tuple(p[1] for p in self.pads))


# Each case: a zero-size operand or result the oneDNN rule allows (O >= 0).
CASES = [
    Case("batch-0", (0, 5, 5, 4), (3, 3, 4, 6)),
    Case("in-channels-0", (2, 5, 5, 0), (3, 3, 0, 6)),
    Case("out-channels-0", (2, 5, 5, 4), (3, 3, 4, 0)),
    Case("groups-batch-0", (0, 5, 5, 4), (3, 3, 2, 6), groups=2),
    Case("input-axis-0", (2, 0, 5, 4), (1, 3, 4, 6)),
    Case("input-axis-0-padded", (2, 0, 5, 4), (3, 3, 4, 6), pads=((2, 2), (1, 1))),
    Case("kernel-larger-than-input", (2, 2, 5, 4), (3, 3, 4, 6)),
    Case("dilated-kernel-larger", (2, 3, 5, 4), (2, 3, 4, 6), dilations=(3, 1)),
    Case("kernel-larger-within-a-stride", (2, 2, 5, 4), (4, 3, 4, 6), strides=(2, 1)),
]
IDS = [c.name for c in CASES]
DN = ("NHWC", "HWIO", "NHWC")


def _lax_conv(c: Case, x, w):
    return lax.conv_general_dilated(x, w, c.strides, c.pads, rhs_dilation=c.dilations,
                                    dimension_numbers=DN, feature_group_count=c.groups,
                                    precision=HIGHEST)


def _operands(c: Case, seed: int = 0):
    rng = np.random.default_rng(seed)
    x, w = h.random(rng, c.x), h.random(rng, c.w)
    y_shape = jax.eval_shape(lambda: _lax_conv(c, x, w)).shape
    return x, w, h.random(rng, y_shape)


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_forward_value_and_gradients_are_lax(c):
    x, w, ct = _operands(c)

    def ours(x, w):
        return jaxconv.convolution(x, w, precision=HIGHEST, **c.attrs)

    y, vjp = jax.vjp(ours, x, w)
    y_ref, vjp_ref = jax.vjp(lambda x, w: _lax_conv(c, x, w), x, w)
    h.assert_close(y, y_ref, jnp.float32)
    for got, ref in zip(vjp(ct), vjp_ref(ct)):
        h.assert_close(got, ref, jnp.float32)
    # forward mode and vmap bind the same primitive
    h.assert_close(jax.jvp(ours, (x, w), (x, w))[1], 2 * y_ref, jnp.float32)
    batched = jax.vmap(ours, in_axes=(None, 0))(x, jnp.stack([w, 2 * w]))
    h.assert_close(batched, jnp.stack([y_ref, 2 * y_ref]), jnp.float32)


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_gradient_ops_are_lax_vjp(c):
    x, w, dy = _operands(c, seed=1)
    _, vjp_ref = jax.vjp(lambda x, w: _lax_conv(c, x, w), x, w)
    dx_ref, dw_ref = vjp_ref(dy)
    dx = jaxconv.convolution_backward_data(dy, w, x.shape, precision=HIGHEST, **c.attrs)
    dw = jaxconv.convolution_backprop_filters(x, dy, w.shape, precision=HIGHEST, **c.attrs)
    h.assert_close(dx, dx_ref, jnp.float32)
    h.assert_close(dw, dw_ref, jnp.float32)


DEPTHWISE_EMPTY = Case("depthwise-empty", (2, 2, 5, 4), (3, 3, 1, 4), groups=4)


@pytest.mark.parametrize("kernel", list(Kernel), ids=str)
def test_every_forced_method_takes_an_empty_problem(kernel):
    """No method is handed zero-size operands: the dispatch returns zeros first."""
    c = DEPTHWISE_EMPTY
    x, w, dy = _operands(c, seed=2)
    dx_ref, dw_ref = jax.vjp(lambda x, w: _lax_conv(c, x, w), x, w)[1](dy)
    for method in registry.methods(kernel):
        if method == "onednn" and not library.status().available:
            continue  # not built here: forcing it is a ValueError (tests/native/test_onednn.py)
        if method.startswith("winograd"):
            continue  # ungrouped 3x3 only: tests/lowering/test_winograd.py forces it on empty problems
        if kernel is Kernel.FORWARD:
            got, ref = jaxconv.convolution(x, w, lowering=method, **c.attrs), dy
        elif kernel is Kernel.DATA:
            got = jaxconv.convolution_backward_data(dy, w, x.shape, lowering=method, **c.attrs)
            ref = dx_ref
        else:
            got = jaxconv.convolution_backprop_filters(x, dy, w.shape, lowering=method,
                                                       **c.attrs)
            ref = dw_ref
        h.assert_close(got, ref, jnp.float32)


# ConvTranspose (oneDNN conv_transpose; IOX weights = the conv weight OIX of y -> x): the
# reference is the vjp of lax's convolution from the output space (size O) to the input.
TRANSPOSE_CASES = [
    # (name, x (N, H, W, IC), w IOX (IC, OC/g, KH, KW), attributes, output spatial size)
    ("batch-0", (0, 3, 3, 4), (4, 2, 3, 3), {}, (5, 5)),
    ("in-channels-0", (2, 3, 3, 0), (0, 2, 3, 3), {}, (5, 5)),
    ("output-0", (2, 2, 3, 4), (4, 2, 1, 3), dict(pads_begin=(1, 0), pads_end=(1, 0)), (0, 5)),
    ("input-axis-0", (2, 0, 3, 4), (4, 2, 3, 3), {}, (2, 5)),
    ("input-axis-0-strided", (2, 0, 3, 4), (4, 2, 3, 3), dict(strides=(2, 1)), (1, 5)),
]


@pytest.mark.parametrize("name,xs,ws,attrs,out", TRANSPOSE_CASES,
                         ids=[t[0] for t in TRANSPOSE_CASES])
def test_conv_transpose_is_lax_vjp(name, xs, ws, attrs, out):
    rng = np.random.default_rng(3)
    x, w = h.random(rng, xs), h.random(rng, ws)
    s = attrs.get("strides", (1, 1))
    pads = tuple(zip(attrs.get("pads_begin", (0, 0)), attrs.get("pads_end", (0, 0))))

    def conv(ybar, w):  # y-space -> x-space, with the ConvTranspose's pads
        return lax.conv_general_dilated(ybar, w, s, pads, dimension_numbers=("NHWC", "OIHW", "NHWC"),
                                        precision=HIGHEST)

    y_shape = (xs[0], *out, ws[1])
    y_ref, vjp_ref = jax.vjp(lambda w: jax.vjp(lambda yb: conv(yb, w), jnp.zeros(y_shape))[1](x)[0], w)

    def ours(x, w):
        return jaxconv.conv_transpose(x, w, filter_format="IOX", precision=HIGHEST, **attrs)

    y, vjp = jax.vjp(ours, x, w)
    h.assert_close(y, y_ref, jnp.float32)
    ct = h.random(rng, y_shape)
    h.assert_close(vjp(ct)[1], vjp_ref(ct)[0], jnp.float32)
    dx = jaxconv.conv_transpose_backward_data(ct, w, filter_format="IOX", precision=HIGHEST,
                                              **attrs)
    h.assert_close(dx, conv(ct, w), jnp.float32)
    dw = jaxconv.conv_transpose_backward_weights(x, ct, w.shape, weights_format="IOX",
                                                 precision=HIGHEST, **attrs)
    h.assert_close(dw, vjp_ref(ct)[0], jnp.float32)


def test_openvino_backprop_data_output_0_and_zero_batch():
    """GroupConvolutionBackpropData: OpenVINO's shape inference gives O = 0 (and batch 0)."""
    x = jnp.ones((1, 4, 2, 5))
    w = jnp.ones((2, 2, 3, 1, 3))  # G=2, C_IN=2, C_OUT=3
    y = jaxconv.group_convolution_backprop_data(x, w, pads_begin=(1, 1), pads_end=(1, 1))
    assert y.shape == (1, 6, 0, 5)
    y = jaxconv.group_convolution_backprop_data(jnp.ones((0, 4, 2, 5)), w)
    h.assert_close(y, jnp.zeros((0, 6, 2, 7)), jnp.float32)
    y = jaxconv.group_convolution_backprop_data(x, w, output_shape=(0, 7))
    assert y.shape == (1, 6, 0, 7)


def test_openvino_group_convolution_zero_batch_and_channels():
    y = jaxconv.group_convolution(jnp.ones((0, 4, 5, 5)), jnp.ones((2, 3, 2, 3, 3)))
    h.assert_close(y, jnp.zeros((0, 6, 3, 3)), jnp.float32)
    y = jaxconv.group_convolution(jnp.ones((1, 0, 5, 5)), jnp.ones((2, 3, 0, 3, 3)))
    h.assert_close(y, jnp.zeros((1, 6, 3, 3)), jnp.float32)


# Where the specification has no output, the error names its rule.
RULES = [
    ("onednn-negative-output",
     lambda: jaxconv.convolution(jnp.ones((1, 2, 5, 2)), jnp.ones((5, 3, 2, 3))),
     ["convolution: the dilated kernel [5, 3] is larger than the padded input [2, 5]",
      "oneDNN's output size rule O = floor((I + pb + pe - DK) / S) + 1 gives [-2, 3]"]),
    ("openvino-kernel-must-fit",
     lambda: jaxconv.group_convolution(jnp.ones((1, 2, 2, 5)), jnp.ones((1, 3, 2, 3, 3))),
     ["group_convolution: the dilated kernel [3, 3] is larger than the padded data [2, 5]",
      "OpenVINO's Convolution shape rule"]),
    ("openvino-zero-input-axis",
     lambda: jaxconv.group_convolution(jnp.ones((1, 2, 0, 5)), jnp.ones((1, 3, 2, 1, 3))),
     ["OpenVINO's Convolution shape rule"]),
    ("conv-transpose-negative-output",
     lambda: jaxconv.conv_transpose(jnp.ones((1, 1, 5, 2)), jnp.ones((2, 3, 1, 3)),
                                    filter_format="IOX", pads_begin=1, pads_end=1),
     ["conv_transpose: the pads remove more than the whole output",
      "ConvTranspose output size rule S*(I-1)+DK-pb-pe+output_padding gives [-1, 5]"]),
]


@pytest.mark.parametrize("name,thunk,parts", RULES, ids=[r[0] for r in RULES])
def test_a_shape_the_spec_has_no_output_for_names_its_rule(name, thunk, parts, no_compute):
    h.check_bad_input(thunk, ValueError, parts, r"[a-z_]+")


def test_layers_return_the_originals_empty_outputs():
    """flax's and equinox's own empty cases ('VALID' with a kernel larger than the input, a
    zero-size input axis) give the originals' shapes and values; a transposed layer too."""
    import equinox as eqx
    from flax import nnx

    import jaxconv.equinox
    import jaxconv.flax

    x = jnp.ones((2, 2, 5, 3))
    for kernel, x_ in (((3, 3), x), ((1, 1), jnp.ones((2, 0, 5, 3)))):
        ours = jaxconv.flax.Conv(3, 4, kernel, padding="VALID", rngs=nnx.Rngs(0))
        theirs = nnx.Conv(3, 4, kernel, padding="VALID", rngs=nnx.Rngs(0))
        h.assert_close(ours(x_), theirs(x_), jnp.float32)
    key = jax.random.key(0)
    ours, theirs = jaxconv.equinox.Conv2d(3, 4, 3, key=key), eqx.nn.Conv2d(3, 4, 3, key=key)
    h.assert_close(ours(x[0].transpose(2, 0, 1)), theirs(x[0].transpose(2, 0, 1)), jnp.float32)
    # PyTorch's size (I - 1) S - 2 P + DK: 0 on the first axis (I = 2, P = 2), an empty output
    up = jaxconv.flax.ConvTranspose(3, 4, (3, 3), padding=2, rngs=nnx.Rngs(0))
    assert up(x).shape == (2, 0, 3, 4)
    # a zero-size input axis: the formula's size (-1 + 3 = 2) of zeros, plus the bias
    up = jaxconv.flax.ConvTranspose(3, 4, (3, 3), rngs=nnx.Rngs(0))
    h.assert_close(up(jnp.ones((2, 0, 5, 3))),
                   jnp.broadcast_to(up.bias[...], (2, 2, 7, 4)), jnp.float32)
