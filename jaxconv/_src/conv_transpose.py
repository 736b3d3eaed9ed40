"""oneDNN Graph ConvTranspose family: forward, data and weight gradients.

Specifications: oneDNN Graph ConvTransposeBackwardWeights (oneDNN's current
name, default weights_format XOI) and ConvTransposeBackpropFilters-1 (the oneAPI
specification's older name, default filter_format XIO). Every op accepts the
four weight formats IOX, XOI, OIX and XIO, read letter by letter: I carries the
full in_channels (the ConvTranspose input's channels), O the per-group
out_channels (docs/semantics.md, "Layouts").

A ConvTranspose is the adjoint of a convolution, so each op here is a kernel
of ``lowering`` applied to that convolution (``geometry.conv_transpose_problem``):

* ``conv_transpose``                  = the convolution's data gradient
* ``conv_transpose_backward_data``    = the convolution's forward
* ``conv_transpose_backward_weights`` = the convolution's weight gradient with
  src and diff_dst swapped (docs/semantics.md, "The math every op shares"): the same kernel as
  ``convolution_backprop_filters``.

auto_pad follows the forward ConvTranspose rule (total = max(0, DK - S)) in
every op, so each gradient op is exactly the vjp of ``conv_transpose``.
"""

from __future__ import annotations

import jax

from jaxconv._src import geometry, options, primitive
from jaxconv._src.geometry import Names
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import document_lowering
from jaxconv._src.typing import (
    ArrayLike,
    AutoPad,
    ConvTransposeFilterFormat,
    DataFormat,
    DataGradLowering,
    DTypeLike,
    ForwardLowering,
    IntOrSeq,
    PrecisionLike,
    ShapeLike,
    WeightGradLowering,
)
from jaxconv._src.weight_gradient import weight_gradient

_FORWARD_NAMES = Names(x="input", y="output", w_shape="filter",
                       w_format="filter_format")


@document_lowering(Kernel.DATA)
def conv_transpose(
    input: ArrayLike,  # noqa: A002 - the spec's name
    filter: ArrayLike,  # noqa: A002
    output_shape: ShapeLike | None = None,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    output_padding: IntOrSeq = None,
    groups: int = 1,
    data_format: DataFormat = "NXC",
    filter_format: ConvTransposeFilterFormat = "XOI",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: DataGradLowering = "auto",
) -> jax.Array:
    r"""oneDNN Graph ConvTranspose (forward), 1D/2D/3D, grouped.

    With the weights read as IOX ``(IC, OC/g, *K)`` (the PyTorch ConvTranspose
    weight), the un-padded result of length ``S*(I-1) + DK`` is

    .. math::
        full[n, g \cdot OC_g + oc, i S + k D] \mathrel{+}= x[n, g \cdot IC_g + ic, i]
        \, W[g \cdot IC_g + ic, oc, k]

    and ``y[o] = full[o + pb]`` for ``o`` in ``[0, O)``, zero past the end of
    ``full``. Without ``output_shape``, ``O = S*(I-1) + DK - pb - pe +
    output_padding``. No spatial flip of the stored kernel.

    Computed as the data gradient of the convolution it transposes, by the
    formulation of that kernel each backend takes (``lowering``;
    docs/lowerings.md lists them).

    Args:
      input: ``x`` in ``data_format``: ``(N, *X, IC)`` (NXC) or ``(N, IC, *X)`` (NCX).
      filter: the weights in ``filter_format``: IOX ``(IC, OC/g, *K)``,
        XOI ``(*K, OC/g, IC)`` (default), OIX ``(OC/g, IC, *K)`` or XIO
        ``(*K, IC, OC/g)``.
      output_shape: optional spatial output sizes. When given, the result is
        ``full`` cropped at offset pb (pads_begin for explicit pads, 0 for
        valid, and for same_upper/same_lower from ``total = max(0, S*(I-1) + DK
        - O + output_padding)``, same_upper putting the extra pad at the end)
        and zero-filled past the end of ``full``; pads_end is not used.
      strides, pads_begin, pads_end, dilations: one int per spatial axis (or
        one int for all); defaults 1, 0, 0, 1.
      auto_pad: ``"none"``/``"explicit"``, ``"same_upper"``, ``"same_lower"``,
        ``"valid"`` (case-insensitive). same_*: ``total = max(0, DK - S)``
        (oneDNN's deconv rule), ``pb = total // 2`` for same_upper.
      output_padding: extra elements at the end of each spatial axis, each
        smaller than its stride; default 0.
      groups: number of channel groups.
      data_format: ``"NXC"`` (default) or ``"NCX"``.
      filter_format: ``"XOI"`` (default), ``"IOX"``, ``"OIX"`` or ``"XIO"``.
      precision, preferred_element_type: as in :func:`jaxconv.convolution`.
      lowering: {LOWERING}

    Returns:
      ``y`` in ``data_format`` with ``OC`` channels.

    Raises:
      ValueError: inconsistent shapes, channels or groups, bad attribute values.
      TypeError: non-array inputs, traced ``output_shape``, mismatched dtypes.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> x = jnp.ones((1, 4, 4, 8))                  # NXC
      >>> w = jnp.ones((3, 3, 2, 8))                  # XOI: (KH, KW, OC/g, IC)
      >>> jaxconv.conv_transpose(x, w, strides=2, pads_begin=1, pads_end=1,
      ...                        output_padding=1).shape
      (1, 8, 8, 2)
    """
    op = "conv_transpose"
    (x, w), precision, preferred_element_type = options.check_inputs(
        op, {"input": input, "filter": filter}, precision, preferred_element_type)
    p = geometry.conv_transpose_problem(
        op, _FORWARD_NAMES, x_shape=x.shape, y_shape=None, w_shape=w.shape,
        output_shape=output_shape, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
        dilations=dilations, auto_pad=auto_pad, output_padding=output_padding, groups=groups,
        data_format=data_format, filter_format=filter_format)
    return primitive.data_grad(x, w, p=p, precision=precision,
                                  preferred_element_type=preferred_element_type,
        method=options.check_lowering(op, Kernel.DATA, lowering, p))


