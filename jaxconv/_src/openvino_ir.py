"""Run an OpenVINO IR ``<layer>`` of the OpenVINO family as a jitted JAX callable."""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxconv._src import openvino

_OPS: dict[str, Callable[..., jax.Array]] = {
    "GroupConvolutionBackpropData": openvino.group_convolution_backprop_data,
    "ConvolutionBackpropData": openvino.convolution_backprop_data,
    "GroupConvolution": openvino.group_convolution,
}
#: the layer types with an optional third input (the spatial output shape)
_TAKES_OUTPUT_SHAPE = frozenset({"GroupConvolutionBackpropData", "ConvolutionBackpropData"})
_INT_LIST_ATTRS = ("strides", "pads_begin", "pads_end", "dilations", "output_padding")
_PRECISIONS = {"FP32": jnp.float32, "FP16": jnp.float16, "BF16": jnp.bfloat16,
               "FP64": jnp.float64, "I8": jnp.int8, "I32": jnp.int32, "U8": jnp.uint8}

_OP = "from_openvino_ir"


def _port_dims(port: ET.Element) -> tuple[int, ...]:
    try:
        return tuple(int(d.text or "") for d in port.findall("dim"))
    except (TypeError, ValueError):
        raise ValueError(
            f"{_OP}: port {port.get('id')} must list static integer <dim>s, got "
            f"{[d.text for d in port.findall('dim')]}") from None


def _parse_attrs(layer_type: str, data: ET.Element | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    allowed = set(_INT_LIST_ATTRS) | {"auto_pad"}
    if layer_type not in _TAKES_OUTPUT_SHAPE:  # the forward op has no output_padding
        allowed.discard("output_padding")
    for key, value in (data.attrib.items() if data is not None else ()):
        if key not in allowed:
            raise ValueError(
                f"{_OP}: <data> attribute {key!r} is not one of {sorted(allowed)} for "
                f"{layer_type}")
        if key == "auto_pad":
            attrs[key] = value
            continue
        try:
            attrs[key] = tuple(int(v) for v in value.split(",")) if value.strip() else None
        except ValueError:
            raise ValueError(
                f"{_OP}: <data> attribute {key} must be comma-separated ints, got {value!r}"
            ) from None
    return attrs


def from_openvino_ir(
    layer: str | ET.Element, output_shape: Any = None
) -> tuple[Callable[..., jax.Array], tuple[int, ...]]:
    """A jitted callable for one OpenVINO IR layer, and the output shape it infers.

    Reads the ``<data>`` attributes and the input port dims of a
    ``GroupConvolutionBackpropData``, ``ConvolutionBackpropData`` or
    ``GroupConvolution`` layer, and infers the output shape without computing.
    If the layer declares ``<output>`` port dims, they must equal the inferred
    shape.

    Args:
      layer: the ``<layer ...>...</layer>`` XML text, or a parsed element.
      output_shape: the values of the optional third input (the spatial output
        shape), which the IR holds in another layer (a Constant); required when
        the layer has a third input port.

    Returns:
      ``(fn, shape)``: ``fn(data, filters)`` runs the op under ``jax.jit``;
      ``shape`` is its output shape for the port dims of the XML.

    Raises:
      ValueError: unknown layer type or attribute, malformed dims, a missing
        ``output_shape`` value, or declared output dims that disagree.
      TypeError: ``layer`` is neither a string nor an XML element.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> fn, shape = jaxconv.from_openvino_ir('''
      ... <layer id="5" name="upsampling_node" type="GroupConvolutionBackpropData">
      ...   <data dilations="1" pads_begin="1" pads_end="1" strides="2"/>
      ...   <input><port id="0"><dim>1</dim><dim>20</dim><dim>224</dim></port>
      ...          <port id="1"><dim>4</dim><dim>5</dim><dim>2</dim><dim>3</dim></port></input>
      ...   <output><port id="0" precision="FP32"><dim>1</dim><dim>8</dim><dim>447</dim></port>
      ...   </output>
      ... </layer>''')
      >>> shape
      (1, 8, 447)
      >>> fn(jnp.ones((1, 20, 224)), jnp.ones((4, 5, 2, 3))).shape
      (1, 8, 447)
    """
    if isinstance(layer, str):
        try:
            element = ET.fromstring(layer.strip())
        except ET.ParseError as e:
            raise ValueError(f"{_OP}: layer is not well-formed XML: {e}") from None
    elif isinstance(layer, ET.Element):
        element = layer
    else:
        raise TypeError(f"{_OP}: layer must be XML text or an xml.etree Element, got "
                        f"{type(layer).__name__}")
    if element.tag != "layer":
        raise ValueError(f"{_OP}: expected a <layer> element, got <{element.tag}>")
    layer_type = element.get("type")
    if layer_type not in _OPS:
        raise ValueError(f"{_OP}: layer type must be one of {sorted(_OPS)}, got {layer_type!r}")
    attrs = _parse_attrs(layer_type, element.find("data"))
    inputs = element.find("input")
    ports = inputs.findall("port") if inputs is not None else []
    takes_shape = layer_type in _TAKES_OUTPUT_SHAPE
    if len(ports) not in (2, 3) or (len(ports) == 3 and not takes_shape):
        raise ValueError(f"{_OP}: {layer_type} takes 2{' or 3' if takes_shape else ''} "
                         f"input ports, got {len(ports)}")
    if len(ports) == 3 and output_shape is None:
        raise ValueError(f"{_OP}: the layer has an output_shape input (port "
                         f"{ports[2].get('id')}); pass its values as output_shape=")
    data_dims, filter_dims = _port_dims(ports[0]), _port_dims(ports[1])
    outputs = element.find("output")
    out_port = outputs.find("port") if outputs is not None else None
    dtype = _PRECISIONS.get(out_port.get("precision", "FP32"), jnp.float32) if out_port is not None \
        else jnp.float32

    op = _OPS[layer_type]
    if takes_shape:
        fn = functools.partial(op, output_shape=output_shape, **attrs)
    else:
        fn = functools.partial(op, **attrs)
    jitted = jax.jit(fn)
    shape = tuple(jax.eval_shape(
        fn, jax.ShapeDtypeStruct(data_dims, dtype),  # type: ignore[no-untyped-call]
        jax.ShapeDtypeStruct(filter_dims, dtype)).shape)  # type: ignore[no-untyped-call]
    if out_port is not None:
        declared = _port_dims(out_port)
        if declared != shape:
            raise ValueError(
                f"{_OP}: the layer declares output dims {list(declared)}, but {layer_type} with "
                f"these attributes gives {list(shape)}")
    return jitted, shape
