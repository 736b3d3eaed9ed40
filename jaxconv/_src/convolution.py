"""oneDNN Graph convolution family: Convolution, its data and weight gradients.

Seed: ConvolutionBackpropFilters-1 (oneDNN Graph), also known under oneDNN's
current name ConvolutionBackwardWeights. The ops only validate (through
``geometry``) and call a kernel of ``lowering``.
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
    ConvolutionFilterFormat,
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

_FORWARD_NAMES = Names(x="input", y="output", w_shape="filter", w_format="filter_format")


@document_lowering(Kernel.FORWARD)
def convolution(
    input: ArrayLike,  # noqa: A002 - the spec's name
    filter: ArrayLike,  # noqa: A002
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    groups: int = 1,
    data_format: DataFormat = "NXC",
    filter_format: ConvolutionFilterFormat = "XIO",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: ForwardLowering = "auto",
) -> jax.Array:
    r"""oneDNN Graph Convolution (forward), 1D/2D/3D, grouped.

    .. math::
        y[n, g \cdot OC_g + oc, o] = \sum_{ic, k} x[n, g \cdot IC_g + ic, o S + k D - p_b]
        \, W[g \cdot OC_g + oc, ic, k]

    with ``x`` zero outside ``[0, I)`` and ``O = floor((I + pb + pe - DK) / S) + 1``,
    ``DK = (K - 1) * D + 1``. Under ``jax.grad`` (and ``jax.jvp``, ``jax.vmap``)
    its derivatives are the kernels of :func:`convolution_backward_data` and
    :func:`convolution_backprop_filters`, never lax's own transposes
    (tests/core/test_primitive.py), so no strided + dilated remainder reaches XLA
    (docs/semantics.md, "A toolchain hazard").

    Args:
      input: data, ``(N, *X, IC)`` for ``data_format="NXC"`` or ``(N, IC, *X)``
        for ``"NCX"``; 1 to 3 spatial axes.
      filter: ``(*K, IC/groups, OC)`` for ``filter_format="XIO"`` or
        ``(OC, IC/groups, *K)`` for ``"OIX"``.
      strides: one positive int per spatial axis (or one int for all); default 1.
      pads_begin: non-negative padding at the start of each spatial axis; default 0.
      pads_end: non-negative padding at the end of each spatial axis; default 0.
      dilations: one positive int per spatial axis; default 1.
      auto_pad: ``"none"`` (or ``"explicit"``: use the pads), ``"same_upper"``,
        ``"same_lower"`` (output ``ceil(I / S)``; an odd total puts the extra pad
        at the end / beginning) or ``"valid"`` (no padding); case-insensitive.
      groups: number of channel groups; ``groups == IC`` is depthwise.
      data_format: ``"NXC"`` (default) or ``"NCX"``.
      filter_format: ``"XIO"`` (default) or ``"OIX"``.
      precision: passed to ``lax.conv_general_dilated``; use
        ``lax.Precision.HIGHEST`` for exact f32 on GPU/TPU.
      preferred_element_type: the result dtype and accumulation type (e.g. f32
        for f16/bf16 inputs). By default the result has the inputs' dtype;
        f16/bf16 still accumulate in f32.
      lowering: {LOWERING}

    Returns:
      ``y`` in ``data_format``, with ``OC`` channels.

    Raises:
      ValueError: inconsistent shapes, channels or groups, bad attribute values.
      TypeError: non-array inputs, mismatched or non-floating dtypes, bad kinds.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> x = jnp.ones((2, 8, 8, 4))          # NXC
      >>> w = jnp.ones((3, 3, 4, 6))          # XIO
      >>> jaxconv.convolution(x, w, strides=2, auto_pad="same_upper").shape
      (2, 4, 4, 6)
    """
    op = "convolution"
    (x, w), precision, preferred_element_type = options.check_inputs(
        op, {"input": input, "filter": filter}, precision, preferred_element_type)
    p = geometry.convolution_problem(
        op, _FORWARD_NAMES, x_shape=x.shape, y_shape=None, w_shape=w.shape,
        strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
        auto_pad=auto_pad, groups=groups, data_format=data_format, filter_format=filter_format,
    )
    return primitive.forward(x, w, p=p, precision=precision,
                                preferred_element_type=preferred_element_type,
                                method=options.check_lowering(op, Kernel.FORWARD, lowering, p))


_DATA_NAMES = Names(
    x="input", y="output_delta", w_shape="filter", w_format="filter_format",
    x_shape="input_shape",
)


@document_lowering(Kernel.DATA)
def convolution_backward_data(
    output_delta: ArrayLike,
    filter: ArrayLike,  # noqa: A002
    input_shape: ShapeLike,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    groups: int = 1,
    data_format: DataFormat = "NXC",
    filter_format: ConvolutionFilterFormat = "XIO",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: DataGradLowering = "auto",
) -> jax.Array:
    r"""oneDNN Graph ConvolutionBackwardData: the gradient of :func:`convolution` w.r.t. its input.

    .. math::
        dx[n, g \cdot IC_g + ic, s] = \sum_{oc, k, t \,:\, tS + kD - p_b = s}
        dy[n, g \cdot OC_g + oc, t] \, W[g \cdot OC_g + oc, ic, k]

    Each backend gets its own formulation (``lowering``; docs/lowerings.md
    lists them); none lets a strided + dilated remainder reach XLA (jaxlib
    0.10.2 CPU aborts on those: docs/semantics.md, "A toolchain hazard").

    Layouts: the data tensors in ``data_format``, NXC ``(N, *X, C)`` (default) or
    NCX ``(N, C, *X)``; the filter in ``filter_format``, XIO ``(*K, IC/g, OC)``
    (default) or OIX ``(OC, IC/g, *K)``.

    Args:
      output_delta: ``dy``, the gradient w.r.t. the forward output, in
        ``data_format``; its spatial shape must equal the forward output size.
      filter: the forward filter, ``XIO`` or ``OIX``.
      input_shape: the forward input's spatial shape, or its full shape in
        ``data_format`` order (several input sizes give the same output size
        when a stride is > 1, so it is required). Tuple, numpy array or
        concrete jax array.
      strides, pads_begin, pads_end, dilations: as in :func:`convolution`.
      auto_pad: as in :func:`convolution`, on the forward input size.
      groups, data_format, filter_format: as in :func:`convolution`.
      precision, preferred_element_type: as in :func:`convolution`.
      lowering: {LOWERING}

    Returns:
      ``dx`` with the forward input's shape.

    Raises:
      ValueError: inconsistent shapes, channels or groups, bad attribute values.
      TypeError: non-array inputs, traced ``input_shape``, mismatched dtypes.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> dy = jnp.ones((2, 4, 4, 6)); w = jnp.ones((3, 3, 4, 6))
      >>> jaxconv.convolution_backward_data(dy, w, (8, 8), strides=2, pads_begin=1,
      ...                                   pads_end=0).shape
      (2, 8, 8, 4)
    """
    op = "convolution_backward_data"
    (dy, w), precision, preferred_element_type = options.check_inputs(
        op, {"output_delta": output_delta, "filter": filter}, precision, preferred_element_type)
    n = geometry.spatial_rank(op, "output_delta", dy.ndim)
    layout = geometry.data_layout(op, "data_format", data_format, n)
    if w.ndim != n + 2:
        raise ValueError(
            f"{op}: filter must have rank {n + 2} like output_delta, got rank {w.ndim} "
            f"(shape {list(w.shape)})"
        )
    wl = geometry.filter_layout(op, "filter_format", filter_format, n,
                                geometry.CONVOLUTION_FILTER_FORMATS)
    g = geometry.check_groups(op, groups)
    x_shape = geometry.full_input_shape(
        op, _DATA_NAMES, input_shape, dy.shape, layout, w.shape[wl.i_axis] * g
    )
    p = geometry.convolution_problem(
        op, _DATA_NAMES, x_shape=x_shape, y_shape=dy.shape, w_shape=w.shape,
        strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
        auto_pad=auto_pad, groups=g, data_format=data_format, filter_format=filter_format,
    )
    return primitive.data_grad(dy, w, p=p, precision=precision,
                      preferred_element_type=preferred_element_type,
        method=options.check_lowering(op, Kernel.DATA, lowering, p))


_FILTERS_NAMES = Names(
    x="input_forward", y="output_delta", w_shape="filter_shape",
    w_format="filter_format",
)


@document_lowering(Kernel.WEIGHT)
def convolution_backprop_filters(
    input_forward: ArrayLike,
    output_delta: ArrayLike,
    filter_shape: ShapeLike | None = None,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    groups: int = 1,
    data_format: DataFormat = "NXC",
    filter_format: ConvolutionFilterFormat = "XIO",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: WeightGradLowering = "auto",
) -> jax.Array:
    r"""oneDNN Graph ConvolutionBackpropFilters-1: the gradient of :func:`convolution` w.r.t. the filter.

    .. math::
        dW[g \cdot OC_g + oc, ic, k] = \sum_{n, t} x[n, g \cdot IC_g + ic, tS + kD - p_b]
        \, dy[n, g \cdot OC_g + oc, t]

    ``O`` (the positions t) comes from ``output_delta``; ``pads_end`` never
    changes the values, it only takes part in the shape check. Each backend
    gets its own formulation (``lowering``; docs/lowerings.md lists them),
    written directly in ``filter_format``.

    The spec's optional third input and its ``filter_shape`` attribute both map
    onto ``filter_shape``; it is required, since the kernel size cannot in
    general be recovered from the data shapes.

    Layouts: the data tensors in ``data_format``, NXC ``(N, *X, C)`` (default) or
    NCX ``(N, C, *X)``; the filter in ``filter_format``, XIO ``(*K, IC/g, OC)``
    (default) or OIX ``(OC, IC/g, *K)``.

    Args:
      input_forward: ``x``, the forward input, in ``data_format``.
      output_delta: ``dy``, the gradient w.r.t. the forward output; its spatial
        shape must equal the forward output size.
      filter_shape: the full filter shape in ``filter_format``: ``(*K, IC/g, OC)``
        for ``"XIO"`` or ``(OC, IC/g, *K)`` for ``"OIX"``. Tuple, numpy integer
        array or concrete jax array (not a traced value).
      strides, pads_begin, pads_end, dilations: as in :func:`convolution`.
      auto_pad: as in :func:`convolution`, on the forward input size.
      groups, data_format, filter_format: as in :func:`convolution`.
      precision, preferred_element_type: as in :func:`convolution`.
      lowering: {LOWERING}

    Returns:
      ``dW`` with shape ``filter_shape``, in ``filter_format``.

    Raises:
      ValueError: ``output_delta``'s spatial shape is not the forward output
        size; channels do not match ``filter_shape`` or ``groups``; bad ranks,
        lengths or values.
      TypeError: non-array inputs, traced ``filter_shape``, mismatched dtypes.

    Example:
      >>> import jax, jax.numpy as jnp, jaxconv
      >>> x = jnp.ones((2, 8, 8, 4)); dy = jnp.ones((2, 4, 4, 6))
      >>> dw = jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 6), strides=2,
      ...                                           auto_pad="same_upper")
      >>> dw.shape
      (3, 3, 4, 6)
      >>> ref = jax.vjp(lambda w: jaxconv.convolution(x, w, strides=2, auto_pad="same_upper"),
      ...               jnp.zeros((3, 3, 4, 6)))[1](dy)[0]
      >>> bool(jnp.allclose(dw, ref))
      True
    """
    return weight_gradient(
        "convolution_backprop_filters", _FILTERS_NAMES, input_forward, output_delta,
        filter_shape, precision, preferred_element_type, lowering=lowering, strides=strides,
        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, auto_pad=auto_pad,
        groups=groups, data_format=data_format, filter_format=filter_format,
    )


_WEIGHTS_NAMES = Names(
    x="src", y="diff_dst", w_shape="weights_shape", w_format="weights_format"
)


@document_lowering(Kernel.WEIGHT)
def convolution_backward_weights(
    src: ArrayLike,
    diff_dst: ArrayLike,
    weights_shape: ShapeLike | None = None,
    *,
    strides: IntOrSeq = None,
    pads_begin: IntOrSeq = None,
    pads_end: IntOrSeq = None,
    dilations: IntOrSeq = None,
    auto_pad: AutoPad = "none",
    groups: int = 1,
    data_format: DataFormat = "NXC",
    weights_format: ConvolutionFilterFormat = "XIO",
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    lowering: WeightGradLowering = "auto",
) -> jax.Array:
    r"""oneDNN ConvolutionBackwardWeights: :func:`convolution_backprop_filters` under oneDNN's current names.

    ``src`` = ``input_forward``, ``diff_dst`` = ``output_delta``,
    ``weights_shape`` = ``filter_shape``, ``weights_format`` = ``filter_format``.
    Same math, same lowering, errors in these names:

    .. math::
        dW[g \cdot OC_g + oc, ic, k] = \sum_{n, t} src[n, g \cdot IC_g + ic, tS + kD - p_b]
        \, diff\_dst[n, g \cdot OC_g + oc, t]

    Layouts: ``src`` and ``diff_dst`` in ``data_format`` (NXC or NCX); the
    result in ``weights_format``, XIO ``(*K, IC/g, OC)`` or OIX ``(OC, IC/g, *K)``.

    Args:
      src: the forward input, in ``data_format``.
      diff_dst: the gradient w.r.t. the forward output.
      weights_shape: the full weights shape in ``weights_format`` (required).
      strides, pads_begin, pads_end, dilations, auto_pad: as in :func:`convolution`.
      groups, data_format: as in :func:`convolution`.
      precision, preferred_element_type: as in :func:`convolution`.
      lowering: {LOWERING}
      weights_format: ``"XIO"`` (default) or ``"OIX"``.

    Returns:
      ``diff_weights`` with shape ``weights_shape``.

    Raises:
      ValueError: as :func:`convolution_backprop_filters`.
      TypeError: as :func:`convolution_backprop_filters`.

    Example:
      >>> import jax.numpy as jnp, jaxconv
      >>> src = jnp.ones((1, 3, 5, 5)); diff_dst = jnp.ones((1, 2, 5, 5))
      >>> jaxconv.convolution_backward_weights(src, diff_dst, (2, 3, 3, 3), auto_pad="SAME_UPPER",
      ...     data_format="NCX", weights_format="OIX")[0, 0]
      Array([[16., 20., 16.],
             [20., 25., 20.],
             [16., 20., 16.]], dtype=float32)
    """
    return weight_gradient(
        "convolution_backward_weights", _WEIGHTS_NAMES, src, diff_dst, weights_shape,
        precision, preferred_element_type, lowering=lowering, strides=strides,
        pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, auto_pad=auto_pad,
        groups=groups, data_format=data_format, filter_format=weights_format,
    )