_DATA_NAMES = Names(x="input", y="output_delta", w_shape="filter",
                    w_format="filter_format")


def conv_transpose_backward_data(
    output_delta: ArrayLike,
    filter: ArrayLike,  # noqa: A002
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    output_padding: IntOrSeq = None,
    groups: int = 1,
    data_format: DataFormat = "NXC",
    filter_format: ConvTransposeFilterFormat = "XOI",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: ForwardLowering = "auto",
) -> jax.Array:
    r"""oneDNN ConvTransposeBackwardData: the gradient of :func:`conv_transpose` w.r.t. its input.

    .. math::
        dx[n, g \cdot IC_g + ic, i] = \sum_{oc, k} dy[n, g \cdot OC_g + oc, i S + k D - p_b]
        \, W[g \cdot IC_g + ic, oc, k]

    (IOX reading, ``dy`` zero outside ``[0, O)``): a plain strided, dilated
    convolution of ``dy``: the forward kernel of :func:`jaxconv.convolution`.
    The forward input size ``I`` is solved from ``O = S*(I-1) + DK - pb - pe +
    output_padding``; ``output_padding`` only takes part in that shape check.

    Layouts: the data tensors in ``data_format``, NXC ``(N, *X, C)`` (default) or
    NCX ``(N, C, *X)``; the weights in ``filter_format``: IOX ``(IC, OC/g, *K)``,
    XOI ``(*K, OC/g, IC)``, OIX ``(OC/g, IC, *K)`` or XIO ``(*K, IC, OC/g)``, IC
    being the ConvTranspose's input channels.

    Args:
      output_delta: ``dy``, the gradient w.r.t. the ConvTranspose output.
      filter: the weights, in ``filter_format`` (see :func:`conv_transpose`).
      strides, pads_begin, pads_end, dilations, auto_pad: as in :func:`conv_transpose`.
      output_padding, groups, data_format, filter_format: as in :func:`conv_transpose`.
      precision, preferred_element_type: as in :func:`conv_transpose`.
      lowering: as in :func:`jaxconv.convolution` (this op is a forward convolution).

    Returns:
      ``dx`` with the ConvTranspose input's shape.

    Raises:
      ValueError: ``output_delta``'s spatial shape is not a ConvTranspose
        output size for these attributes, inconsistent channels, bad values.
      TypeError: non-array inputs, mismatched dtypes.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> dy = jnp.ones((1, 8, 8, 2)); w = jnp.ones((3, 3, 2, 8))
      >>> jaxconv.conv_transpose_backward_data(dy, w, strides=2, pads_begin=1, pads_end=1,
      ...                                      output_padding=1).shape
      (1, 4, 4, 8)
    """
    op = "conv_transpose_backward_data"
    (dy, w), precision, preferred_element_type = options.check_inputs(
        op, {"output_delta": output_delta, "filter": filter}, precision, preferred_element_type)
    p = geometry.conv_transpose_problem(
        op, _DATA_NAMES, x_shape=None, y_shape=dy.shape, w_shape=w.shape, strides=strides,
        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, auto_pad=auto_pad,
        output_padding=output_padding, groups=groups, data_format=data_format,
        filter_format=filter_format)
    return primitive.forward(dy, w, p=p, precision=precision,
                                preferred_element_type=preferred_element_type,
                                method=options.check_lowering(op, Kernel.FORWARD, lowering, p))


