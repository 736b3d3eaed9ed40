"""The geometry of every jaxconv op: attributes, padding, output sizes, layouts.

Every public op is thin: it hands its arguments to one of the ``*_problem``
builders below, which validate everything *before* any computation and return
a frozen :class:`ConvProblem`. The lowerings in ``lowering.py`` only read that
object. There is no other copy of padding or shape logic in the package.

Notation per spatial axis (as in the specs): input size I, kernel K, stride S,
dilation D, dilated kernel DK = (K - 1) * D + 1, pads pb (begin) / pe (end).

Forward convolution output size::

    O = floor((I + pb + pe - DK) / S) + 1

The ``rem = (I + pb + pe - DK) % S`` trailing elements of the padded input are
never read by the forward convolution; the lowerings crop them explicitly (see
HAZARDS: letting XLA see that remainder together with a kernel dilation aborts
jaxlib 0.10.2 on CPU).

auto_pad (oneDNN ``infer_auto_pad``; SEMANTICS.md section 2)::

    valid:             pb = pe = 0
    same_* conv-style: total = max(0, DK - (I % S if I % S else S))   # O = ceil(I / S)
    same_* deconv:     total = max(0, DK - S)                          # ConvTranspose
    same_upper:        pb = total // 2          (extra pad at the end)
    same_lower:        pb = total - total // 2  (extra pad at the beginning)
    pe = total - pb

Layout strings are read letter by letter: ``N``/``C``/``X`` for data
(``X`` = all spatial axes, in order), ``O``/``I``/``X`` for filters. They become
``lax.ConvDimensionNumbers``; no data is transposed to honour a layout.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import numbers
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "AUTO_PAD_MODES",
    "ConvProblem",
    "DataLayout",
    "FilterLayout",
    "PadRule",
    "auto_pads",
    "canonical_auto_pad",
    "check_array",
    "check_same_dtype",
    "conv_output_size",
    "conv_transpose_output_size",
    "convolution_problem",
    "data_layout",
    "filter_layout",
    "int_tuple",
    "spatial_rank",
    "static_shape",
]

#: Canonical auto_pad names; the keys of ``_AUTO_PAD_ALIASES`` are accepted
#: case-insensitively.
AUTO_PAD_MODES = ("explicit", "same_upper", "same_lower", "valid")
_AUTO_PAD_ALIASES = {
    "none": "explicit",
    "explicit": "explicit",
    "notset": "explicit",
    "same_upper": "same_upper",
    "same_lower": "same_lower",
    "valid": "valid",
}

CONVOLUTION_FILTER_FORMATS = ("XIO", "OIX")
DATA_FORMATS = ("NXC", "NCX")


# --------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------


def _kind(value: Any) -> str:
    """A short description of a value's kind for error messages."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_array(op: str, name: str, value: Any) -> jax.Array:
    """Returns ``value`` as a jax array, or raises ``TypeError``.

    Accepts ``jax.Array`` (traced or not) and ``numpy.ndarray``; rejects lists,
    scalars and other objects, since their rank is the first thing we check.
    """
    if isinstance(value, (jax.Array, np.ndarray)):
        dtype = np.dtype(value.dtype)
        if not (jnp.issubdtype(dtype, jnp.number) or dtype == np.bool_):
            raise TypeError(f"{op}: {name} must have a numeric dtype, got {dtype}")
        return jax.numpy.asarray(value)
    raise TypeError(f"{op}: {name} must be a jax.Array or numpy.ndarray, got {_kind(value)}")


