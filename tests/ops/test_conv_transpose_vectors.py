"""Ground truth for the ConvTranspose family.

* PyTorch-computed exact integer cases for ConvTransposeBackwardWeights /
  ConvTransposeBackpropFilters-1 in all four weight formats
  (``computed_convtranspose_backward_weights.json``), and the identity with the
  convolution weight gradient (SEMANTICS.md section 1);
* oneDNN's ConvTranspose execution tests and shape-inference tests
  (``onednn_graph_vectors.json``) through the public ops, without computing.
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
COMPUTED = h.load_vectors("computed_convtranspose_backward_weights.json")
ONEDNN = h.load_vectors("onednn_graph_vectors.json")
FORMAT_KEYS = {"IOX": "IOX", "XOI": "XOI", "OIX": "OIX_legacy", "XIO": "XIO_legacy"}


def _values(entry) -> np.ndarray:
    return np.asarray(entry["values"], np.float32).reshape(entry["shape"])


def _attrs(case):
    a = case["attrs"]
    return dict(strides=a["strides"], pads_begin=a["pads_begin"], pads_end=a["pads_end"],
                dilations=a["dilations"], output_padding=a["output_padding"],
                auto_pad=a["auto_pad"], groups=a["groups"], data_format=a["data_format"],
                precision=HIGHEST)


@pytest.mark.parametrize("fmt", list(FORMAT_KEYS))
@pytest.mark.parametrize("case", COMPUTED["cases"], ids=lambda c: c["name"])
def test_computed_weight_gradients_every_format(case, fmt):
    x = _values(case["src(input_forward)"])
    dy = _values(case["diff_dst(output_delta)"])
    want = _values(case["expected_diff_weights"][FORMAT_KEYS[fmt]])
    got = jaxconv.conv_transpose_backward_weights(x, dy, want.shape, weights_format=fmt,
                                                  **_attrs(case))
    np.testing.assert_array_equal(got, want)
    got = jaxconv.conv_transpose_backprop_filters(x, dy, want.shape, filter_format=fmt,
                                                  **_attrs(case))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", [c for c in COMPUTED["cases"] if c["attrs"]["auto_pad"] == "None"],
                         ids=lambda c: c["name"])
def test_identity_with_convolution_weight_gradient(case):
    """ConvTransposeBackwardWeights(src=x, diff_dst=dy) in IOX
    == ConvolutionBackpropFilters(input_forward=dy, output_delta=x) in OIX."""
    a = _attrs(case)
    a.pop("output_padding")
    x = _values(case["src(input_forward)"])
    dy = _values(case["diff_dst(output_delta)"])
    want = _values(case["expected_diff_weights"]["IOX"])
    got = jaxconv.convolution_backprop_filters(dy, x, want.shape, filter_format="OIX", **a)
    np.testing.assert_array_equal(got, want)


def _execution(name):
    return next(c for c in ONEDNN["execution_vectors"] if c["name"] == name)


@pytest.mark.parametrize("name", ["ConvTranspose_groups2_IOX_NCX", "ConvTranspose_XOI_NXC_relu",
                                  "ConvTranspose_XOI_NXC_relu_bias"])
def test_onednn_conv_transpose_execution(name):
    case = _execution(name)
    a = case["attrs"]
    y = jaxconv.conv_transpose(
        _values(case["inputs"]["src"]), _values(case["inputs"]["weights"]),
        strides=a["strides"], pads_begin=a["pads_begin"], pads_end=a["pads_end"],
        dilations=a["dilations"], groups=a["groups"], data_format=a["data_format"],
        filter_format=a["weights_format"], precision=HIGHEST)
    if "bias" in case["inputs"]:
        y = y + _values(case["inputs"]["bias"]).reshape(1, 1, 1, -1)  # NXC: channels last
    if case.get("post_op") == "ReLU":
        y = jax.nn.relu(y)
    np.testing.assert_array_equal(y, _values(case["expected"]))


def _shape_cases(op):
    out = []
    for c in ONEDNN["shape_inference_cases"]:
        if c["op"] != op:
            continue
        if "results" in c:
            out += [(c, mode, r) for mode, r in c["results"].items()]
        else:
            out.append((c, c.get("auto_pad", "none"), None))
    return out


@pytest.mark.parametrize("cmr", _shape_cases("ConvTranspose"),
                         ids=lambda v: f"{v[0]['test']}-{v[1]}")
def test_onednn_conv_transpose_shape_inference(cmr):
    case, mode, result = cmr
    dst = result["dst"] if result else case["dst"]
    for groups in ((1, 2, 4) if "groups" in case["test"] else (1,)):
        w = h.onednn_weights_shape(case, groups)
        out = jax.eval_shape(
            lambda x, w: jaxconv.conv_transpose(
                x, w, strides=case["strides"], pads_begin=case["pads_begin"] or None,
                pads_end=case["pads_end"] or None, dilations=case["dilations"], auto_pad=mode,
                output_padding=case.get("output_padding"), groups=groups,
                data_format=case["data_format"], filter_format=case["weights_format"]),
            jax.ShapeDtypeStruct(case["src"], jnp.float32), jax.ShapeDtypeStruct(w, jnp.float32))
        assert list(out.shape) == dst


@pytest.mark.parametrize("cmr", _shape_cases("ConvTransposeBackwardData"),
                         ids=lambda v: f"{v[0]['test']}-{v[1]}")
def test_onednn_conv_transpose_backward_data_shape(cmr):
    case, mode, result = cmr
    want = result["diff_src"] if result else case["diff_src"]
    out = jax.eval_shape(
        lambda dy, w: jaxconv.conv_transpose_backward_data(
            dy, w, strides=case["strides"], pads_begin=case["pads_begin"],
            pads_end=case["pads_end"], dilations=case["dilations"], auto_pad=mode,
            groups=case.get("groups", 1), data_format=case["data_format"],
            filter_format=case["weights_format"]),
        jax.ShapeDtypeStruct(case["diff_dst"], jnp.float32),
        jax.ShapeDtypeStruct(case["weights"], jnp.float32))
    assert list(out.shape) == want


@pytest.mark.parametrize("case", [c for c in ONEDNN["shape_inference_cases"]
                                  if c["op"] == "ConvTransposeBackwardWeights"],
                         ids=lambda c: c["test"])
def test_onednn_conv_transpose_backward_weights_shape(case):
    """oneDNN copies weights_shape through; jaxconv checks it against the data.

    One upstream case labels the shape (4, 4, 1, 1) OIX although only its XIO
    reading (K 4x4, I=1, O=1) fits src/diff_dst: jaxconv computes the XIO one and
    raises a clear error for the OIX one.
    """
    shape = case["weights_shape_attr"]
    src = jax.ShapeDtypeStruct(case["src"], jnp.float32)
    dy = jax.ShapeDtypeStruct(case["diff_dst"], jnp.float32)

    def run(fmt):
        return jax.eval_shape(lambda x, d: jaxconv.conv_transpose_backward_weights(
            x, d, shape, strides=case["strides"], pads_begin=case.get("pads_begin"),
            pads_end=case.get("pads_end"), dilations=case["dilations"],
            auto_pad=case["auto_pad"], groups=case.get("groups", 1),
            data_format=case["data_format"], weights_format=fmt), src, dy)

    fits = "OIX" if shape[1] == case["src"][1] else "XIO"
    assert list(run(fits).shape) == case["diff_weights"]
    if fits != case["weights_format"]:
        with pytest.raises(ValueError, match="conv_transpose_backward_weights: weights_shape"):
            run(case["weights_format"])


def test_onednn_benchdnn_deconv_bwd_w():
    got, want = h.benchdnn_weights_shape(ONEDNN, "ConvTransposeBackwardWeights",
                                         jaxconv.conv_transpose_backward_weights)
    assert got == want
