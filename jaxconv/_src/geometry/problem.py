"""The resolved problem every op hands to its kernel, and the checks every family shares.

:class:`ConvProblem` states a problem in the roles of the forward convolution
``y = conv(x, W)``; each family's builder (``convolution.py``,
``conv_transpose.py`` here, ``tbe_geometry.py`` beside the TBE op) validates
its arguments and returns one. :func:`common_attributes` reads the attributes
all of them share.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jax import lax

from jaxconv._src.geometry.arguments import check_groups, int_tuple, spatial_rank
from jaxconv._src.geometry.layouts import (
    DataLayout,
    FilterLayout,
    data_layout,
    filter_layout,
)
from jaxconv._src.geometry.padding import AutoPadMode, canonical_auto_pad, dilated_kernel_size


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """A fully resolved convolution, in the roles of the *forward convolution*.

    ``x`` (the convolution input) has ``in_channels`` channels and spatial size
    ``input_size``; ``y`` (its output) has ``out_channels`` and ``output_size``.
    The filter, in ``filter_layout``, holds ``out_channels`` on its O-role axis
    and ``in_channels // groups`` on its I-role axis. ``filter_swap`` says that
    the filter's letters name the roles the other way round (ConvTranspose
    weights, whose I letter is the transposed op's input = our ``y``).

    Pads may be negative here (a crop), which the public attributes never are:
    a ConvTranspose ``output_shape`` larger than the full result maps onto a
    convolution with a negative end pad.
    """

    #: the op that built the problem (for messages); not part of equality or the hash, so
    #: that alias ops (convolution_backprop_filters / convolution_backward_weights) share
    #: one compiled program
    op: str = dataclasses.field(compare=False)
    rank: int
    data: DataLayout
    filter_layout: FilterLayout
    filter_swap: bool
    batch: int
    in_channels: int
    out_channels: int
    groups: int
    input_size: tuple[int, ...]
    output_size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    @property
    def dilated_kernel(self) -> tuple[int, ...]:
        return tuple(dilated_kernel_size(k, d) for k, d in zip(self.kernel, self.dilations))

    @property
    def whole_window(self) -> bool:
        """One window over the whole (padded) input: every output extent 1, more than one tap
        (a classifier head written as a convolution; benchdnn's 3d_conv_large_shape)."""
        return all(o == 1 for o in self.output_size) and math.prod(self.kernel) > 1

    @property
    def one_input_position(self) -> bool:
        """Every input extent 1 and more than one output position: each output position reads
        at most one tap of the filter (a generator's first layer, a vector projected onto an
        image by a transposed convolution)."""
        return all(i == 1 for i in self.input_size) and math.prod(self.output_size) > 1

    @property
    def remainder(self) -> tuple[int, ...]:
        """Trailing padded-input elements the forward convolution never reads."""
        return tuple(
            (i + pb + pe - dk) % s
            for i, pb, pe, dk, s in zip(
                self.input_size, self.pads_begin, self.pads_end, self.dilated_kernel, self.strides
            )
        )

    @property
    def fit_pads(self) -> tuple[tuple[int, int], ...]:
        """(pb, pe - rem) per axis: the padded input then fits the windows exactly."""
        return tuple(
            (pb, pe - r) for pb, pe, r in zip(self.pads_begin, self.pads_end, self.remainder)
        )

    @property
    def padding_only_outputs(self) -> tuple[tuple[int, int], ...]:
        """Per axis, how many leading and trailing output positions have their whole window in
        the padding: their y is zero, and their dy reaches neither dx nor the weight gradient.

        Output o's window covers padded-input positions [o*S, o*S + DK - 1] and x occupies
        [pb, pb + I - 1]: it misses x on the left while o*S + DK - 1 < pb, on the right from
        o*S > pb + I - 1 on (a 1x1 kernel with pads, or pads past the dilated kernel). A dilated
        window whose span straddles x with no tap on it is not counted (kept, which is exact).
        """
        out = []
        for i, o, s, dk, pb in zip(self.input_size, self.output_size, self.strides,
                                   self.dilated_kernel, self.pads_begin):
            lead = min(o, max(0, -((dk - 1 - pb) // s)))  # ceil((pb - dk + 1) / s)
            trail = min(o - lead, max(0, o - ((pb + i - 1) // s + 1)))
            out.append((lead, trail))
        return tuple(out)

    def without_padding_only_outputs(self) -> ConvProblem:
        """The problem on the output positions whose windows read x (``padding_only_outputs``
        removed): pads reduced by a stride per position (the end pad may become negative: x's
        tail no remaining window reads); the output extent 0 where every window misses x."""
        cut = self.padding_only_outputs
        return dataclasses.replace(
            self,
            output_size=tuple(o - lo - hi for o, (lo, hi) in zip(self.output_size, cut)),
            pads_begin=tuple(pb - lo * s for pb, (lo, _), s in zip(self.pads_begin, cut,
                                                                   self.strides)),
            pads_end=tuple(pe - hi * s for pe, (_, hi), s in zip(self.pads_end, cut, self.strides)))

    @property
    def x_shape(self) -> tuple[int, ...]:
        return self.data.shape(self.batch, self.in_channels, self.input_size)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return self.data.shape(self.batch, self.out_channels, self.output_size)

    @property
    def filter_shape(self) -> tuple[int, ...]:
        o, i = self.out_channels, self.in_channels // self.groups
        if self.filter_swap:
            o, i = i, o
        return self.filter_layout.shape(o, i, self.kernel)

    def dimension_numbers(self) -> lax.ConvDimensionNumbers:
        """The forward convolution's dimension numbers (x, filter -> y)."""
        spec = self.data.spec
        return lax.ConvDimensionNumbers(spec, self.filter_layout.spec(swap=self.filter_swap), spec)


@dataclasses.dataclass(frozen=True)
class Names:
    """The argument names an op uses, so that its errors speak its language."""

    x: str = "input"
    y: str = "output_delta"
    w_shape: str = "filter_shape"
    w_format: str = "filter_format"
    x_shape: str = "input_shape"
    #: the op's word for "use pads_begin / pads_end" ("explicit" in OpenVINO's ops)
    explicit_pad: str = "none"
    #: whether the caller chooses data_format and the filter format (error hints)
    layout_arguments: bool = True


def check_divisible(op: str, names: Names, groups: int, in_channels: int,
                     out_channels: int) -> None:
    """Both channel counts must be multiples of ``groups``."""
    if in_channels % groups:
        raise ValueError(
            f"{op}: the {names.x} channels ({in_channels}) must be divisible by groups ({groups})"
        )
    if out_channels % groups:
        raise ValueError(
            f"{op}: the output channels ({out_channels}) must be divisible by groups ({groups})"
        )


def check_channels(
    op: str, names: Names, groups: int, in_channels: int, out_channels: int,
    filter_o: int, filter_i: int, filter_shape: tuple[int, ...], w_format: str,
) -> None:
    """Divisible channels, and a filter holding O = out_channels, I = in_channels / groups."""
    check_divisible(op, names, groups, in_channels, out_channels)
    if filter_o != out_channels or filter_i != in_channels // groups:
        raise ValueError(
            f"{op}: {names.w_shape} {list(filter_shape)} in {w_format} format holds "
            f"O={filter_o}, I={filter_i}; expected O={out_channels} (output channels) and "
            f"I={in_channels // groups} ({names.x} channels {in_channels} / groups {groups})"
        )


@dataclasses.dataclass(frozen=True)
class Attributes:
    """The attributes every convolution-like op shares, validated; pads as given."""

    rank: int
    data: DataLayout
    filter: FilterLayout
    groups: int
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    auto_pad: AutoPadMode


def common_attributes(
    op: str, names: Names, x_shape: tuple[int, ...] | None, y_shape: tuple[int, ...] | None,
    w_shape: tuple[int, ...], data_format: Any, filter_format: Any,
    filter_formats: tuple[str, ...], groups: Any, strides: Any, dilations: Any, pads_begin: Any,
    pads_end: Any, auto_pad: Any,
) -> Attributes:
    """Ranks, layouts and the shared attributes of one call, validated in argument order."""
    ref_name, ref_shape = (names.x, x_shape) if x_shape is not None else (names.y, y_shape)
    if ref_shape is None:
        raise ValueError(f"{op}: neither {names.x} nor {names.y} has a shape")
    n = spatial_rank(op, ref_name, len(ref_shape))
    for name, shape in ((names.x, x_shape), (names.y, y_shape)):
        if shape is not None and len(shape) != n + 2:
            raise ValueError(
                f"{op}: {name} must have rank {n + 2} like {ref_name}, got rank {len(shape)} "
                f"(shape {list(shape)})"
            )
    if len(w_shape) != n + 2:
        raise ValueError(
            f"{op}: {names.w_shape} must have {n + 2} entries for {n} spatial axes, got "
            f"{len(w_shape)}: {list(w_shape)}"
        )
    wl = filter_layout(op, names.w_format, filter_format, n, filter_formats)
    # Zero channels are a valid (empty) problem; a zero kernel extent is not.
    if any(v < 0 for v in w_shape) or any(w_shape[a] <= 0 for a in wl.spatial_axes):
        raise ValueError(f"{op}: {names.w_shape} must be positive on its kernel axes (and "
                         f"non-negative on its channel axes), got {list(w_shape)}")
    return Attributes(
        rank=n,
        data=data_layout(op, "data_format", data_format, n),
        filter=wl,
        groups=check_groups(op, groups),
        strides=int_tuple(op, "strides", strides, n, default=1, minimum=1),
        dilations=int_tuple(op, "dilations", dilations, n, default=1, minimum=1),
        pads_begin=int_tuple(op, "pads_begin", pads_begin, n, default=0, minimum=0),
        pads_end=int_tuple(op, "pads_end", pads_end, n, default=0, minimum=0),
        auto_pad=canonical_auto_pad(op, auto_pad, names.explicit_pad),
    )