_WEIGHTS_NAMES = Names(x="src", y="diff_dst", w_shape="weights_shape",
                       w_format="weights_format")


@document_lowering(Kernel.WEIGHT)
def conv_transpose_backward_weights(
    src: ArrayLike,
    diff_dst: ArrayLike,
    weights_shape: ShapeLike | None = None,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    output_padding: IntOrSeq = None,
    groups: int = 1,
    data_format: DataFormat = "NXC",
    weights_format: ConvTransposeFilterFormat = "XOI",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: WeightGradLowering = "auto",
) -> jax.Array:
    r"""oneDNN Graph ConvTransposeBackwardWeights: the gradient of :func:`conv_transpose` w.r.t. its weights.

    .. math::
        dW[g \cdot IC_g + ic, oc, k] = \sum_{n, i} x[n, g \cdot IC_g + ic, i]
        \, dy[n, g \cdot OC_g + oc, i S + k D - p_b]

    (IOX reading, ``dy`` zero outside ``[0, O)``). This is
    :func:`jaxconv.convolution_backprop_filters` with ``input_forward =
    diff_dst`` and ``output_delta = src`` (the same weight-gradient kernel; the
    formulation each backend takes is listed in docs/lowerings.md), written
    in ``weights_format``.

    Layout note: the prose of oneDNN's ConvTransposeBackwardWeights page gives
    IOX as ``(in_channels / groups, out_channels, X)``. oneDNN's code and unit
    tests (ConvtransposeWithGroups: src C=4, IOX (4, 4, 1, 1), g=2 -> dst C=8)
    and the ConvTransposeBackpropFilters-1 page put the full count on I; jaxconv
    follows the code: IOX is ``(IC, OC/g, *K)`` (docs/semantics.md). With
    ``groups=1`` both readings agree.

    auto_pad uses the forward ConvTranspose rule (``total = max(0, DK - S)``),
    so this op is exactly the vjp of :func:`conv_transpose` with the same
    attributes (oneDNN applies the convolution rule to diff_dst here, which
    disagrees with its own forward when output_padding > 0).

    Args:
      src: ``x``, the ConvTranspose input, in ``data_format``.
      diff_dst: ``dy``, the gradient w.r.t. the ConvTranspose output; its
        spatial shape must be ``S*(I-1) + DK - pb - pe + output_padding``.
      weights_shape: the full weights shape in ``weights_format`` (required):
        IOX ``(IC, OC/g, *K)``, XOI ``(*K, OC/g, IC)``, OIX ``(OC/g, IC, *K)`` or
        XIO ``(*K, IC, OC/g)``. Tuple, numpy array or concrete jax array.
      strides, pads_begin, pads_end, dilations, auto_pad: as in :func:`conv_transpose`.
      output_padding, groups, data_format: as in :func:`conv_transpose`.
      precision, preferred_element_type: as in :func:`conv_transpose`.
      lowering: {LOWERING}
      weights_format: ``"XOI"`` (default), ``"IOX"``, ``"OIX"`` or ``"XIO"``.

    Returns:
      ``diff_weights`` with shape ``weights_shape``.

    Raises:
      ValueError: ``diff_dst``'s spatial shape is not the forward output size
        (both shapes are stated), channels do not match ``weights_shape`` or
        ``groups``, output_padding not smaller than the stride, bad values.
      TypeError: non-array inputs, traced ``weights_shape``, mismatched dtypes.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> src = jnp.ones((1, 4, 1, 1)); diff_dst = jnp.ones((1, 8, 1, 1))
      >>> jaxconv.conv_transpose_backward_weights(src, diff_dst, (4, 4, 1, 1), groups=2,
      ...     data_format="NCX", weights_format="IOX").shape      # IC=4 (full), OC/g=4
      (4, 4, 1, 1)
    """
    return weight_gradient(
        "conv_transpose_backward_weights", _WEIGHTS_NAMES, src, diff_dst, weights_shape,
        precision, preferred_element_type, lowering=lowering, strides=strides,
        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, auto_pad=auto_pad,
        output_padding=output_padding, groups=groups, data_format=data_format,
        filter_format=weights_format, transposed=True)


