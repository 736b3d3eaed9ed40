"""A transposed convolution the program wrote, computed mirrored: its activations reversed in
place of its filter.

A transposed convolution written with input dilation and its own filter ``K`` (flax's
``ConvTranspose``: ``y = conv(dilate(x, S), K)``, pads ``(lo, hi)``, rhs dilation ``D``) is
jaxconv's data-gradient kernel of ``K`` reversed on its spatial axes: output ``o`` of ``y``
reads ``x[i] K[k]`` where ``o = i S + lo - k D``. Reversing ``x`` and ``y`` instead
(``o' = O - 1 - o``, ``i' = I - 1 - i``) gives ``o' = i' S + k D - ((K - 1) D - hi)``: the
ConvTranspose of ``rev(x)`` and ``K`` as it is (oneDNN's convention, ``o = i S - pb + k D``)
with pads ``pb = (K - 1) D - hi`` and ``pe = (K - 1) D - lo``, the two pads swapped. So::

    y = rev(conv_transpose(rev(x), K, pads_begin=(K - 1) D - hi, pads_end=(K - 1) D - lo))

with ``K`` read in its own layout (its roles named by the ConvTranspose filter format the
equation's dimension numbers spell): no copy of the filter at all, where the unmirrored form
reverses and transposes it in XLA on every call (DCGAN's 4 x 4 128 -> 64 at 16 x 16, batch 1:
0.33 ms a call mirrored against 0.49, XLA:CPU with oneDNN on the 2-core Zen 4 VM). The two
reversals are passes over activations, so the mirror is taken where the filter outweighs them
(:func:`mirrors`), on every backend; only the CPU's was timed (the chooser times the form
against XLA's as written on the CPU alone: ``chooser.as_written``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jax import lax

from jaxconv._src import geometry, options, primitive
from jaxconv._src.geometry import ConvProblem, Names
from jaxconv._src.kernel import Array

_NAMES = Names(x="lhs", y="result", w_shape="rhs", w_format="dimension_numbers",
               layout_arguments=False)


def _filter_format(rhs_spec: Sequence[int]) -> str | None:
    """The ConvTranspose filter format of an equation's rhs (its O role: the result's
    channels, its I role: the input's), or None where its spatial axes are not in order
    before or after the two channel axes."""
    n = len(rhs_spec) - 2
    o, i, sp = rhs_spec[0], rhs_spec[1], tuple(rhs_spec[2:])
    if sp == tuple(range(n)):
        return {(n + 1, n): "XIO", (n, n + 1): "XOI"}.get((o, i))
    if sp == tuple(range(2, n + 2)):
        return {(0, 1): "OIX", (1, 0): "IOX"}.get((o, i))
    return None


def _layout(lhs_spec: Sequence[int], out_spec: Sequence[int]) -> str | None:
    """NXC or NCX where both the input and the result are in it, else None."""
    n = len(lhs_spec) - 2
    for layout, spec in (("NXC", (0, n + 1, *range(1, n + 1))), ("NCX", tuple(range(n + 2)))):
        if tuple(lhs_spec) == spec and tuple(out_spec) == spec:
            return layout
    return None


def problem(params: dict[str, Any], lhs_shape: Sequence[int], rhs_shape: Sequence[int],
            out_shape: Sequence[int]) -> ConvProblem | str:
    """The mirrored ConvTranspose problem of a written transposed convolution (module
    docstring), or why it has none."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    if params["feature_group_count"] != 1 or params["batch_group_count"] != 1:
        return "groups"
    if any(s != 1 for s in params["window_strides"]):
        return "window strides"
    fmt, layout = _filter_format(rhs_spec), _layout(lhs_spec, out_spec)
    if fmt is None or layout is None:
        return "layout"
    dil = params["rhs_dilation"]
    kernel = [rhs_shape[a] for a in rhs_spec[2:]]
    begins = [(k - 1) * d - hi for k, d, (_, hi) in zip(kernel, dil, params["padding"])]
    ends = [(k - 1) * d - lo for k, d, (lo, _) in zip(kernel, dil, params["padding"])]
    if min(begins + ends) < 0:
        return "pad range"
    try:
        p = geometry.conv_transpose_problem(
            "accelerate", _NAMES, x_shape=tuple(lhs_shape), y_shape=None,
            w_shape=tuple(rhs_shape), output_shape=None, strides=tuple(params["lhs_dilation"]),
            pads_begin=tuple(begins), pads_end=tuple(ends), dilations=tuple(dil),
            auto_pad="explicit", output_padding=None, groups=1, data_format=layout,
            filter_format=fmt)
    except ValueError as e:
        return str(e)
    if p.input_size != tuple(out_shape[a] for a in out_spec[2:]):
        return "output size"
    return p


def mirrors(p: ConvProblem) -> bool:
    """Whether the mirror is the cheaper way to read the filter as the kernel wants it: its
    filter holds more elements than the input and the result together (two reversals of
    those against one copy of the filter)."""
    return math.prod(p.filter_shape) > math.prod(p.x_shape) + math.prod(p.y_shape)


def data_pattern(params: dict[str, Any], lhs: Array, rhs: Array, p: ConvProblem,
                 lowering: str = "auto") -> Array:
    """The written transposed convolution of ``lhs`` and ``rhs``, mirrored (``p``:
    :func:`problem`)."""
    precision, out_dtype = options.compute_options("accelerate", params["precision"],
                                                   params["preferred_element_type"])
    axes = tuple(p.data.spatial_axes)
    out = primitive.data_grad(lax.rev(lhs, axes), rhs, p=p, precision=precision,
                              preferred_element_type=out_dtype, method=lowering)
    return lax.rev(out, axes)
