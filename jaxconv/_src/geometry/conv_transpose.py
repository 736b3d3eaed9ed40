"""The problem of a ConvTranspose (oneDNN ConvTranspose family, OpenVINO backprop-data ops).

A ConvTranspose with input x (IC channels, size I) and output y (OC, size O)
is the adjoint of the convolution y -> x. Its weights name the roles with the
transposed op's letters: I = IC (full count), O = OC / groups. So the
ConvProblem built here is that convolution's: in_channels = OC, out_channels =
IC, input_size = O, output_size = I, filter_swap = True::

    O = S * (I - 1) + DK - pb - pe + output_padding          (no output_shape)
    y[o] = full[o + pb], o in [0, O)                          (with output_shape)

where full is the un-padded result of length S * (I - 1) + DK, zero past its
end. Both read as the convolution with pads (pb, pe') for the exact fit
``pe' = S * (I - 1) + DK - pb - O``, negative when O reaches past the end of
full (a crop of the conv input, i.e. zeros in the transposed output).
"""

from __future__ import annotations

import functools
from typing import Any

from jaxconv._src.geometry.arguments import int_tuple, static_shape
from jaxconv._src.geometry.hints import with_layout_hint
from jaxconv._src.geometry.layouts import CONV_TRANSPOSE_FILTER_FORMATS
from jaxconv._src.geometry.padding import (
    PadRule,
    TransposePadRule,
    auto_pads,
    conv_transpose_output_size,
    conv_transpose_pads,
    dilated_kernel_size,
)
from jaxconv._src.geometry.problem import (
    Attributes,
    ConvProblem,
    Names,
    check_divisible,
    common_attributes,
)


def _output_shape(op: str, value: Any, n: int) -> tuple[int, ...] | None:
    """The optional ``output_shape`` (spatial sizes), validated."""
    if value is None:
        return None
    out_shape = static_shape(op, "output_shape", value)
    if len(out_shape) != n:
        raise ValueError(
            f"{op}: output_shape must hold the {n} spatial output sizes, got "
            f"{len(out_shape)}: {list(out_shape)}"
        )
    if any(v < 0 for v in out_shape):
        raise ValueError(f"{op}: output_shape must be non-negative, got {list(out_shape)}")
    return out_shape


def _channels(
    op: str, names: Names, a: Attributes, x_shape: tuple[int, ...] | None,
    y_shape: tuple[int, ...] | None, w_shape: tuple[int, ...],
) -> tuple[int, int, int]:
    """(batch, in_channels, out_channels) of the ConvTranspose, checked against the weights.

    Channels and batch come first: a weights shape in the wrong format is reported as such.
    """
    w_o, w_i, _ = a.filter.split(w_shape)  # I letter: IC (full); O letter: OC / groups
    g = a.groups
    batch = -1
    if x_shape is not None:
        batch, in_channels, _ = a.data.split(x_shape)
    else:
        in_channels = w_i
    if y_shape is not None:
        y_batch, out_channels, _ = a.data.split(y_shape)
        if x_shape is not None and y_batch != batch:
            raise ValueError(
                f"{op}: {names.x} and {names.y} must have the same batch size, got "
                f"{batch} and {y_batch}"
            )
        batch = y_batch
    else:
        out_channels = w_o * g
    check_divisible(op, names, g, in_channels, out_channels)
    if w_i != in_channels or w_o != out_channels // g:
        raise ValueError(
            f"{op}: {names.w_shape} {list(w_shape)} in {a.filter.format} format holds I={w_i}, "
            f"O={w_o}; expected I={in_channels} ({names.x} channels, the full count) and "
            f"O={out_channels // g} (output channels {out_channels} / groups {g})"
        )
    return batch, in_channels, out_channels


