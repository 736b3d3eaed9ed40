"""Output sizes, pad arithmetic and the auto_pad rules of every family.

Notation per spatial axis (as in the specs): input size I, kernel K, stride S,
dilation D, dilated kernel DK = (K - 1) * D + 1, pads pb (begin) / pe (end).

Forward convolution output size::

    O = floor((I + pb + pe - DK) / S) + 1

The ``rem = (I + pb + pe - DK) % S`` trailing elements of the padded input are
never read by the forward convolution; the lowerings crop them explicitly
(letting XLA see that remainder together with a kernel dilation aborts jaxlib
0.10.2 on CPU: tests/core/test_hazards.py).

auto_pad (oneDNN ``infer_auto_pad``)::

    valid:             pb = pe = 0
    same_* conv-style: total = max(0, DK - (I % S if I % S else S))   # O = ceil(I / S)
    same_* deconv:     total = max(0, DK - S)                          # ConvTranspose
    same_upper:        pb = total // 2          (extra pad at the end)
    same_lower:        pb = total - total // 2  (extra pad at the beginning)
    pe = total - pb
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Sequence
from typing import Any, Literal

from jaxconv._src.geometry.arguments import kind

AutoPadMode = Literal["explicit", "same_upper", "same_lower", "valid"]

#: Canonical auto_pad names; the keys of ``_AUTO_PAD_ALIASES`` are accepted
#: case-insensitively: every family's word for explicit pads, and lax's and
#: TensorFlow's "SAME" (which is same_upper in both the convolution and the
#: ConvTranspose rules).
AUTO_PAD_MODES: tuple[AutoPadMode, ...] = ("explicit", "same_upper", "same_lower", "valid")
_AUTO_PAD_ALIASES: dict[str, AutoPadMode] = {
    "none": "explicit",
    "explicit": "explicit",
    "notset": "explicit",
    "same_upper": "same_upper",
    "same": "same_upper",
    "same_lower": "same_lower",
    "valid": "valid",
}


def canonical_auto_pad(op: str, value: Any, explicit: str = "none") -> AutoPadMode:
    """The canonical auto_pad mode (see ``AUTO_PAD_MODES``), case-insensitive.

    ``explicit`` is the op family's word for explicit pads ("none" in oneDNN's,
    "explicit" in OpenVINO's): the one its errors list.
    """
    if value is None:
        return "explicit"
    if not isinstance(value, str):
        raise TypeError(f"{op}: auto_pad must be a string, got {kind(value)}")
    mode = _AUTO_PAD_ALIASES.get(value.lower())
    if mode is None:
        other = "explicit" if explicit == "none" else "none"
        message = (
            f"{op}: auto_pad must be one of {explicit!r}, 'same_upper', 'same_lower', 'valid' "
            f"(any case; {other!r} and 'notset' mean {explicit!r}, 'same' means 'same_upper'), "
            f"got {value!r}"
        )
        close = difflib.get_close_matches(value.lower(), list(_AUTO_PAD_ALIASES), n=1, cutoff=0.6)
        if close:
            word = explicit if _AUTO_PAD_ALIASES[close[0]] == "explicit" else close[0]
            message += f"; did you mean {word!r}?"
        raise ValueError(message)
    return mode


def dilated_kernel_size(k: int, d: int) -> int:
    return (k - 1) * d + 1


def conv_output_size(i: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """``floor((I + pb + pe - DK) / S) + 1``; may be <= 0 for impossible shapes."""
    return (i + pb + pe - dilated_kernel_size(k, d)) // s + 1


def end_pad_for_output(i: int, k: int, s: int, d: int, pb: int, o: int) -> int | None:
    """The least ``pe >= 0`` with ``conv_output_size(i, k, s, d, pb, pe) == o``: the windows fit
    exactly, or up to ``S - 1`` trailing rows no window reads; None where none does (``pb < 0``,
    or the padded input already holds more than ``o`` windows)."""
    fitted = (o - 1) * s + dilated_kernel_size(k, d) - i - pb
    end = max(fitted, 0)
    return end if pb >= 0 and end <= fitted + s - 1 else None


def crop_of_pads(n: int, lo: int, hi: int, spread: int = 1) -> tuple[int, int, int, int]:
    """Negative pads as a crop: ``(start, stop, lo', hi')`` such that elements ``[start, stop)``
    of an axis of ``n`` elements, spread by ``spread`` (an input dilation, or lax.pad's interior
    + 1) and padded by ``(lo', hi') >= 0``, span what pads ``(lo, hi)`` make of the whole axis.

    ``lo < 0`` drops the elements ``j`` with ``j * spread < -lo``: the first
    ``ceil(-lo / spread)``, leaving ``lo + ceil(-lo / spread) * spread`` zeros before the first
    kept one; ``hi < 0`` likewise at the end. The kept range is empty where the pads crop
    every element."""
    first = -(lo // spread) if lo < 0 else 0  # ceil(-lo / spread)
    last = -(hi // spread) if hi < 0 else 0
    return first, max(n - last, first), lo + first * spread, hi + last * spread


def conv_transpose_output_size(i: int, k: int, s: int, d: int, pb: int, pe: int, op: int = 0) -> int:
    """``S * (I - 1) + DK - pb - pe + output_padding``."""
    return s * (i - 1) + dilated_kernel_size(k, d) - pb - pe + op


class PadRule(enum.Enum):
    """How same_upper/same_lower compute the total padding of one axis."""

    #: conv-style: the output is ceil(I / S) (TF/ONNX SAME, oneDNN Convolution).
    CONV = "conv"
    #: deconv-style: total = max(0, DK - S) (oneDNN ConvTranspose forward).
    DECONV = "deconv"


class SizeRule(enum.Enum):
    """Which empty (zero-size) convolution outputs a family's specification allows.

    Zero batch, zero channels and a zero-size input axis are valid problems in every
    family; the rules differ on an output axis that the kernel does not fit.
    """

    #: oneDNN Graph (its shape inference computes O from the formula; oneDNN primitives take
    #: zero-size tensors): O >= 0, and O = 0 is an empty output. A negative O is no shape.
    ONEDNN = "onednn"
    #: OpenVINO Convolution / GroupConvolution shape inference: the kernel after dilation must
    #: fit in the data shape after padding (DK <= I + pb + pe), so O >= 1.
    OPENVINO = "openvino"


class TransposePadRule(enum.Enum):
    """Whose auto_pad rules a ConvTranspose-like op follows."""

    #: oneDNN ConvTranspose: same_* use total = max(0, DK - S) without output_shape.
    ONEDNN = "onednn"
    #: OpenVINO (Group)ConvolutionBackpropData: same_* pad nothing without output_shape.
    OPENVINO = "openvino"


def split_total(mode: AutoPadMode, total: int, upper_extra_at_end: bool = True) -> tuple[int, int]:
    """(pb, pe) of a same_* total; an odd total's extra element at the end for same_upper."""
    if mode == "same_upper":
        pb = total // 2 if upper_extra_at_end else total - total // 2
    elif mode == "same_lower":  # mirrors same_upper
        pb = total - total // 2 if upper_extra_at_end else total // 2
    else:
        raise ValueError(f"split_total: mode must be 'same_upper' or 'same_lower', got {mode!r}")
    return pb, total - pb