_FILTERS_NAMES = Names(x="input_forward", y="output_delta",
                       w_shape="filter_shape", w_format="filter_format")


@document_lowering(Kernel.WEIGHT)
def conv_transpose_backprop_filters(
    input_forward: ArrayLike,
    output_delta: ArrayLike,
    filter_shape: ShapeLike | None = None,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    output_padding: IntOrSeq = None,
    groups: int = 1,
    data_format: DataFormat = "NXC",
    filter_format: ConvTransposeFilterFormat = "XIO",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: WeightGradLowering = "auto",
) -> jax.Array:
    r"""oneDNN Graph ConvTransposeBackpropFilters-1: :func:`conv_transpose_backward_weights` under the older spec.

    ``input_forward`` = ``src``, ``output_delta`` = ``diff_dst``,
    ``filter_shape`` = ``weights_shape``, ``filter_format`` (default ``"XIO"``,
    as the older spec) = ``weights_format``. The spec's XIO is
    ``(*K, in_channels, out_channels/groups)`` and its OIX ``(out_channels/groups,
    in_channels, *K)``; IOX and XOI are accepted too. Same math and lowering:

    .. math::
        dW[g \cdot IC_g + ic, oc, k] = \sum_{n, i} x[n, g \cdot IC_g + ic, i]
        \, dy[n, g \cdot OC_g + oc, iS + kD - p_b]

    with ``x`` = ``input_forward`` (the ConvTranspose input) and ``dy`` =
    ``output_delta`` (the gradient w.r.t. its output), both in ``data_format``.

    Layouts: the data tensors in ``data_format``, NXC ``(N, *X, C)`` (default) or
    NCX ``(N, C, *X)``; the weights in ``filter_format``: IOX ``(IC, OC/g, *K)``,
    XOI ``(*K, OC/g, IC)``, OIX ``(OC/g, IC, *K)`` or XIO ``(*K, IC, OC/g)``, IC
    being the ConvTranspose's input channels.

    Args:
      input_forward: the ConvTranspose input, in ``data_format``.
      output_delta: the gradient w.r.t. the ConvTranspose output.
      filter_shape: the full filter shape in ``filter_format`` (required).
      strides, pads_begin, pads_end, dilations, auto_pad: as in :func:`conv_transpose`.
      output_padding, groups, data_format: as in :func:`conv_transpose`.
      precision, preferred_element_type: as in :func:`conv_transpose`.
      lowering: {LOWERING}
      filter_format: ``"XIO"`` (default), ``"OIX"``, ``"IOX"`` or ``"XOI"``.

    Returns:
      ``filter_delta`` with shape ``filter_shape``.

    Raises:
      ValueError: as :func:`conv_transpose_backward_weights`.
      TypeError: as :func:`conv_transpose_backward_weights`.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> x = jnp.ones((2, 5, 5, 3)); dy = jnp.ones((2, 10, 10, 4))
      >>> jaxconv.conv_transpose_backprop_filters(x, dy, (3, 3, 3, 4), strides=2,
      ...     auto_pad="same_upper").shape
      (3, 3, 3, 4)
    """
    return weight_gradient(
        "conv_transpose_backprop_filters", _FILTERS_NAMES, input_forward, output_delta,
        filter_shape, precision, preferred_element_type, lowering=lowering, strides=strides,
        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, auto_pad=auto_pad,
        output_padding=output_padding, groups=groups, data_format=data_format,
        filter_format=filter_format, transposed=True)
