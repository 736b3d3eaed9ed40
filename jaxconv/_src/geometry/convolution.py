"""The problem of a oneDNN-style convolution: forward, data gradient, weight gradient.

Also the base of the OpenVINO GroupConvolution and the Ascend TBE weight
gradient, which state their problems as this one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from jaxconv._src.geometry.arguments import static_shape
from jaxconv._src.geometry.hints import with_layout_hint
from jaxconv._src.geometry.layouts import CONVOLUTION_FILTER_FORMATS, DataLayout
from jaxconv._src.geometry.padding import (
    PadRule,
    SizeRule,
    auto_pads,
    conv_output_size,
    dilated_kernel_size,
)
from jaxconv._src.geometry.problem import (
    ConvProblem,
    Names,
    check_channels,
    common_attributes,
)


def convolution_problem(
    op: str,
    names: Names,
    *,
    filter_formats: Sequence[str] = CONVOLUTION_FILTER_FORMATS,
    **kwargs: Any,
) -> ConvProblem:
    """Validates and resolves a oneDNN-style convolution, forward or gradient.

    The arguments are those of :func:`_convolution_problem`; an error the
    shapes would not raise under other layouts names those layouts.
    """
    return with_layout_hint(functools.partial(_convolution_problem, op, names,
                                              filter_formats=filter_formats),
                            names, filter_formats, **kwargs)


def _convolution_problem(
    op: str,
    names: Names,
    *,
    x_shape: tuple[int, ...] | None,
    y_shape: tuple[int, ...] | None,
    w_shape: tuple[int, ...],
    strides: Any,
    pads_begin: Any,
    pads_end: Any,
    dilations: Any,
    auto_pad: Any,
    groups: Any,
    data_format: Any,
    filter_format: Any,
    filter_formats: Sequence[str] = CONVOLUTION_FILTER_FORMATS,
    size_rule: SizeRule = SizeRule.ONEDNN,
) -> ConvProblem:
    """The checks and resolution of :func:`convolution_problem`.

    Exactly the shapes the op has are given: forward gets ``x_shape`` and
    ``w_shape``; the data gradient ``y_shape``, ``w_shape`` and ``x_shape``
    (the forward input's full shape); the weight gradient ``x_shape``,
    ``y_shape`` and ``w_shape``. ``y_shape``, when given, must equal the forward
    output shape. ``size_rule`` says which empty outputs the op's family allows.
    """
    a = common_attributes(
        op, names, x_shape, y_shape, w_shape, data_format, filter_format, tuple(filter_formats),
        groups, strides, dilations, pads_begin, pads_end, auto_pad)
    layout, wl, g, s, d = a.data, a.filter, a.groups, a.strides, a.dilations

    filter_o, filter_i, kernel = wl.split(w_shape)
    if x_shape is None:
        raise ValueError(f"{op}: the forward input shape is required (every convolution op "
                         f"knows it)")
    batch, in_channels, in_size = layout.split(x_shape)
    if y_shape is not None:
        y_batch, out_channels, out_given = layout.split(y_shape)
        if y_batch != batch:
            raise ValueError(
                f"{op}: {names.x} and {names.y} must have the same batch size, got "
                f"{batch} and {y_batch}"
            )
    else:
        out_channels, out_given = filter_o, None
    check_channels(op, names, g, in_channels, out_channels, filter_o, filter_i, w_shape, wl.format)

    pb, pe = auto_pads(a.auto_pad, PadRule.CONV, in_size, kernel, s, d, a.pads_begin, a.pads_end)
    out_size = tuple(
        conv_output_size(i, k, st, dl, b, e)
        for i, k, st, dl, b, e in zip(in_size, kernel, s, d, pb, pe)
    )
    _check_output_size(op, names, size_rule, in_size, kernel, s, d, pb, pe, out_size)
    if out_given is not None and out_given != out_size:
        raise ValueError(
            f"{op}: {names.y} spatial shape must equal the forward output size "
            f"{list(out_size)} (from {names.x} spatial {list(in_size)}, kernel {list(kernel)}, "
            f"strides {list(s)}, dilations {list(d)}, pads_begin {list(pb)}, pads_end "
            f"{list(pe)}), got {list(out_given)}"
        )
    return ConvProblem(
        op=op, rank=a.rank, data=layout, filter_layout=wl, filter_swap=False, batch=batch,
        in_channels=in_channels, out_channels=out_channels, groups=g, input_size=in_size,
        output_size=out_size, kernel=kernel, strides=s, dilations=d, pads_begin=pb, pads_end=pe,
    )


def _check_output_size(
    op: str, names: Names, rule: SizeRule, in_size: tuple[int, ...], kernel: tuple[int, ...],
    strides: tuple[int, ...], dilations: tuple[int, ...], pb: tuple[int, ...],
    pe: tuple[int, ...], out_size: tuple[int, ...],
) -> None:
    """Raises where the family's specification has no output for the kernel on this input.

    oneDNN: O = floor((I + pb + pe - DK) / S) + 1 may be 0 (an empty output), never
    negative. OpenVINO: the dilated kernel must fit in the padded data (O >= 1).
    """
    dk = [dilated_kernel_size(k, dl) for k, dl in zip(kernel, dilations)]
    padded = [i + b + e for i, b, e in zip(in_size, pb, pe)]
    where = (f"(spatial {list(in_size)}, pads_begin {list(pb)}, pads_end {list(pe)}, "
             f"strides {list(strides)})")
    if rule is SizeRule.OPENVINO and any(k > v for k, v in zip(dk, padded)):
        raise ValueError(
            f"{op}: the dilated kernel {dk} is larger than the padded {names.x} {padded} "
            f"{where}: OpenVINO's Convolution shape rule requires the kernel after dilation "
            f"to fit in the data shape after padding"
        )
    if any(o < 0 for o in out_size):
        raise ValueError(
            f"{op}: the dilated kernel {dk} is larger than the padded {names.x} {padded} "
            f"{where} by more than a stride: oneDNN's output size rule "
            f"O = floor((I + pb + pe - DK) / S) + 1 gives {list(out_size)}, and a size cannot "
            f"be negative (O = 0, an empty output, is allowed)"
        )


def full_input_shape(
    op: str, names: Names, value: Any, y_shape: tuple[int, ...], layout: DataLayout,
    in_channels: int,
) -> tuple[int, ...]:
    """The forward input's full shape from an ``input_shape`` argument.

    ``value`` holds either the spatial sizes only, or the full shape in
    data_format order (whose batch must match ``y_shape``).
    """
    shape = static_shape(op, names.x_shape, value)
    n = len(y_shape) - 2
    batch = y_shape[layout.batch_axis]
    if len(shape) == n:
        return layout.shape(batch, in_channels, shape)
    if len(shape) == n + 2:
        b, c, _ = layout.split(shape)
        if b != batch:
            raise ValueError(
                f"{op}: {names.x_shape} {list(shape)} has batch {b}, but {names.y} has batch {batch}"
            )
        if c != in_channels:
            raise ValueError(
                f"{op}: {names.x_shape} {list(shape)} has {c} channels in {layout.format} order; "
                f"the filter and groups give {in_channels}"
            )
        return shape
    raise ValueError(
        f"{op}: {names.x_shape} must hold {n} spatial sizes or the full {n + 2}-entry shape, "
        f"got {len(shape)} entries: {list(shape)}"
    )

