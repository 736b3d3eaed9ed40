"""Data and filter layouts: format strings read letter by letter.

``N``/``C``/``X`` for data (``X`` = all spatial axes, in order), ``O``/``I``/``X``
for filters. They become ``lax.ConvDimensionNumbers``; no data is transposed to
honour a layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from jaxconv._src.geometry.arguments import kind

DataFormat = Literal["NXC", "NCX"]
ConvolutionFilterFormat = Literal["XIO", "OIX"]
ConvTransposeFilterFormat = Literal["IOX", "XOI", "OIX", "XIO"]

DATA_FORMATS: tuple[DataFormat, ...] = ("NXC", "NCX")
CONVOLUTION_FILTER_FORMATS: tuple[ConvolutionFilterFormat, ...] = ("XIO", "OIX")
CONV_TRANSPOSE_FILTER_FORMATS: tuple[ConvTransposeFilterFormat, ...] = ("IOX", "XOI", "OIX", "XIO")


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """Where the batch, channel and spatial axes of a data tensor are."""

    format: str
    batch_axis: int
    channel_axis: int
    spatial_axes: tuple[int, ...]

    @property
    def spec(self) -> tuple[int, ...]:
        """(batch, feature, *spatial): the lhs/out part of ConvDimensionNumbers."""
        return (self.batch_axis, self.channel_axis, *self.spatial_axes)

    def shape(self, batch: int, channels: int, spatial: Sequence[int]) -> tuple[int, ...]:
        out = [0] * (len(spatial) + 2)
        out[self.batch_axis] = batch
        out[self.channel_axis] = channels
        for ax, v in zip(self.spatial_axes, spatial):
            out[ax] = v
        return tuple(out)

    def split(self, shape: Sequence[int]) -> tuple[int, int, tuple[int, ...]]:
        """(batch, channels, spatial sizes) of a shape in this layout."""
        return (
            shape[self.batch_axis],
            shape[self.channel_axis],
            tuple(shape[a] for a in self.spatial_axes),
        )


@dataclasses.dataclass(frozen=True)
class FilterLayout:
    """Where the O, I and spatial axes of a filter are, read from its letters."""

    format: str
    o_axis: int
    i_axis: int
    spatial_axes: tuple[int, ...]

    def spec(self, *, swap: bool = False) -> tuple[int, ...]:
        """(out-feature, in-feature, *spatial) for ConvDimensionNumbers.

        ``swap=True`` reads the I letter as the convolution's output feature,
        as a ConvTranspose weight is the filter of the convolution it transposes.
        """
        o, i = (self.i_axis, self.o_axis) if swap else (self.o_axis, self.i_axis)
        return (o, i, *self.spatial_axes)

    def shape(self, o: int, i: int, spatial: Sequence[int]) -> tuple[int, ...]:
        out = [0] * (len(spatial) + 2)
        out[self.o_axis] = o
        out[self.i_axis] = i
        for ax, v in zip(self.spatial_axes, spatial):
            out[ax] = v
        return tuple(out)

    def split(self, shape: Sequence[int]) -> tuple[int, int, tuple[int, ...]]:
        """(O size, I size, kernel sizes) of a shape in this layout."""
        return shape[self.o_axis], shape[self.i_axis], tuple(shape[a] for a in self.spatial_axes)


def _parse_letters(op: str, name: str, fmt: Any, n: int, letters: str,
                   allowed: Sequence[str]) -> tuple[str, dict[str, Any]]:
    if not isinstance(fmt, str):
        raise TypeError(f"{op}: {name} must be a string, got {kind(fmt)}")
    upper = fmt.upper()
    if upper not in allowed:
        raise ValueError(f"{op}: {name} must be one of {', '.join(map(repr, allowed))}, got {fmt!r}")
    axes: dict[str, Any] = {}
    pos = 0
    for letter in upper:
        if letter == "X":
            axes["X"] = tuple(range(pos, pos + n))
            pos += n
        else:
            axes[letter] = pos
            pos += 1
    return upper, axes


def data_layout(op: str, name: str, fmt: Any, n: int) -> DataLayout:
    """Parses a data format ("NXC" or "NCX") for ``n`` spatial axes."""
    upper, axes = _parse_letters(op, name, fmt, n, "NC", DATA_FORMATS)
    return DataLayout(upper, axes["N"], axes["C"], axes["X"])


def filter_layout(op: str, name: str, fmt: Any, n: int, allowed: Sequence[str]) -> FilterLayout:
    """Parses a filter format (a permutation of "O", "I", "X") for ``n`` spatial axes."""
    upper, axes = _parse_letters(op, name, fmt, n, "OI", allowed)
    return FilterLayout(upper, axes["O"], axes["I"], axes["X"])