def _same_total(rule: PadRule, i: int, dk: int, s: int) -> int:
    if rule is PadRule.CONV:
        return max(0, dk - (i % s if i % s else s))
    if rule is PadRule.DECONV:
        return max(0, dk - s)
    raise ValueError(f"auto_pads: rule must be a PadRule, got {rule!r}")


def auto_pads(
    mode: AutoPadMode,
    rule: PadRule,
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
        pb, pe = split_total(mode, _same_total(rule, i, dilated_kernel_size(k, d), s))
        begins.append(pb)
        ends.append(pe)
    return tuple(begins), tuple(ends)


def conv_transpose_pads(
    mode: AutoPadMode, rule: TransposePadRule, sizes: Sequence[int], kernel: Sequence[int],
    strides: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int],
    pads_end: Sequence[int], output_padding: Sequence[int],
    output_shape: Sequence[int] | None, upper_extra_at_end: bool = True,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pads_begin, pads_end) of a ConvTranspose; with output_shape, pads_end is unused.

    With output_shape, same_* split ``total = max(0, S*(I-1) + DK - O +
    output_padding)``; ``upper_extra_at_end=False`` gives the OpenVINO
    runtime's opposite split of an odd total.
    """
    if output_shape is None or mode in ("explicit", "valid"):
        if rule is TransposePadRule.OPENVINO and mode in ("same_upper", "same_lower"):
            zeros = (0,) * len(sizes)
            return zeros, zeros
        return auto_pads(mode, PadRule.DECONV, sizes, kernel, strides, dilations, pads_begin,
                         pads_end)
    begins, ends = [], []
    for i, k, s, d, o, op in zip(sizes, kernel, strides, dilations, output_shape, output_padding):
        total = max(0, s * (i - 1) + dilated_kernel_size(k, d) - o + op)
        pb, pe = split_total(mode, total, upper_extra_at_end)
        begins.append(pb)
        ends.append(pe)
    return tuple(begins), tuple(ends)