def check_same_dtype(op: str, arrays: dict[str, jax.Array], *, floating: bool = True) -> np.dtype:
    """Checks that the named arrays share one dtype (floating if asked); returns it."""
    dtypes = {name: np.dtype(a.dtype) for name, a in arrays.items()}
    names = list(dtypes)
    first = dtypes[names[0]]
    for name in names[1:]:
        if dtypes[name] != first:
            got = ", ".join(f"{n} {d}" for n, d in dtypes.items())
            raise TypeError(f"{op}: {', '.join(names)} must have the same dtype, got {got}")
    if first == np.bool_:
        raise TypeError(f"{op}: {names[0]} must have a numeric dtype, got bool")
    if floating and not jnp.issubdtype(first, jnp.inexact):
        raise TypeError(
            f"{op}: {names[0]} must have a floating dtype (float32, float16, bfloat16, "
            f"float64), got {first}"
        )
    if jnp.issubdtype(first, jnp.complexfloating):
        raise TypeError(f"{op}: {names[0]} must be real, got {first}")
    return first


def spatial_rank(op: str, name: str, array_rank: int, extra: int = 2) -> int:
    """Spatial rank from an array's rank (``extra`` non-spatial axes); 1, 2 or 3."""
    n = array_rank - extra
    if n not in (1, 2, 3):
        raise ValueError(
            f"{op}: {name} must have rank {extra + 1}, {extra + 2} or {extra + 3} "
            f"(1, 2 or 3 spatial axes), got rank {array_rank}"
        )
    return n


def static_shape(op: str, name: str, value: Any) -> tuple[int, ...]:
    """A shape-like argument as a tuple of Python ints.

    Takes a tuple/list of ints, a numpy integer array or a concrete jax array;
    a traced value raises ``TypeError`` telling the caller to pass it statically.
    """
    if value is None:
        raise TypeError(f"{op}: {name} is required (a tuple of ints), got None")
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{op}: {name} must be a static value (tuple of ints, numpy array or concrete "
            f"jax array), got a traced array {value.aval}; pass it as a Python tuple or close "
            f"over it instead of passing it through jit/vmap"
        )
    if isinstance(value, (jax.Array, np.ndarray)):
        arr = np.asarray(value)
        if arr.ndim != 1 or not jnp.issubdtype(arr.dtype, jnp.integer):
            raise TypeError(
                f"{op}: {name} must be a 1-D integer array, got shape {arr.shape} "
                f"and dtype {arr.dtype}"
            )
        return tuple(int(v) for v in arr)
    if isinstance(value, (tuple, list)):
        if not all(_is_int(v) for v in value):
            raise TypeError(f"{op}: {name} must hold ints, got {value!r}")
        return tuple(int(v) for v in value)
    raise TypeError(f"{op}: {name} must be a tuple of ints, got {_kind(value)}")


def int_tuple(
    op: str, name: str, value: Any, n: int, *, default: int, minimum: int
) -> tuple[int, ...]:
    """One int per spatial axis, ``>= minimum``; ``None`` gives ``default``.

    A single int is broadcast to every axis (as in ``lax`` and PyTorch).
    """
    if value is None:
        return (default,) * n
    if _is_int(value):
        values = (int(value),) * n
    elif isinstance(value, (tuple, list, np.ndarray, jax.Array)) and not isinstance(
        value, jax.core.Tracer
    ):
        seq = list(np.asarray(value).tolist()) if not isinstance(value, (tuple, list)) else value
        if not all(_is_int(v) for v in seq):
            raise TypeError(f"{op}: {name} must hold ints, got {value!r}")
        values = tuple(int(v) for v in seq)
        if len(values) != n:
            raise ValueError(
                f"{op}: {name} must have {n} value(s), one per spatial axis, got "
                f"{len(values)}: {list(values)}"
            )
    else:
        raise TypeError(f"{op}: {name} must be an int or a sequence of ints, got {_kind(value)}")
    bad = [v for v in values if v < minimum]
    if bad:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{op}: {name} must be {what}, got {list(values)}")
    return values


def canonical_auto_pad(op: str, value: Any) -> str:
    """The canonical auto_pad mode (see ``AUTO_PAD_MODES``), case-insensitive."""
    if value is None:
        return "explicit"
    if not isinstance(value, str):
        raise TypeError(f"{op}: auto_pad must be a string, got {_kind(value)}")
    mode = _AUTO_PAD_ALIASES.get(value.lower())
    if mode is None:
        raise ValueError(
            f"{op}: auto_pad must be one of 'none', 'explicit', 'same_upper', 'same_lower', "
            f"'valid' (any case), got {value!r}"
        )
    return mode