def _forward_sizes(
    op: str, names: Names, a: Attributes, in_size: tuple[int, ...], kernel: tuple[int, ...],
    opad: tuple[int, ...], out_shape: tuple[int, ...] | None, y_size: tuple[int, ...] | None,
    pad_rule: TransposePadRule, upper_extra_at_end: bool,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(pads_begin, pads_end, output size) from the ConvTranspose input size."""
    s, d = a.strides, a.dilations
    pb, pe = conv_transpose_pads(a.auto_pad, pad_rule, in_size, kernel, s, d, a.pads_begin,
                                 a.pads_end, opad, out_shape, upper_extra_at_end)
    if out_shape is not None:
        out_size = out_shape
    else:
        out_size = tuple(conv_transpose_output_size(i, k, st, dl, b, e, o) for
                         i, k, st, dl, b, e, o in zip(in_size, kernel, s, d, pb, pe, opad))
        if any(o < 0 for o in out_size):
            raise ValueError(
                f"{op}: the pads remove more than the whole output: the ConvTranspose output "
                f"size rule S*(I-1)+DK-pb-pe+output_padding gives {list(out_size)}, and a size "
                f"cannot be negative (0, an empty output, is allowed; I {list(in_size)}, "
                f"pads_begin {list(pb)}, pads_end {list(pe)})"
            )
    if y_size is not None and y_size != out_size:
        raise ValueError(
            f"{op}: {names.y} spatial shape must equal the ConvTranspose output size "
            f"{list(out_size)} (S*(I-1)+DK-pb-pe+output_padding from {names.x} spatial "
            f"{list(in_size)}, kernel {list(kernel)}, strides {list(s)}, dilations "
            f"{list(d)}, pads_begin {list(pb)}, pads_end {list(pe)}, output_padding "
            f"{list(opad)}), got {list(y_size)}"
        )
    return pb, pe, out_size


def _solve_input_size(
    op: str, names: Names, a: Attributes, out_size: tuple[int, ...], kernel: tuple[int, ...],
    opad: tuple[int, ...],
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(pads_begin, pads_end, input size): solves O = S*(I-1) + DK - pb - pe + output_padding."""
    s, d = a.strides, a.dilations
    pb, pe = auto_pads(a.auto_pad, PadRule.DECONV, out_size, kernel, s, d, a.pads_begin,
                       a.pads_end)
    sizes = []
    for o, st, k, dl, b, e, opd in zip(out_size, s, kernel, d, pb, pe, opad):
        k_d = dilated_kernel_size(k, dl)
        span = o - k_d + b + e - opd
        if span < -st or span % st:  # span = -S: a zero-size ConvTranspose input
            lo = max(-1, span // st)  # I - 1 >= -1
            near = sorted({v for i in (lo, lo + 1)
                           if (v := st * i + k_d - b - e + opd) >= 0} - {o})
            raise ValueError(
                f"{op}: {names.y} spatial shape {list(out_size)} is not a ConvTranspose "
                f"output size for kernel {list(kernel)}, strides {list(s)}, dilations "
                f"{list(d)}, pads_begin {list(pb)}, pads_end {list(pe)}, output_padding "
                f"{list(opad)}: need (O - DK + pb + pe - output_padding) to be a "
                f"multiple of the stride, at least -S (nearest valid sizes {near})"
            )
        sizes.append(span // st + 1)
    return pb, pe, tuple(sizes)


def conv_transpose_problem(op: str, names: Names, **kwargs: Any) -> ConvProblem:
    """Validates and resolves a ConvTranspose (forward or gradient) as a ConvProblem.

    The arguments are those of :func:`_conv_transpose_problem`; an error the
    shapes would not raise under other layouts names those layouts.
    """
    return with_layout_hint(functools.partial(_conv_transpose_problem, op, names), names,
                            CONV_TRANSPOSE_FILTER_FORMATS, **kwargs)


def _conv_transpose_problem(
    op: str,
    names: Names,
    *,
    x_shape: tuple[int, ...] | None,
    y_shape: tuple[int, ...] | None,
    w_shape: tuple[int, ...],
    output_shape: Any = None,
    strides: Any,
    pads_begin: Any,
    pads_end: Any,
    dilations: Any,
    auto_pad: Any,
    output_padding: Any,
    groups: Any,
    data_format: Any,
    filter_format: Any,
    pad_rule: TransposePadRule = TransposePadRule.ONEDNN,
    upper_extra_at_end: bool = True,
) -> ConvProblem:
    """The checks and resolution of :func:`conv_transpose_problem`.

    ``x_shape`` is the ConvTranspose input, ``y_shape`` its output (the
    gradient ops' ``diff_dst``). The forward gets x, w and optionally
    ``output_shape``; backward data gets y and w (x's size is solved for);
    backward weights gets x, y and w. ``pad_rule`` picks oneDNN's or OpenVINO's
    auto_pad rules (OpenVINO also lets output_padding reach the stride:
    the extra elements are zeros).
    """
    a = common_attributes(
        op, names, x_shape, y_shape, w_shape, data_format, filter_format,
        CONV_TRANSPOSE_FILTER_FORMATS, groups, strides, dilations, pads_begin, pads_end, auto_pad)
    n, s, d = a.rank, a.strides, a.dilations
    opad = int_tuple(op, "output_padding", output_padding, n, default=0, minimum=0)
    if pad_rule is TransposePadRule.ONEDNN and any(o >= st for o, st in zip(opad, s)):
        raise ValueError(
            f"{op}: output_padding must be smaller than the stride on every axis, got "
            f"output_padding {list(opad)} with strides {list(s)}"
        )
    out_shape = _output_shape(op, output_shape, n)
    kernel = a.filter.split(w_shape)[2]
    batch, in_channels, out_channels = _channels(op, names, a, x_shape, y_shape, w_shape)
    y_size = a.data.split(y_shape)[2] if y_shape is not None else None
    if x_shape is not None:
        in_size = a.data.split(x_shape)[2]
        pb, _, out_size = _forward_sizes(op, names, a, in_size, kernel, opad, out_shape, y_size,
                                         pad_rule, upper_extra_at_end)
    else:
        assert y_size is not None  # the backward-data op has dy
        out_size = y_size
        pb, _, in_size = _solve_input_size(op, names, a, out_size, kernel, opad)

    # The convolution this ConvTranspose transposes, fitted exactly.
    conv_pe = tuple(st * (i - 1) + dilated_kernel_size(k, dl) - b - o
                    for st, i, k, dl, b, o in zip(s, in_size, kernel, d, pb, out_size))
    return ConvProblem(
        op=op, rank=n, data=a.data, filter_layout=a.filter, filter_swap=True, batch=batch,
        in_channels=out_channels, out_channels=in_channels, groups=a.groups,
        input_size=tuple(out_size), output_size=tuple(in_size), kernel=kernel, strides=s,
        dilations=d, pads_begin=pb, pads_end=conv_pe,
    )
