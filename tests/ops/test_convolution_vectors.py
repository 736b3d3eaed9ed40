"""Upstream and computed ground-truth vectors for the oneDNN convolution family.

* TensorFlow and MindSpore backprop-filter tests (``external_conv_backprop_filter.json``);
* PyTorch-computed, exact integer cases covering groups, asymmetric pads,
  strides, dilations, same_upper/same_lower/valid, 1D and 3D
  (``computed_conv_backprop_filters.json``);
* oneDNN's ConvolutionBackwardData execution test and benchdnn graph case
  (``onednn_graph_vectors.json``).
"""

from __future__ import annotations

import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import geometry
from tests.support import helpers as h

HIGHEST = lax.Precision.HIGHEST
EXTERNAL = h.load_vectors("external_conv_backprop_filter.json")
COMPUTED = h.load_vectors("computed_conv_backprop_filters.json")
ONEDNN = h.load_vectors("onednn_graph_vectors.json")


def _values(entry) -> np.ndarray:
    key = "values_list" if "values_list" in entry else "values"
    return np.asarray(entry[key], np.float32).reshape(entry["shape"])


@pytest.mark.parametrize("case", EXTERNAL["tensorflow"], ids=lambda c: c["name"])
def test_tensorflow_backprop_filter(case):
    m = case["maps_to"]
    got = jaxconv.convolution_backprop_filters(
        _values(case["input_forward"]), _values(case["output_delta"]), m["filter_shape"],
        strides=m["strides"], dilations=m["dilations"], auto_pad=m["auto_pad"],
        groups=m["groups"], data_format=m["data_format"], filter_format=m["filter_format"],
        precision=HIGHEST)
    np.testing.assert_array_equal(got, np.asarray(case["expected_filter_delta"]["values"],
                                                  np.float32).reshape(m["filter_shape"]))


def test_mindspore_backprop_filter():
    (case,) = EXTERNAL["mindspore"]
    m = case["maps_to"]
    pads = m["pads"]
    got = jaxconv.convolution_backward_weights(
        _values(case["input_forward"]), _values(case["output_delta"]), m["filter_shape"],
        strides=m["strides"], pads_begin=pads[0::2], pads_end=pads[1::2],
        dilations=m["dilations"], groups=m["groups"], data_format="NCX", weights_format="OIX",
        precision=HIGHEST)
    np.testing.assert_array_equal(got, _values(case["expected_filter_delta"]))


def _attr(attrs, prefix):
    return next(v for k, v in attrs.items() if k.startswith(prefix))


@pytest.mark.parametrize("case", COMPUTED["cases"], ids=lambda c: c["name"])
@pytest.mark.parametrize("name", ["convolution_backprop_filters", "convolution_backward_weights"])
def test_computed_backprop_filters(case, name):
    a = case["attrs"]
    fmt = _attr(a, "filter_format")
    shape = _attr(a, "filter_shape")
    kwargs = dict(strides=a["strides"], pads_begin=a["pads_begin"], pads_end=a["pads_end"],
                  dilations=a["dilations"], auto_pad=a["auto_pad"], groups=a["groups"],
                  data_format=a["data_format"], precision=HIGHEST)
    kwargs["filter_format" if name == "convolution_backprop_filters" else "weights_format"] = fmt
    x = _values(case["input_forward(src)"])
    dy = _values(case["output_delta(diff_dst)"])
    got = getattr(jaxconv, name)(x, dy, shape, **kwargs)
    np.testing.assert_array_equal(got, _values(case["expected_filter_delta"]))


@pytest.mark.parametrize("case", COMPUTED["cases"], ids=lambda c: c["name"])
def test_computed_effective_pads(case):
    """The pads our geometry resolves are the ones the vectors record."""
    a = case["attrs"]
    x_shape = case["input_forward(src)"]["shape"]
    p = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=tuple(x_shape),
        y_shape=tuple(case["output_delta(diff_dst)"]["shape"]),
        w_shape=tuple(_attr(a, "filter_shape")), strides=a["strides"],
        pads_begin=a["pads_begin"], pads_end=a["pads_end"], dilations=a["dilations"],
        auto_pad=a["auto_pad"], groups=a["groups"], data_format=a["data_format"],
        filter_format=_attr(a, "filter_format"))
    assert list(p.pads_begin) == case["effective_pads"]["pads_begin"]
    assert list(p.pads_end) == case["effective_pads"]["pads_end"]


def test_onednn_convolution_backward_data():
    case = next(c for c in ONEDNN["execution_vectors"] if c["op"] == "ConvolutionBackwardData")
    a = case["attrs"]
    got = jaxconv.convolution_backward_data(
        _values(case["inputs"]["diff_dst"]), _values(case["inputs"]["weights"]), a["dst_shape"],
        strides=a["strides"], pads_begin=a["pads_begin"], pads_end=a["pads_end"],
        dilations=a["dilations"], groups=a["groups"], data_format=a["data_format"],
        filter_format=a["weights_format"], precision=HIGHEST)
    np.testing.assert_array_equal(got, _values(case["expected"]))


def test_onednn_benchdnn_backward_weights_shape():
    got, want = h.benchdnn_weights_shape(ONEDNN, "ConvolutionBackwardWeights",
                                         jaxconv.convolution_backward_weights)
    assert got == want
