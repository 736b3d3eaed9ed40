"""The OpenVINO runtime as the independent oracle (CPU plugin, f32 inference).

Nodes are built with opset1's NodeFactory, which keeps pads together with an
output_shape input (the Python opset helpers drop them). HAZARDS.md sections
2 and 3: INFERENCE_PRECISION_HINT is f32 (the CPU plugin otherwise computes in
bf16 on avx512_bf16 machines), and GroupConvolutionBackpropData with G = 1 runs
as ConvolutionBackpropData on ``filters[0]`` (the CPU plugin refuses G = 1).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

ov = pytest.importorskip("openvino")
from openvino import opset1  # noqa: E402
from openvino.utils.node_factory import NodeFactory  # noqa: E402


@functools.lru_cache(maxsize=1)
def _core():
    return ov.Core()


def _ints(value, n: int, default: int) -> list[int]:
    if value is None:
        return [default] * n
    return [int(value)] * n if np.ndim(value) == 0 else [int(v) for v in value]


def _attrs(attrs: dict, n: int, with_output_padding: bool = True) -> dict:
    out = {
        "strides": _ints(attrs.get("strides"), n, 1),
        "pads_begin": _ints(attrs.get("pads_begin"), n, 0),
        "pads_end": _ints(attrs.get("pads_end"), n, 0),
        "dilations": _ints(attrs.get("dilations"), n, 1),
        "auto_pad": (attrs.get("auto_pad") or "explicit").lower(),
    }
    if with_output_padding:
        out["output_padding"] = _ints(attrs.get("output_padding"), n, 0)
    return out


def _run(op_type: str, data: np.ndarray, filters: np.ndarray, attrs: dict, output_shape=None):
    data = np.asarray(data, np.float32)
    filters = np.asarray(filters, np.float32)
    n = data.ndim - 2
    param = opset1.parameter(list(data.shape), np.float32, name="data")
    inputs = [param.output(0), opset1.constant(filters).output(0)]
    if output_shape is not None:
        inputs.append(opset1.constant(np.asarray(output_shape, np.int64)).output(0))
    node = NodeFactory("opset1").create(
        op_type, inputs, _attrs(attrs, n, with_output_padding=op_type != "GroupConvolution"))
    model = ov.Model([node], [param])
    compiled = _core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.asarray(compiled(data)[0])


def group_convolution_backprop_data(data, filters, attrs, output_shape=None):
    if filters.shape[0] == 1:  # HAZARDS.md section 3
        return _run("ConvolutionBackpropData", data, filters[0], attrs, output_shape)
    return _run("GroupConvolutionBackpropData", data, filters, attrs, output_shape)


def convolution_backprop_data(data, filters, attrs, output_shape=None):
    return _run("ConvolutionBackpropData", data, filters, attrs, output_shape)


def group_convolution(data, filters, attrs):
    return _run("GroupConvolution", data, filters, attrs)
