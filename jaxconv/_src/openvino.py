"""OpenVINO family: GroupConvolution, ConvolutionBackpropData, GroupConvolutionBackpropData.

Specification: OpenVINO opset1 GroupConvolutionBackpropData-1. Data is always NCX.
Filters reshape (a free merge of the two leading axes, not a transpose) onto
the layouts the other families already use:

* GroupConvolution filters ``[G, C_OUT, C_IN, *K]`` -> ``(G*C_OUT, C_IN, *K)``:
  a grouped convolution filter in OIX.
* GroupConvolutionBackpropData filters ``[G, C_IN, C_OUT, *K]`` ->
  ``(G*C_IN, C_OUT, *K)``: ConvTranspose weights in IOX (docs/semantics.md).
* ConvolutionBackpropData filters ``[C_IN, C_OUT, *K]``: IOX with one group.

The backprop-data ops are ConvTransposes under OpenVINO's auto_pad rules
(``geometry.TransposePadRule.OPENVINO``): without ``output_shape`` same_*
pad nothing; with it, ``total = max(0, S*(I-1) + DK - O + output_padding)``
is split with the extra element at the end for same_upper (the specification's rule),
or at the beginning with ``openvino_runtime_padding=True`` (what the OpenVINO
runtime does).

T1 is any numeric type: floats, and integers, which accumulate in int32 when
narrower than 32 bits (in their own type otherwise) and come back in the input
dtype unless ``preferred_element_type`` says otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxconv._src import geometry, options, primitive
from jaxconv._src.geometry import Names, SizeRule, TransposePadRule
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import document_lowering
from jaxconv._src.typing import (
    ArrayLike,
    AutoPad,
    DataGradLowering,
    DTypeLike,
    ForwardLowering,
    IntOrSeq,
    PrecisionLike,
    ShapeLike,
)

_NAMES = Names(x="data", y="output", w_shape="filters", w_format="filters layout",
               explicit_pad="explicit", layout_arguments=False)


@dataclasses.dataclass(frozen=True)
class _Filters:
    """An OpenVINO filters layout: its text, whether it has a G axis, where C_IN is."""

    layout: str
    grouped: bool
    c_in_axis: int


_GROUP_CONVOLUTION = _Filters("[G, C_OUT, C_IN, *K]", grouped=True, c_in_axis=2)
_GROUP_BACKPROP = _Filters("[G, C_IN, C_OUT, *K]", grouped=True, c_in_axis=1)
_BACKPROP = _Filters("[C_IN, C_OUT, *K]", grouped=False, c_in_axis=0)


def _check_filters(op: str, x: jax.Array, w: jax.Array, filters: _Filters) -> int:
    """Checks the filters' rank against the data; returns the groups G."""
    n = geometry.spatial_rank(op, "data", x.ndim)
    want = n + 3 if filters.grouped else n + 2
    if w.ndim != want:
        raise ValueError(
            f"{op}: filters must have rank {want} ({filters.layout}) for rank-{x.ndim} data, got "
            f"rank {w.ndim} (shape {list(w.shape)})"
        )
    if not filters.grouped:
        return 1
    g = w.shape[0]
    c_in = w.shape[filters.c_in_axis]
    if g <= 0 or x.shape[1] != g * c_in:
        raise ValueError(
            f"{op}: data channels ({x.shape[1]}) must equal G x C_IN = {g} x {c_in} = "
            f"{g * c_in} from filters {list(w.shape)} {filters.layout}"
        )
    return g


