"""Every validation error of the OpenVINO family and the IR reader, before computing."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from tests.support import helpers as h

OPS = re.compile(r"^(group_convolution|convolution_backprop_data|group_convolution_backprop_data|"
                 r"from_openvino_ir): ")
X = jnp.ones((1, 16, 5, 5))
W = jnp.ones((2, 8, 3, 3, 3))     # G=2, C_IN=8, C_OUT=3
gcbd = jaxconv.group_convolution_backprop_data
cbd = jaxconv.convolution_backprop_data
gc = jaxconv.group_convolution
ir = jaxconv.from_openvino_ir

LAYER = """<layer type="GroupConvolutionBackpropData"><data strides="2" {extra}/>
<input><port id="0"><dim>1</dim><dim>20</dim><dim>9</dim></port>
<port id="1"><dim>4</dim><dim>5</dim><dim>2</dim><dim>3</dim></port></input>{out}</layer>"""

CASES = [
    ("groups-not-dividing", lambda: gcbd(X, jnp.ones((3, 8, 3, 3, 3))), ValueError,
     ["group_convolution_backprop_data: data channels (16) must equal G x C_IN = 3 x 8 = 24"]),
    ("groups-zero-size", lambda: gcbd(X, jnp.ones((0, 8, 3, 3, 3))), ValueError,
     ["data channels (16) must equal G x C_IN = 0 x 8 = 0"]),
    ("filters-rank", lambda: gcbd(X, jnp.ones((16, 3, 3, 3))), ValueError,
     ["filters must have rank 5 ([G, C_IN, C_OUT, *K]) for rank-4 data, got rank 4"]),
    ("data-rank", lambda: gcbd(jnp.ones((1, 16)), W), ValueError, ["data must have rank 3, 4 or 5"]),
    ("output-shape-length", lambda: gcbd(X, W, (9, 9, 9)), ValueError,
     ["output_shape must hold the 2 spatial output sizes, got 3"]),
    ("output-shape-float", lambda: gcbd(X, W, np.array([9.0, 9.0])), TypeError,
     ["output_shape must be a 1-D integer array", "float"]),
    ("output-shape-2d", lambda: gcbd(X, W, np.array([[9], [9]])), TypeError,
     ["output_shape must be a 1-D integer array", "(2, 1)"]),
    ("output-shape-negative", lambda: gcbd(X, W, (-1, 9)), ValueError,
     ["output_shape must be non-negative, got [-1, 9]"]),
    ("output-shape-traced", lambda: jax.jit(lambda s: gcbd(X, W, s))(jnp.array([9, 9])),
     TypeError, ["output_shape must be a static value"]),
    ("output-padding-negative", lambda: gcbd(X, W, output_padding=-1), ValueError,
     ["output_padding must be >= 0, got [-1, -1]"]),
    ("output-padding-length", lambda: gcbd(X, W, output_padding=(0, 0, 0)), ValueError,
     ["output_padding must have 2 value(s)"]),
    ("strides-length", lambda: gcbd(X, W, strides=(1, 1, 1)), ValueError,
     ["strides must have 2 value(s)"]),
    ("dilations-length", lambda: gcbd(X, W, dilations=(1,)), ValueError,
     ["dilations must have 2 value(s)"]),
    ("pads-length", lambda: gcbd(X, W, pads_begin=(0, 0, 0)), ValueError,
     ["pads_begin must have 2 value(s)"]),
    ("auto-pad", lambda: gcbd(X, W, auto_pad="notvalid"), ValueError,
     ["auto_pad must be one of 'explicit', 'same_upper', 'same_lower', 'valid'",
      "'none' and 'notset' mean 'explicit'", "got 'notvalid'"]),
    ("auto-pad-typo", lambda: gcbd(X, W, auto_pad="explicitt"), ValueError,
     ["got 'explicitt'; did you mean 'explicit'?"]),
    ("runtime-flag", lambda: gcbd(X, W, openvino_runtime_padding=1), TypeError,
     ["openvino_runtime_padding must be a bool, got 1"]),
    ("dtype-mismatch", lambda: gcbd(X.astype(jnp.float16), W), TypeError,
     ["data, filters must have the same dtype", "float16", "float32"]),
    ("dtype-bool", lambda: gcbd(X > 0, W > 0), TypeError, ["data must have a numeric dtype, got bool"]),
    ("complex", lambda: gcbd(X.astype(jnp.complex64), W.astype(jnp.complex64)), TypeError,
     ["data must be real, got complex64"]),
    ("not-array", lambda: gcbd(X, W.tolist()), TypeError, ["filters must be a jax.Array"]),
    ("cbd-channels", lambda: cbd(X, jnp.ones((8, 3, 3, 3))), ValueError,
     ["convolution_backprop_data: filters [8, 3, 3, 3] in IOX format holds I=8",
      "expected I=16 (data channels, the full count)"]),
    ("cbd-rank", lambda: cbd(X, W), ValueError,
     ["convolution_backprop_data: filters must have rank 4 ([C_IN, C_OUT, *K])"]),
    ("gc-channels", lambda: gc(X, jnp.ones((2, 3, 4, 3, 3))), ValueError,
     ["group_convolution: data channels (16) must equal G x C_IN = 2 x 4 = 8",
      "[G, C_OUT, C_IN, *K]"]),
    ("gc-kernel-too-big", lambda: gc(X, jnp.ones((2, 3, 8, 7, 7))), ValueError,
     ["group_convolution: the dilated kernel [7, 7] is larger than the padded data [5, 5]",
      "OpenVINO's Convolution shape rule"]),
    ("gc-int-preferred", lambda: gc(X.astype(jnp.int8), W.astype(jnp.int8).swapaxes(1, 2),
                                    preferred_element_type="int4x"), TypeError,
     ["preferred_element_type must be a dtype or None"]),
    # the IR reader
    ("ir-not-xml", lambda: ir("<layer"), ValueError, ["from_openvino_ir: layer is not well-formed"]),
    ("ir-kind", lambda: ir(42), TypeError, ["from_openvino_ir: layer must be XML text"]),
    ("ir-type", lambda: ir('<layer type="Convolution"/>'), ValueError,
     ["layer type must be one of", "'Convolution'"]),
    ("ir-tag", lambda: ir("<net/>"), ValueError, ["expected a <layer> element, got <net>"]),
    ("ir-attr", lambda: ir(LAYER.format(extra='group="2"', out="")), ValueError,
     ["<data> attribute 'group' is not one of"]),
    ("ir-attr-int", lambda: ir(LAYER.format(extra='pads_begin="a"', out="")), ValueError,
     ["<data> attribute pads_begin must be comma-separated ints, got 'a'"]),
    ("ir-dims", lambda: ir(LAYER.replace("<dim>9</dim>", "<dim>?</dim>").format(extra="", out="")),
     ValueError, ["port 0 must list static integer <dim>s"]),
    ("ir-output-port-values", lambda: ir(LAYER.replace(
        "</input>", '<port id="2"><dim>1</dim></port></input>').format(extra="", out="")),
     ValueError, ["pass its values as output_shape="]),
    ("lowering-unknown", lambda: gcbd(X, W, lowering="conv"), ValueError,
     ["group_convolution_backprop_data: lowering must be one of ['auto', 'direct', 'grid', 'phases', "
      "'dot', 'vjp', 'onednn', 'onednn_f32', 'winograd', 'winograd_2x2', 'winograd_3x3', 'winograd_4x4', "
      "'per_group', 'block_diagonal'], got 'conv'"]),
]


@pytest.mark.parametrize("thunk,exc,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(no_compute, thunk, exc, parts):
    h.check_bad_input(thunk, exc, parts, OPS)



def test_ir_declared_output_dims_must_match():
    """Checked by abstract shape inference (jax.eval_shape), not by computing."""
    out = '<output><port id="3"><dim>1</dim><dim>8</dim><dim>20</dim></port></output>'
    with pytest.raises(ValueError) as info:
        ir(LAYER.format(extra="", out=out))
    assert str(info.value).startswith(
        "from_openvino_ir: the layer declares output dims [1, 8, 20], but "
        "GroupConvolutionBackpropData with these attributes gives [1, 8, 19]")