def check_groups(op: str, groups: Any) -> int:
    if not _is_int(groups):
        raise TypeError(f"{op}: groups must be an int, got {_kind(groups)}")
    if groups < 1:
        raise ValueError(f"{op}: groups must be >= 1, got {groups}")
    return int(groups)


# --------------------------------------------------------------------------
# Sizes and padding
# --------------------------------------------------------------------------


def dilated_kernel_size(k: int, d: int) -> int:
    return (k - 1) * d + 1


def conv_output_size(i: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """``floor((I + pb + pe - DK) / S) + 1``; may be <= 0 for impossible shapes."""
    return (i + pb + pe - dilated_kernel_size(k, d)) // s + 1


def conv_transpose_output_size(i: int, k: int, s: int, d: int, pb: int, pe: int, op: int = 0) -> int:
    """``S * (I - 1) + DK - pb - pe + output_padding``."""
    return s * (i - 1) + dilated_kernel_size(k, d) - pb - pe + op


class PadRule:
    """How same_upper/same_lower compute the total padding of one axis."""

    #: conv-style: the output is ceil(I / S) (TF/ONNX SAME, oneDNN Convolution).
    CONV = "conv"
    #: deconv-style: total = max(0, DK - S) (oneDNN ConvTranspose forward).
    DECONV = "deconv"


def _split_total(mode: str, total: int, upper_extra_at_end: bool = True) -> tuple[int, int]:
    if mode == "same_upper":
        pb = total // 2 if upper_extra_at_end else total - total // 2
    else:  # same_lower mirrors same_upper
        pb = total - total // 2 if upper_extra_at_end else total // 2
    return pb, total - pb


def auto_pads(
    mode: str,
    rule: str,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Resolves (pads_begin, pads_end) for one op per the auto_pad rules above.

    ``sizes`` is the input size I of the rule: the forward convolution's input
    for ``PadRule.CONV``, the ConvTranspose input for ``PadRule.DECONV``.
    """
    if mode == "explicit":
        return tuple(pads_begin), tuple(pads_end)
    if mode == "valid":
        zeros = (0,) * len(sizes)
        return zeros, zeros
    begins, ends = [], []
    for i, k, s, d in zip(sizes, kernel, strides, dilations):
        dk = dilated_kernel_size(k, d)
        if rule == PadRule.CONV:
            total = max(0, dk - (i % s if i % s else s))
        else:
            total = max(0, dk - s)
        pb, pe = _split_total(mode, total)
        begins.append(pb)
        ends.append(pe)
    return tuple(begins), tuple(ends)


# --------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------


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


def _parse_letters(op: str, name: str, fmt: Any, n: int, letters: str, allowed: Sequence[str]):
    if not isinstance(fmt, str):
        raise TypeError(f"{op}: {name} must be a string, got {_kind(fmt)}")
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
    assert sorted(axes) == sorted(letters + "X"), (fmt, letters)
    return upper, axes


def data_layout(op: str, name: str, fmt: Any, n: int) -> DataLayout:
    """Parses a data format ("NXC" or "NCX") for ``n`` spatial axes."""
    upper, axes = _parse_letters(op, name, fmt, n, "NC", DATA_FORMATS)
    return DataLayout(upper, axes["N"], axes["C"], axes["X"])


def filter_layout(op: str, name: str, fmt: Any, n: int, allowed: Sequence[str]) -> FilterLayout:
    """Parses a filter format (a permutation of "O", "I", "X") for ``n`` spatial axes."""
    upper, axes = _parse_letters(op, name, fmt, n, "OI", allowed)
    return FilterLayout(upper, axes["O"], axes["I"], axes["X"])


# --------------------------------------------------------------------------
# The resolved problem
# --------------------------------------------------------------------------


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

    op: str
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


def _check_divisible(op: str, names: Names, groups: int, in_channels: int,
                     out_channels: int) -> None:
    if in_channels % groups:
        raise ValueError(
            f"{op}: the {names.x} channels ({in_channels}) must be divisible by groups ({groups})"
        )
    if out_channels % groups:
        raise ValueError(
            f"{op}: the output channels ({out_channels}) must be divisible by groups ({groups})"
        )


def _check_channels(
    op: str, names: Names, groups: int, in_channels: int, out_channels: int,
    filter_o: int, filter_i: int, filter_shape: tuple[int, ...], w_format: str,
) -> None:
    _check_divisible(op, names, groups, in_channels, out_channels)
    if filter_o != out_channels or filter_i != in_channels // groups:
        raise ValueError(
            f"{op}: {names.w_shape} {list(filter_shape)} in {w_format} format holds "
            f"O={filter_o}, I={filter_i}; expected O={out_channels} (output channels) and "
            f"I={in_channels // groups} ({names.x} channels {in_channels} / groups {groups})"
        )


def _common_attributes(op, names, x_shape, y_shape, w_shape, data_format, filter_format,
                       filter_formats, groups, strides, dilations, pads_begin, pads_end, auto_pad):
    """Ranks, layouts and the attributes every convolution-like op shares, validated.

    Returns (n, data layout, filter layout, groups, strides, dilations,
    pads_begin, pads_end, auto_pad mode); the pads are the attributes as given.
    """
    ref_name, ref_shape = (names.x, x_shape) if x_shape is not None else (names.y, y_shape)
    assert ref_shape is not None
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
    return (
        n,
        data_layout(op, "data_format", data_format, n),
        wl,
        check_groups(op, groups),
        int_tuple(op, "strides", strides, n, default=1, minimum=1),
        int_tuple(op, "dilations", dilations, n, default=1, minimum=1),
        int_tuple(op, "pads_begin", pads_begin, n, default=0, minimum=0),
        int_tuple(op, "pads_end", pads_end, n, default=0, minimum=0),
        canonical_auto_pad(op, auto_pad),
    )


def convolution_problem(
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
) -> ConvProblem:
    """Validates and resolves a oneDNN-style convolution, forward or gradient.

    Exactly the shapes the op has are given: forward gets ``x_shape`` and
    ``w_shape``; the data gradient ``y_shape``, ``w_shape`` and ``x_shape``
    (the forward input's full shape); the weight gradient ``x_shape``,
    ``y_shape`` and ``w_shape``. ``y_shape``, when given, must equal the forward
    output shape.
    """
    n, layout, wl, g, s, d, pb, pe, mode = _common_attributes(
        op, names, x_shape, y_shape, w_shape, data_format, filter_format, filter_formats, groups,
        strides, dilations, pads_begin, pads_end, auto_pad)

    filter_o, filter_i, kernel = wl.split(w_shape)
    assert x_shape is not None, "every convolution op knows its forward input shape"
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
    if any(v <= 0 for v in in_size):
        raise ValueError(f"{op}: {names.x} spatial sizes must be positive, got {list(in_size)}")
    _check_channels(op, names, g, in_channels, out_channels, filter_o, filter_i, w_shape, wl.format)

    pb, pe = auto_pads(mode, PadRule.CONV, in_size, kernel, s, d, pb, pe)
    out_size = tuple(
        conv_output_size(i, k, st, dl, b, e)
        for i, k, st, dl, b, e in zip(in_size, kernel, s, d, pb, pe)
    )
    if any(o <= 0 for o in out_size):
        dk = [dilated_kernel_size(k, dl) for k, dl in zip(kernel, d)]
        raise ValueError(
            f"{op}: the dilated kernel {dk} is larger than the padded {names.x} "
            f"{[i + b + e for i, b, e in zip(in_size, pb, pe)]} (spatial {list(in_size)}, "
            f"pads_begin {list(pb)}, pads_end {list(pe)}): the output would be empty"
        )
    if out_given is not None and out_given != out_size:
        raise ValueError(
            f"{op}: {names.y} spatial shape must equal the forward output size "
            f"{list(out_size)} (from {names.x} spatial {list(in_size)}, kernel {list(kernel)}, "
            f"strides {list(s)}, dilations {list(d)}, pads_begin {list(pb)}, pads_end "
            f"{list(pe)}), got {list(out_given)}"
        )
    return _recorded(ConvProblem(
        op=op, rank=n, data=layout, filter_layout=wl, filter_swap=False, batch=batch,
        in_channels=in_channels, out_channels=out_channels, groups=g, input_size=in_size,
        output_size=out_size, kernel=kernel, strides=s, dilations=d, pads_begin=pb, pads_end=pe,
    ))


_RECORD: contextvars.ContextVar[list | None] = contextvars.ContextVar("jaxconv_problems",
                                                                     default=None)


@contextlib.contextmanager
def recording_problems() -> Iterator[list[ConvProblem]]:
    """Collects every :class:`ConvProblem` built inside the block (``jaxconv shapes``)."""
    log: list[ConvProblem] = []
    token = _RECORD.set(log)
    try:
        yield log
    finally:
        _RECORD.reset(token)


def _recorded(p: ConvProblem) -> ConvProblem:
    log = _RECORD.get()
    if log is not None:
        log.append(p)
    return p


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


# --------------------------------------------------------------------------
# ConvTranspose (oneDNN ConvTranspose family; SEMANTICS.md section 2)
# --------------------------------------------------------------------------
#
# A ConvTranspose with input x (IC channels, size I) and output y (OC, size O)
# is the adjoint of the convolution y -> x. Its weights name the roles with
# the transposed op's letters: I = IC (full count), O = OC / groups. So the
# ConvProblem we build is that convolution's: in_channels = OC, out_channels =
# IC, input_size = O, output_size = I, filter_swap = True.
#
#   O = S * (I - 1) + DK - pb - pe + output_padding          (no output_shape)
#   y[o] = full[o + pb], o in [0, O)                          (with output_shape)
#
# where full is the un-padded result of length S * (I - 1) + DK, zero past its
# end. Both read as the convolution with pads (pb, pe') for the exact fit
#   pe' = S * (I - 1) + DK - pb - O,
# negative when O reaches past the end of full (a crop of the conv input, i.e.
# zeros in the transposed output).

CONV_TRANSPOSE_FILTER_FORMATS = ("IOX", "XOI", "OIX", "XIO")


class TransposePadRule:
    """Whose auto_pad rules a ConvTranspose-like op follows."""

    #: oneDNN ConvTranspose: same_* use total = max(0, DK - S) without output_shape.
    ONEDNN = "onednn"
    #: OpenVINO (Group)ConvolutionBackpropData: same_* pad nothing without output_shape.
    OPENVINO = "openvino"


def _conv_transpose_pads(
    mode: str, rule: str, sizes, kernel, strides, dilations, pads_begin, pads_end,
    output_padding, output_shape, upper_extra_at_end: bool = True,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pads_begin, pads_end) of a ConvTranspose; with output_shape, pads_end is unused.

    With output_shape, same_* split ``total = max(0, S*(I-1) + DK - O +
    output_padding)``; ``upper_extra_at_end=False`` gives the OpenVINO
    runtime's opposite split of an odd total.
    """
    if output_shape is None or mode in ("explicit", "valid"):
        if rule == TransposePadRule.OPENVINO and mode.startswith("same"):
            zeros = (0,) * len(sizes)
            return zeros, zeros
        return auto_pads(mode, PadRule.DECONV, sizes, kernel, strides, dilations, pads_begin,
                         pads_end)
    begins, ends = [], []
    for i, k, s, d, o, op in zip(sizes, kernel, strides, dilations, output_shape, output_padding):
        total = max(0, s * (i - 1) + dilated_kernel_size(k, d) - o + op)
        pb, pe = _split_total(mode, total, upper_extra_at_end)
        begins.append(pb)
        ends.append(pe)
    return tuple(begins), tuple(ends)


def conv_transpose_problem(
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
    pad_rule: str = TransposePadRule.ONEDNN,
    upper_extra_at_end: bool = True,
) -> ConvProblem:
    """Validates and resolves a ConvTranspose (forward or gradient) as a ConvProblem.

    ``x_shape`` is the ConvTranspose input, ``y_shape`` its output (the
    gradient ops' ``diff_dst``). The forward gets x, w and optionally
    ``output_shape``; backward data gets y and w (x's size is solved for);
    backward weights gets x, y and w. ``pad_rule`` picks oneDNN's or OpenVINO's
    auto_pad rules (OpenVINO also lets output_padding reach the stride:
    the extra elements are zeros).
    """
    n, layout, wl, g, s, d, pb_attr, pe_attr, mode = _common_attributes(
        op, names, x_shape, y_shape, w_shape, data_format, filter_format,
        CONV_TRANSPOSE_FILTER_FORMATS, groups, strides, dilations, pads_begin, pads_end, auto_pad)
    opad = int_tuple(op, "output_padding", output_padding, n, default=0, minimum=0)
    if pad_rule == TransposePadRule.ONEDNN and any(o >= st for o, st in zip(opad, s)):
        raise ValueError(
            f"{op}: output_padding must be smaller than the stride on every axis, got "
            f"output_padding {list(opad)} with strides {list(s)}"
        )
    out_shape = None
    if output_shape is not None:
        out_shape = static_shape(op, "output_shape", output_shape)
        if len(out_shape) != n:
            raise ValueError(
                f"{op}: output_shape must hold the {n} spatial output sizes, got "
                f"{len(out_shape)}: {list(out_shape)}"
            )
        if any(v <= 0 for v in out_shape):
            raise ValueError(f"{op}: output_shape must be positive, got {list(out_shape)}")

    w_o, w_i, kernel = wl.split(w_shape)  # I letter: IC (full); O letter: OC / groups
    dk = tuple(dilated_kernel_size(k, dl) for k, dl in zip(kernel, d))

    # Channels and batch first: a weights shape in the wrong format is reported as such.
    if x_shape is not None:
        batch, in_channels, in_size = layout.split(x_shape)
    else:
        in_channels = w_i
    if y_shape is not None:
        y_batch, out_channels, y_size = layout.split(y_shape)
        if x_shape is not None and y_batch != batch:
            raise ValueError(
                f"{op}: {names.x} and {names.y} must have the same batch size, got "
                f"{batch} and {y_batch}"
            )
        batch = y_batch
    else:
        out_channels = w_o * g
    _check_divisible(op, names, g, in_channels, out_channels)
    if w_i != in_channels or w_o != out_channels // g:
        raise ValueError(
            f"{op}: {names.w_shape} {list(w_shape)} in {wl.format} format holds I={w_i}, "
            f"O={w_o}; expected I={in_channels} ({names.x} channels, the full count) and "
            f"O={out_channels // g} (output channels {out_channels} / groups {g})"
        )

    if x_shape is not None:
        if any(v <= 0 for v in in_size):
            raise ValueError(f"{op}: {names.x} spatial sizes must be positive, got {list(in_size)}")
        pb, pe = _conv_transpose_pads(mode, pad_rule, in_size, kernel, s, d, pb_attr, pe_attr, opad,
                                      out_shape, upper_extra_at_end)
        if out_shape is not None:
            out_size = out_shape
        else:
            out_size = tuple(conv_transpose_output_size(i, k, st, dl, b, e, o) for
                             i, k, st, dl, b, e, o in zip(in_size, kernel, s, d, pb, pe, opad))
            if any(o <= 0 for o in out_size):
                raise ValueError(
                    f"{op}: the pads remove the whole output: S*(I-1)+DK-pb-pe+output_padding = "
                    f"{list(out_size)} (I {list(in_size)}, pads_begin {list(pb)}, pads_end "
                    f"{list(pe)})"
                )
        if y_shape is not None and y_size != out_size:
            raise ValueError(
                f"{op}: {names.y} spatial shape must equal the ConvTranspose output size "
                f"{list(out_size)} (S*(I-1)+DK-pb-pe+output_padding from {names.x} spatial "
                f"{list(in_size)}, kernel {list(kernel)}, strides {list(s)}, dilations "
                f"{list(d)}, pads_begin {list(pb)}, pads_end {list(pe)}, output_padding "
                f"{list(opad)}), got {list(y_size)}"
            )
    else:
        # backward data: solve O = S*(I-1) + DK - pb - pe + output_padding for I.
        out_size = y_size
        pb, pe = auto_pads(mode, PadRule.DECONV, out_size, kernel, s, d, pb_attr, pe_attr)
        sizes = []
        for o, st, k_d, b, e, opd in zip(out_size, s, dk, pb, pe, opad):
            span = o - k_d + b + e - opd
            if span < 0 or span % st:
                lo = max(0, span) // st
                near = sorted({st * i + k_d - b - e + opd for i in (lo, lo + 1)} - {o})
                raise ValueError(
                    f"{op}: {names.y} spatial shape {list(out_size)} is not a ConvTranspose "
                    f"output size for kernel {list(kernel)}, strides {list(s)}, dilations "
                    f"{list(d)}, pads_begin {list(pb)}, pads_end {list(pe)}, output_padding "
                    f"{list(opad)}: need (O - DK + pb + pe - output_padding) to be a "
                    f"non-negative multiple of the stride (nearest valid sizes {near})"
                )
            sizes.append(span // st + 1)
        in_size = tuple(sizes)

    # The convolution this ConvTranspose transposes, fitted exactly.
    conv_pe = tuple(st * (i - 1) + k_d - b - o
                    for st, i, k_d, b, o in zip(s, in_size, dk, pb, out_size))
    return _recorded(ConvProblem(
        op=op, rank=n, data=layout, filter_layout=wl, filter_swap=True, batch=batch,
        in_channels=out_channels, out_channels=in_channels, groups=g, input_size=tuple(out_size),
        output_size=tuple(in_size), kernel=kernel, strides=s, dilations=d, pads_begin=pb,
        pads_end=conv_pe,
    ))


# --------------------------------------------------------------------------
# Ascend TBE conv2d_backprop_filter (5HD inputs; SEMANTICS.md section 4)
# --------------------------------------------------------------------------

TBE_C0 = 16


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
    """Validates a 5HD weight-gradient call; returns the NCHW/OIHW ConvProblem.

    5HD tensors are ``(N, C1, H, W, C0)`` with C0 = 16; the problem is stated
    for the unpacked ``(N, C, H, W)`` data (the real channel counts), so the
    padded channel slots never take part.
    """
    names = Names(x="input_x", y="out_backprop", w_shape="filter_sizes", w_format="OIHW")
    for name, shape in (("input_x", x5_shape), ("out_backprop", dy5_shape)):
        if len(shape) != 5:
            raise ValueError(f"{op}: {name} must be 5HD (N, C1, H, W, C0), got rank {len(shape)} "
                             f"(shape {list(shape)})")
        if shape[4] != TBE_C0:
            raise ValueError(f"{op}: {name} must have C0 = {TBE_C0} (its last axis), got C0 = "
                             f"{shape[4]} (shape {list(shape)})")
    sizes, g = tbe_filter_sizes(op, filter_sizes, groups)
    cout, cin_g, _, _ = sizes
    cin = cin_g * g
    for name, shape, c in (("input_x", x5_shape, cin), ("out_backprop", dy5_shape, cout)):
        if shape[1] != -(-c // TBE_C0):
            what = f"groups * Cin/groups = {g} * {cin_g}" if name == "input_x" else "Cout"
            raise ValueError(
                f"{op}: {name} C1 must be ceil({what} = {c} / 16) = {-(-c // TBE_C0)}, got C1 = "
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
