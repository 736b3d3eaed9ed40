"""The geometry of the Ascend TBE ``conv2d_backprop_filter``: 5HD shapes, filter sizes, para_dict.

5HD tensors are ``(N, C1, H, W, C0)`` with ``C0 = 16`` (the one definition of
C0, used by ``tbe_layouts`` too); the problem is stated as the NCHW/OIHW
convolution of the unpacked data, so padded channel slots never take part.
"""

from __future__ import annotations

from typing import Any

from jaxconv._src.geometry import (
    ConvProblem,
    Names,
    check_groups,
    convolution_problem,
    int_tuple,
    static_shape,
)

#: The channel block of the 5HD and FRACTAL_Z layouts.
C0 = 16

def tbe_filter_sizes(op: str, filter_sizes: Any, groups: Any) -> tuple[tuple[int, ...], int]:
    """``(Cout, Cin/groups, KH, KW)`` as ints, and the groups, validated."""
    sizes = static_shape(op, "filter_sizes", filter_sizes)
    if len(sizes) != 4 or min(sizes) <= 0:
        raise ValueError(f"{op}: filter_sizes must be 4 positive ints (Cout, Cin/groups, KH, KW), "
                         f"got {list(sizes)}")
    g = check_groups(op, groups)
    if sizes[0] % g:
        raise ValueError(f"{op}: Cout = filter_sizes[0] = {sizes[0]} must be divisible by groups "
                         f"({g})")
    return sizes, g


def tbe_problem(
    op: str,
    *,
    x5_shape: tuple[int, ...],
    dy5_shape: tuple[int, ...],
    filter_sizes: Any,
    strides: Any,
    padding: Any,
    dilations: Any,
    groups: Any,
) -> ConvProblem:
    """Validates a 5HD weight-gradient call; returns the NCHW/OIHW ConvProblem."""
    names = Names(x="input_x", y="out_backprop", w_shape="filter_sizes", w_format="OIHW",
                  layout_arguments=False)
    for name, shape in (("input_x", x5_shape), ("out_backprop", dy5_shape)):
        if len(shape) != 5:
            raise ValueError(f"{op}: {name} must be 5HD (N, C1, H, W, C0), got rank {len(shape)} "
                             f"(shape {list(shape)})")
        if shape[4] != C0:
            raise ValueError(f"{op}: {name} must have C0 = {C0} (its last axis), got C0 = "
                             f"{shape[4]} (shape {list(shape)})")
    sizes, g = tbe_filter_sizes(op, filter_sizes, groups)
    cout, cin_g, _, _ = sizes
    cin = cin_g * g
    for name, shape, c in (("input_x", x5_shape, cin), ("out_backprop", dy5_shape, cout)):
        if shape[1] != -(-c // C0):
            what = f"groups * Cin/groups = {g} * {cin_g}" if name == "input_x" else "Cout"
            raise ValueError(
                f"{op}: {name} C1 must be ceil({what} = {c} / 16) = {-(-c // C0)}, got C1 = "
                f"{shape[1]} (shape {list(shape)})")
    s = int_tuple(op, "para_dict['strides']", strides, 2, default=1, minimum=1)
    pads = int_tuple(op, "para_dict['padding']", padding, 4, default=0, minimum=0)
    dil = int_tuple(op, "para_dict['dilations']", dilations, 4, default=1, minimum=1)
    if dil[:2] != (1, 1):
        raise ValueError(f"{op}: para_dict['dilations'] must be [1, 1, dH, dW] (N and C "
                         f"entries 1), got {list(dil)}")
    n, _, h, w, _ = x5_shape
    return convolution_problem(
        op, names, x_shape=(n, cin, h, w),
        y_shape=(dy5_shape[0], cout, dy5_shape[2], dy5_shape[3]), w_shape=sizes, strides=s,
        pads_begin=(pads[0], pads[2]), pads_end=(pads[1], pads[3]), dilations=dil[2:],
        auto_pad="explicit", groups=g, data_format="NCX", filter_format="OIX")