def _check_flag(op: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: openvino_runtime_padding must be a bool, got {value!r}")
    return value


def group_convolution(
    data: ArrayLike,
    filters: ArrayLike,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "explicit",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: ForwardLowering = "auto",
) -> jax.Array:
    r"""OpenVINO GroupConvolution-1 (forward), the op GroupConvolutionBackpropData transposes.

    .. math::
        y[n, g \cdot C_{OUT} + co, o] = \sum_{ci, k} x[n, g \cdot C_{IN} + ci, o S + k D - p_b]
        \, W[g, co, ci, k]

    Args:
      data: ``[N, G*C_IN, *X]`` (NCX), any numeric dtype.
      filters: ``[G, C_OUT, C_IN, *K]``; G is read from its first axis.
      strides, pads_begin, pads_end, dilations: one int per spatial axis (or one
        int for all); defaults 1, 0, 0, 1.
      auto_pad: ``"explicit"`` (default), ``"same_upper"``, ``"same_lower"`` (output
        ``ceil(I / S)``; an odd total puts the extra pad at the end / beginning),
        ``"valid"``; case-insensitive.
      precision, preferred_element_type, lowering: as in :func:`jaxconv.convolution`.

    Returns:
      ``[N, G*C_OUT, *Y] in the data's dtype (or ``preferred_element_type``).

    Raises:
      ValueError: data channels not ``G * C_IN``, rank mismatch, bad attributes.
      TypeError: non-array or non-numeric inputs, mismatched dtypes.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> x = jnp.ones((1, 4, 6, 6)); w = jnp.ones((2, 3, 2, 3, 3))   # G=2, C_OUT=3, C_IN=2
      >>> jaxconv.group_convolution(x, w, pads_begin=1, pads_end=1).shape
      (1, 6, 6, 6)
    """
    op = "group_convolution"
    (x, w), precision, preferred_element_type = options.check_inputs(
        op, {"data": data, "filters": filters}, precision, preferred_element_type, floating=False)
    g = _check_filters(op, x, w, _GROUP_CONVOLUTION)
    w2 = w.reshape((w.shape[0] * w.shape[1], *w.shape[2:]))  # (G*C_OUT, C_IN, *K): OIX
    p = geometry.convolution_problem(
        op, _NAMES, x_shape=x.shape, y_shape=None, w_shape=w2.shape, strides=strides,
        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, auto_pad=auto_pad,
        groups=g, data_format="NCX", filter_format="OIX", size_rule=SizeRule.OPENVINO)
    return primitive.forward(x, w2, p=p, precision=precision,
                                preferred_element_type=preferred_element_type,
                                method=options.check_lowering(op, Kernel.FORWARD, lowering, p))


def _backprop_data(
    op: str, data: ArrayLike, filters: ArrayLike, output_shape: ShapeLike | None, grouped: bool,
    strides: IntOrSeq, pads_begin: IntOrSeq, pads_end: IntOrSeq, dilations: IntOrSeq,
    auto_pad: AutoPad, output_padding: IntOrSeq, openvino_runtime_padding: bool,
    precision: PrecisionLike, preferred_element_type: DTypeLike | None, method: DataGradLowering,
) -> jax.Array:
    (x, w), precision, preferred_element_type = options.check_inputs(
        op, {"data": data, "filters": filters}, precision, preferred_element_type, floating=False)
    runtime = _check_flag(op, openvino_runtime_padding)
    g = _check_filters(op, x, w, _GROUP_BACKPROP if grouped else _BACKPROP)
    if grouped:
        w = w.reshape((w.shape[0] * w.shape[1], *w.shape[2:]))  # (G*C_IN, C_OUT, *K): IOX
    p = geometry.conv_transpose_problem(
        op, _NAMES, x_shape=x.shape, y_shape=None, w_shape=w.shape, output_shape=output_shape,
        strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
        auto_pad=auto_pad, output_padding=output_padding, groups=g, data_format="NCX",
        filter_format="IOX", pad_rule=TransposePadRule.OPENVINO, upper_extra_at_end=not runtime)
    return primitive.data_grad(x, w, p=p, precision=precision,
                                  preferred_element_type=preferred_element_type,
        method=options.check_lowering(op, Kernel.DATA, method, p))


@document_lowering(Kernel.DATA)
def convolution_backprop_data(
    data: ArrayLike,
    filters: ArrayLike,
    output_shape: ShapeLike | None = None,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "explicit",
    output_padding: IntOrSeq = None,
    openvino_runtime_padding: bool = False,
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: DataGradLowering = "auto",
) -> jax.Array:
    r"""OpenVINO ConvolutionBackpropData-1: a transposed convolution, filters ``[C_IN, C_OUT, *K]``.

    Let ``full`` be the un-padded transposed convolution, of length
    ``S*(I-1) + DK`` per spatial axis (zero past its end):

    .. math::
        full[n, co, i S + k D] \mathrel{+}= x[n, ci, i] \, W[ci, co, k]

    The result is ``y[o] = full[o + pb]`` for ``o`` in ``[0, O)``:

    * without ``output_shape``: ``O = S*(I-1) + DK - pb - pe + output_padding``,
      with ``pb = pe = 0`` for same_upper, same_lower and valid;
    * with ``output_shape``: ``O = output_shape``; pb = pads_begin for explicit
      (pads_end unused), 0 for valid, and for same_*: ``total = max(0, S*(I-1) +
      DK - O + output_padding)`` split as ``pb = total // 2`` for same_upper (the
      specification: extra padding at the end) and ``pb = total - total // 2`` for
      same_lower. ``openvino_runtime_padding=True`` swaps the split of an odd
      total, as the OpenVINO runtime does.

    Positions past the end of ``full`` are zeros. No spatial flip of the
    stored kernel. output_padding is not bounded by the stride (as in
    OpenVINO): elements it adds past ``full`` are zeros.

    Args:
      data: ``[N, C_IN, *X]`` (NCX), any numeric dtype.
      filters: ``[C_IN, C_OUT, *K]`` (the PyTorch/ONNX ConvTranspose weight).
      output_shape: optional spatial output sizes (ints; tuple, numpy integer
        array or concrete jax array).
      strides, pads_begin, pads_end, dilations: one int per spatial axis (or one
        int for all); defaults 1, 0, 0, 1.
      auto_pad: ``"explicit"`` (default), ``"same_upper"``, ``"same_lower"``,
        ``"valid"``; case-insensitive.
      output_padding: non-negative, per spatial axis; default 0.
      openvino_runtime_padding: reproduce the OpenVINO runtime's split of an
        odd same_* total (extra at the beginning for same_upper).
      precision, preferred_element_type: as in :func:`jaxconv.convolution`.
      lowering: {LOWERING}

    Returns:
      ``[N, C_OUT, *Y]`` in the data's dtype (or ``preferred_element_type``).

    Raises:
      ValueError: ``filters`` C_IN not the data's channels, rank mismatch,
        ``output_shape`` of the wrong length, bad attributes.
      TypeError: non-array or non-numeric inputs, non-integer ``output_shape``.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> x = jnp.asarray([[[5., 6., 7., 2.]]]); w = jnp.asarray([[[2., 0., 1.]]])
      >>> jaxconv.convolution_backprop_data(x, w)
      Array([[[10., 12., 19., 10.,  7.,  2.]]], dtype=float32)
    """
    return _backprop_data(
        "convolution_backprop_data", data, filters, output_shape, False, strides, pads_begin,
        pads_end, dilations, auto_pad, output_padding, openvino_runtime_padding, precision,
        preferred_element_type, lowering)


@document_lowering(Kernel.DATA)
def group_convolution_backprop_data(
    data: ArrayLike,
    filters: ArrayLike,
    output_shape: ShapeLike | None = None,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "explicit",
    output_padding: IntOrSeq = None,
    openvino_runtime_padding: bool = False,
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: DataGradLowering = "auto",
) -> jax.Array:
    r"""OpenVINO GroupConvolutionBackpropData-1: a grouped transposed convolution.

    The groups G come from ``filters.shape[0]``; the filters reshaped to
    ``(G*C_IN, C_OUT, *K)`` are ConvTranspose IOX weights, and the op is
    exactly the vjp of :func:`group_convolution` w.r.t. its data, with the
    same filters array (GroupConvolution's ``[G, C_OUT, C_IN, *K]`` names the
    same axes from the forward side: its C_OUT is this op's C_IN).

    Per group ``g``, the transposed convolution of :func:`convolution_backprop_data`:

    .. math::
        full[n, g \cdot C_{OUT} + co, i S + k D] \mathrel{+}= x[n, g \cdot C_{IN} + ci, i]
        \, W[g, ci, co, k]

    with the same output size, padding, ``output_shape``, ``output_padding``
    and ``openvino_runtime_padding`` rules (``y[o] = full[o + pb]``).

    Args:
      data: ``[N, G*C_IN, *X]`` (NCX), any numeric dtype.
      filters: ``[G, C_IN, C_OUT, *K]`` (spatial axes in data order).
      output_shape: optional spatial output sizes (ints).
      strides, pads_begin, pads_end, dilations: as in :func:`convolution_backprop_data`.
      auto_pad, output_padding: as in :func:`convolution_backprop_data`.
      openvino_runtime_padding: as in :func:`convolution_backprop_data`.
      precision, preferred_element_type: as in :func:`convolution_backprop_data`.
      lowering: {LOWERING}

    Returns:
      ``[N, G*C_OUT, *Y]`` in the data's dtype (or ``preferred_element_type``).

    Raises:
      ValueError: data channels not ``G * C_IN``, rank mismatch, ``output_shape``
        of the wrong length, bad attributes.
      TypeError: non-array or non-numeric inputs, non-integer ``output_shape``.

    Example (the 2D IR example of the GroupConvolutionBackpropData-1 page, with smaller spatial sizes):
      >>> import jax.numpy as jnp, jaxconv
      >>> x = jnp.ones((1, 20, 16, 16)); w = jnp.ones((4, 5, 2, 3, 3))
      >>> jaxconv.group_convolution_backprop_data(x, w, strides=2, pads_begin=1,
      ...                                         pads_end=1).shape
      (1, 8, 31, 31)
    """
    return _backprop_data(
        "group_convolution_backprop_data", data, filters, output_shape, True, strides,
        pads_begin, pads_end, dilations, auto_pad, output_padding, openvino_runtime_padding,
        precision, preferred_element_type, lowering)
