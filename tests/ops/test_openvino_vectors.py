"""Ground truth for the OpenVINO family, and the seed's IR examples.

* OpenVINO op_reference tests for GroupConvolutionBackpropData and
  ConvolutionBackpropData; one upstream case is inconsistent upstream and its
  file carries corrected values (checked against OpenVINO 2026.4.1);
* type_prop shape inference (static cases; JAX shapes are static, so the
  dynamic-dimension cases have no counterpart) and its error cases;
* edge cases observed on the OpenVINO runtime (odd same_* totals under
  ``openvino_runtime_padding=True``, as the file says);
* ONNX ConvTranspose backend tests expressed as ConvolutionBackpropData;
* the three IR examples of the seed through ``from_openvino_ir``.
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
GCBD = h.load_vectors("openvino_group_convolution_backprop_data.json")
CBD = h.load_vectors("openvino_convolution_backprop_data.json")
TYPE_PROP = h.load_vectors("openvino_group_convolution_backprop_data_type_prop.json")
EDGE = h.load_vectors("openvino_gcbd_edge_cases_observed.json")
ONNX = h.load_vectors("external_onnx_convtranspose_as_gcbd.json")


def _values(entry) -> np.ndarray:
    return np.asarray(entry["values"], np.float32).reshape(entry["shape"])


def _attrs(a) -> dict:
    return {k: v for k, v in a.items() if v is not None}


@pytest.mark.parametrize("case", GCBD["cases"], ids=lambda c: c["name"])
def test_openvino_reference_group_convolution_backprop_data(case):
    got = jaxconv.group_convolution_backprop_data(
        _values(case["input"]), _values(case["filter"]), case["output_shape_input"],
        **_attrs(case["attrs"]), precision=HIGHEST)
    want = case.get("expected_corrected", case["expected"])
    jaxconv.testing.assert_close(got, _values(want))


@pytest.mark.parametrize("case", CBD["cases"], ids=lambda c: c["name"])
def test_openvino_reference_convolution_backprop_data(case):
    got = jaxconv.convolution_backprop_data(
        _values(case["input"]), _values(case["filter"]), case["output_shape_input"],
        **_attrs(case["attrs"]), precision=HIGHEST)
    jaxconv.testing.assert_close(got, _values(case["expected"]))
    # == GroupConvolutionBackpropData with G = 1
    got_g = jaxconv.group_convolution_backprop_data(
        _values(case["input"]), _values(case["filter"])[None], case["output_shape_input"],
        **_attrs(case["attrs"]), precision=HIGHEST)
    np.testing.assert_array_equal(got_g, got)


def _seed_pads_begin(case):
    """(pads_begin under the seed's split, any odd same_* total?) for a case with output_shape."""
    a = case["attrs"]
    x, w = case["input"]["shape"], case["filter"]["shape"]
    pb, odd = [], False
    for i, k, s, d, o, op in zip(x[2:], w[3:], a["strides"], a["dilations"],
                                 case["output_shape_input"], a["output_padding"]):
        total = max(0, s * (i - 1) + (k - 1) * d + 1 - o + op)
        odd |= total % 2 == 1
        pb.append(total // 2 if a["auto_pad"].lower() == "same_upper" else total - total // 2)
    return pb, odd


def _odd_same_total(case) -> bool:
    a = case["attrs"]
    if not a["auto_pad"].lower().startswith("same") or case["output_shape_input"] is None:
        return False
    return _seed_pads_begin(case)[1]


@pytest.mark.parametrize("case", EDGE["cases"], ids=lambda c: c["name"])
def test_runtime_observed_edge_cases_under_runtime_padding(case):
    got = jaxconv.group_convolution_backprop_data(
        _values(case["input"]), _values(case["filter"]), case["output_shape_input"],
        **case["attrs"], openvino_runtime_padding=True, precision=HIGHEST)
    jaxconv.testing.assert_close(got, _values(case["expected"]))


@pytest.mark.parametrize("case", EDGE["cases"], ids=lambda c: c["name"])
def test_runtime_observed_edge_cases_under_the_default(case):
    """Equal to the runtime unless a same_* total is odd; then the seed's split."""
    x, w = _values(case["input"]), _values(case["filter"])
    got = jaxconv.group_convolution_backprop_data(
        x, w, case["output_shape_input"], **case["attrs"], precision=HIGHEST)
    if not _odd_same_total(case):
        jaxconv.testing.assert_close(got, _values(case["expected"]))
        return
    pb, _ = _seed_pads_begin(case)
    a = case["attrs"]
    want = h.numpy_group_conv_transpose(x, w, a["strides"], a["dilations"], pb,
                                        case["output_shape_input"])
    jaxconv.testing.assert_close(got, want)
    assert h.rel_error(got, _values(case["expected"])) > jaxconv.testing.tolerance(got.dtype)


def test_default_split_differs_from_runtime_on_odd_totals():
    """The seed puts the extra same_upper pad at the end: a one-element shift."""
    case = next(c for c in EDGE["cases"] if c["name"] == "same_upper_oshape_odd_total_h")
    x, w = _values(case["input"]), _values(case["filter"])
    kw = dict(case["attrs"], precision=HIGHEST)
    rt = jaxconv.group_convolution_backprop_data(x, w, (3, 4), **kw, openvino_runtime_padding=True)
    seed = jaxconv.group_convolution_backprop_data(x, w, (3, 4), **kw)
    full = jaxconv.group_convolution_backprop_data(x, w, **dict(kw, auto_pad="valid"))  # 4 x 5
    np.testing.assert_array_equal(seed, full[:, :, :3, :4])   # pb = floor(1/2) = 0
    np.testing.assert_array_equal(rt, full[:, :, 1:, 1:])     # pb = ceil(1/2) = 1


@pytest.mark.parametrize("case", ONNX["cases"], ids=lambda c: c["name"])
def test_onnx_convtranspose_cases(case):
    x, w = _values(case["input"]), _values(case["filter"])
    got = jaxconv.convolution_backprop_data(x, w, case["output_shape_input"],
                                            **_attrs(case["attrs"]), precision=HIGHEST)
    np.testing.assert_array_equal(got, _values(case["expected"]))


def _static(case) -> bool:
    def ok(shape):
        return isinstance(shape, list) and all(isinstance(d, int) for d in shape)
    return ok(case["data"]) and ok(case["filters"]) and ok(case["expected_output"]) and (
        case.get("output_shape_input") is None or "value" in case["output_shape_input"])


@pytest.mark.parametrize("case", [c for c in TYPE_PROP["cases"] if _static(c)],
                         ids=lambda c: c["test"])
def test_type_prop_static_shapes(case):
    oshape = case.get("output_shape_input")
    out = jax.eval_shape(
        lambda x, w: jaxconv.group_convolution_backprop_data(
            x, w, oshape["value"] if oshape else None, strides=case.get("strides") or None,
            pads_begin=case.get("pads_begin") or None, pads_end=case.get("pads_end") or None,
            dilations=case.get("dilations") or None, auto_pad=case["auto_pad"]),
        jax.ShapeDtypeStruct(case["data"], jnp.float32),
        jax.ShapeDtypeStruct(case["filters"], jnp.float32))
    assert list(out.shape) == case["expected_output"]


def _error_call(case):
    dt = {"f16": jnp.float16, "f32": jnp.float32, "boolean": jnp.bool_}
    x = jnp.zeros(case["data"], dt[case.get("data_type", "f32")])
    filters = case["filters"]
    if filters == "DYN_RANK":  # the attribute checks do not need the filter's rank
        filters = [2, 8, 2, *([3] * (len(case["data"]) - 2))]
    w = jnp.zeros(filters, dt[case.get("filters_type", "f32")])
    oshape = case.get("output_shape_input")
    if oshape is not None:
        value = np.asarray(oshape["value"], np.float32 if "f32" in oshape["kind"] else np.int64)
        oshape = value.reshape(2, 1) if "{2,1}" in oshape["kind"] else value
    return lambda: jaxconv.group_convolution_backprop_data(
        x, w, oshape, strides=case.get("strides"), pads_begin=case.get("pads_begin"),
        pads_end=case.get("pads_end"), dilations=case.get("dilations"),
        auto_pad=case.get("auto_pad", "explicit"), output_padding=case.get("output_padding"))


@pytest.mark.parametrize("case", TYPE_PROP["error_cases"], ids=lambda c: c["test"])
def test_type_prop_error_cases(case):
    with pytest.raises((ValueError, TypeError), match=r"^group_convolution_backprop_data: "):
        _error_call(case)()


# ---- the seed's IR examples ----------------------------------------------------

def _seed_ir(n: int) -> str:
    ones = ",".join(["1"] * n)
    twos = ",".join(["2"] * n)
    data = "".join(f"<dim>{d}</dim>" for d in (1, 20, *([224] * n)))
    filt = "".join(f"<dim>{d}</dim>" for d in (4, 5, 2, *([3] * n)))
    out = "".join(f"<dim>{d}</dim>" for d in (1, 8, *([447] * n)))
    return f"""
<layer id="5" name="upsampling_node" type="GroupConvolutionBackpropData">
<data dilations="{ones}" pads_begin="{ones}" pads_end="{ones}" strides="{twos}"/>
<input>
<port id="0">{data}</port>
<port id="1">{filt}</port>
</input>
<output>
<port id="0" precision="FP32">{out}</port>
</output>
</layer>"""


@pytest.mark.parametrize("n", [1, 2, 3])
def test_seed_ir_examples(n):
    fn, shape = jaxconv.from_openvino_ir(_seed_ir(n))
    assert shape == (1, 8, *([447] * n))
    if n == 3:
        return  # 1x8x447^3: shape inference only here (benchmarks/ runs it)
    rng = np.random.default_rng(0)
    x = h.random(rng, (1, 20, *([224] * n)))
    w = h.random(rng, (4, 5, 2, *([3] * n)))
    y = fn(x, w)
    assert y.shape == shape
    ref = jaxconv.group_convolution_backprop_data(x, w, strides=2, pads_begin=1, pads_end=1)
    np.testing.assert_array_equal(y, ref)
    if n == 1:  # and against the numpy loop
        h.assert_close(y, h.numpy_group_conv_transpose(x, w, (2,), (1,), (1,), (447,)),
                       jnp.float32)


def test_ir_other_types_and_output_shape_port():
    cbd = """<layer type="ConvolutionBackpropData"><data strides="3,2" auto_pad="explicit"
      pads_begin="0,0" pads_end="0,0" dilations="1,1" output_padding="0,0"/>
      <input><port id="0"><dim>1</dim><dim>1</dim><dim>3</dim><dim>3</dim></port>
      <port id="1"><dim>1</dim><dim>2</dim><dim>3</dim><dim>3</dim></port>
      <port id="2"><dim>2</dim></port></input>
      <output><port id="3"><dim>1</dim><dim>2</dim><dim>10</dim><dim>8</dim></port></output></layer>"""
    fn, shape = jaxconv.from_openvino_ir(cbd, output_shape=(10, 8))
    assert shape == (1, 2, 10, 8)
    case = ONNX["cases"][0]
    np.testing.assert_array_equal(fn(_values(case["input"]), _values(case["filter"])),
                                  _values(case["expected"]))
    gc = """<layer type="GroupConvolution"><data strides="1,1" pads_begin="1,1" pads_end="1,1"
      dilations="1,1"/><input><port id="0"><dim>1</dim><dim>4</dim><dim>6</dim><dim>6</dim></port>
      <port id="1"><dim>2</dim><dim>3</dim><dim>2</dim><dim>3</dim><dim>3</dim></port></input>
      </layer>"""
    assert jaxconv.from_openvino_ir(gc)[1] == (1, 6, 6, 6)
