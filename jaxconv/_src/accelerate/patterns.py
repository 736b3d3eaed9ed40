"""What a lax equation computes, in jaxconv's terms: the patterns :func:`jaxconv.accelerate` runs.

A ``conv_general_dilated`` equation of a traced program is one of jaxconv's three kernels
(``kernel.py``), whoever wrote it: the user's forward convolution, or one of the two
transposes JAX's autodiff writes for it (JAX's transpose rules of ``conv_general_dilated``,
``_conv_general_dilated_transpose_lhs`` and ``_rhs``). Each pattern is
read back into the forward problem ``y = conv(x, W)`` (stride ``S``, dilation ``D``, pads
``(a, b)``, dilated kernel ``DK = (K - 1) D + 1``, ``G`` groups):

* **data gradient** (``_conv_general_dilated_transpose_lhs``): ``lhs_dilation = S > 1`` and
  window strides 1; ``lhs = dy``, ``rhs`` = W reversed on its spatial axes with its O and I
  roles swapped (per group: the eqn's O axis holds ``G x I/G``, its I axis ``O/G``), padded
  by ``(DK - 1 - a, DK - 1 - b + r)``. So ``a = DK - 1 - lo``, and ``b = DK - 1 - hi`` makes
  the forward problem fit the windows exactly (``r = 0``; a ``b`` below 0 is raised by up to
  ``S - 1``, rows no window reads).
* **weight gradient** (``_conv_general_dilated_transpose_rhs``): ``lhs = x`` with its batch
  and feature roles swapped, ``rhs = dy`` (its I role is dy's batch, its O role dy's
  channels), ``window_strides = D``, ``rhs_dilation = S``, the result is ``W`` (its batch
  role is I/G, its feature role O) and ``batch_group_count = G``. Pads ``(a, hi)`` with
  ``hi`` at least the forward's fitted end pad. With one group the equation is also a valid
  forward convolution; it is read as a weight gradient where its lhs holds the batch role
  after the feature role (the swap autodiff writes) and its result is spatially no larger
  than its rhs (a filter, from an image).
* **forward**: everything else; :func:`jaxconv.conv_general_dilated` computes it (a negative
  pad cropped by ``lax.slice`` first; it hands to lax what it hands to lax). No equation
  reaches XLA with a negative pad: those that run as lax wrote them are cropped the same way
  (``lax_refs.crop_operands``), since XLA:CPU computes such a convolution wrong.

A stride-1 convolution's data gradient has no input dilation: it is a forward convolution
of the reversed, role-swapped filter. Where the equation's filter is a ``rev`` over its
spatial axes (as autodiff writes it: :func:`reversed_filters`) and it has one group, it runs
as the data gradient of the filter before the ``rev``: the two reversals cancel and the
handler reads the filter as it is, where a forward kernel needs a transposed copy (XLA:CPU
took 3.5 ms to copy a reversed 3 x 3 x 512 x 512 bfloat16 filter with its roles swapped, a
third of the data gradient's time). Otherwise it runs as a forward convolution.

``reduce_window_max`` and its two derivatives (``select_and_gather_add``: the JVP's tangent
at each window's maximum; ``select_and_scatter_add``: its transpose) are
:func:`jaxconv.max_pool`'s forward, gather and scatter, on the axes the window moves over.
``reduce_window_sum`` (an average pool) is the sum of its taps; its transpose, where the
windows do not overlap, the cotangent repeated over each window (:func:`spread_sum`).

Each ``*_pattern`` function returns the result arrays, or a string: why the equation runs
as before (:data:`UNRECOGNISED` lists every such reason).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal
from jax.sharding import AxisType

from jaxconv._src import geometry, lax_conv, lax_refs, lowering, options, pooling, primitive
from jaxconv._src.geometry import ConvProblem, Names
from jaxconv._src.geometry.pooling import PoolProblem, pool_problem
from jaxconv._src.kernel import Array, Kernel

_OP = "accelerate"
_NAMES = Names(x="lhs", y="rhs", w_shape="result", w_format="dimension_numbers",
               layout_arguments=False)

#: Why an equation runs as lax wrote it (the values ``explain`` reports), by key.
UNRECOGNISED: dict[str, str] = {
    "dtype": "operands not real floating point, or of two dtypes",
    "rank": "not 1 to 3 spatial axes",
    "sharding": "an out_sharding over Explicit mesh axes",
    "empty": "a zero-size extent",
    "dilation and stride": "input dilation with a window stride or batch groups (no kernel's "
                           "transpose)",
    "groups": "feature and batch groups together",
    "pad range": "pads no forward problem has (a pad past the dilated kernel)",
    "pool dilation": "a dilated pool window or base",
    "pool axes": "a pool over the first and last axes (neither NXC nor NCX)",
    "pool select": "a min pool's selection (select_prim is not >=)",
    "pool padding": "pads no max pool has",
    "window size": "a window sum of more than WINDOW_SUM_MAX_TAPS (64) taps, left to XLA",
}


def _why(key: str) -> str:
    return UNRECOGNISED[key]


def _forward_pads(x_size: Sequence[int], y_size: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dilations: Sequence[int], begins: Sequence[int]
                  ) -> tuple[list[int], list[int]] | None:
    """The forward problem's pads: ``begins`` and each axis's end pad that gives ``y_size``
    outputs (``geometry.end_pad_for_output``); None where an axis has none."""
    ends = [geometry.end_pad_for_output(i, k, s, d, b, o)
            for i, o, k, s, d, b in zip(x_size, y_size, kernel, strides, dilations, begins)]
    return None if None in ends else (list(begins), [e for e in ends if e is not None])


def _to(a: Array, axes: Sequence[int]) -> Array:
    axes = tuple(axes)
    return a if axes == tuple(range(a.ndim)) else a.transpose(axes)


def _place(a: Array, src: Sequence[int], spec: Sequence[int]) -> Array:
    """``a``, whose axis ``src[k]`` plays role k, laid out so that role k sits at axis
    ``spec[k]`` (roles: batch, feature, *spatial, as in ``ConvDimensionNumbers``)."""
    perm = [0] * a.ndim
    for s, axis in zip(src, spec):
        perm[axis] = s
    return _to(a, perm)


def _roles(layout: str, n: int) -> tuple[int, ...]:
    """The axis of each role (batch, feature, *spatial) in jaxconv's ``layout``."""
    return (0, 1, *range(2, n + 2)) if layout == "NCX" else (0, n + 1, *range(1, n + 1))


def _data_layout(*specs: Sequence[int]) -> str:
    """NCX where every data operand already is (no copy), else NXC (jaxconv's fastest)."""
    n = len(specs[0])
    return "NCX" if all(tuple(s) == tuple(range(n)) for s in specs) else "NXC"


def _nxc_axes(spec: Sequence[int], layout: str) -> tuple[int, ...]:
    """The transpose that brings data of ``spec`` (batch, feature, *spatial) into ``layout``."""
    b, f, *sp = spec
    return (b, f, *sp) if layout == "NCX" else (b, *sp, f)


def _auto(sharding: Any) -> bool:
    """Whether an ``out_sharding`` constrains nothing: none, or a mesh whose axes are all Auto
    or Manual (what autodiff's transposes carry under a sharded ``jit``, where the partitioner
    decides, and inside ``shard_map``, where each device computes its own blocks)."""
    if sharding is None:
        return True
    types = getattr(getattr(sharding, "mesh", None), "axis_types", None)
    return types is not None and all(t in (AxisType.Auto, AxisType.Manual) for t in types)


#: the chooser's reasons (``chooser.lax_computes``) for the checks a pattern shares with it
_LAX_COMPUTES = {"not 1 to 3 spatial axes": "rank", "out_sharding": "sharding",
                 "a zero-size extent": "empty"}


def _common(params: dict[str, Any], lhs: Any, rhs: Any, out_shape: Sequence[int]) -> str | None:
    if lhs.dtype != rhs.dtype or not jnp.issubdtype(lhs.dtype, jnp.floating):
        return _why("dtype")
    n = lhs.ndim - 2
    sharding = params.get("out_sharding")
    why = lowering.lax_computes(n, (*lhs.shape, *rhs.shape, *out_shape),
                                out_sharding=None if _auto(sharding) else sharding)
    return None if why is None else _why(_LAX_COMPUTES[why])


def reversed_filters(eqns: Sequence[Any]) -> dict[Any, tuple[Any, tuple[int, ...]]]:
    """The variables that ``rev`` equations among ``eqns`` define: their operand and axes."""
    return {e.outvars[0]: (e.invars[0], tuple(e.params["dimensions"])) for e in eqns
            if e.primitive.name == "rev"}


def filter_before_rev(eqn: Any, reversed_filters: dict[Any, tuple[Any, tuple[int, ...]]]
                      ) -> Any | None:
    """The variable whose ``rev`` over its spatial axes is the filter of the convolution
    ``eqn`` (autodiff's data gradient), or None."""
    if eqn.primitive.name != "conv_general_dilated":
        return None
    rhs, rhs_spec = eqn.invars[1], eqn.params["dimension_numbers"][1]
    if isinstance(rhs, Literal) or rhs not in reversed_filters:
        return None
    operand, axes = reversed_filters[rhs]
    return operand if sorted(axes) == sorted(rhs_spec[2:]) else None


def conv_kind(params: dict[str, Any], lhs: Any, rhs: Any, out_shape: Sequence[int],
              reversed_filter: bool = False) -> Kernel | str:
    """Which kernel a ``conv_general_dilated`` equation is (module docstring), or why none;
    ``reversed_filter``: its filter is a ``rev`` over its spatial axes
    (:func:`filter_before_rev`)."""
    why = _common(params, lhs, rhs, out_shape)
    if why is not None:
        return why
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    if any(d > 1 for d in params["lhs_dilation"]):
        if any(s > 1 for s in params["window_strides"]) or params["batch_group_count"] > 1:
            return _why("dilation and stride")
        return Kernel.DATA
    if params["batch_group_count"] > 1:
        return Kernel.WEIGHT if params["feature_group_count"] == 1 else _why("groups")
    out_sp = math.prod(out_shape[a] for a in out_spec[2:])
    rhs_sp = math.prod(rhs.shape[a] for a in rhs_spec[2:])
    if params["feature_group_count"] == 1 and lhs_spec[0] > lhs_spec[1] and out_sp <= rhs_sp:
        return Kernel.WEIGHT
    if (reversed_filter and params["feature_group_count"] == 1
            and all(s == 1 for s in params["window_strides"])):
        return Kernel.DATA  # autodiff's stride-1 data gradient (module docstring)
    return Kernel.FORWARD


def _options(params: dict[str, Any]) -> tuple[Any, Any]:
    return options.compute_options(_OP, params["precision"], params["preferred_element_type"])


def _problem(layout: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...] | None,
             w_shape: tuple[int, ...], strides: Sequence[int], dilations: Sequence[int],
             begins: Sequence[int], ends: Sequence[int], groups: int) -> ConvProblem:
    return geometry.convolution_problem(
        _OP, _NAMES, x_shape=x_shape, y_shape=y_shape, w_shape=w_shape, strides=tuple(strides),
        pads_begin=tuple(begins), pads_end=tuple(ends), dilations=tuple(dilations),
        auto_pad="explicit", groups=groups, data_format=layout, filter_format="XIO")


def data_pattern(params: dict[str, Any], dy: Array, rhs: Array, out_shape: Sequence[int],
                 unreversed: Array | None = None, lowering: str = "auto") -> Array | str:
    """A data gradient (module docstring): dx from dy and the reversed, role-swapped filter
    ``rhs``; ``unreversed``: ``rhs`` before autodiff's ``rev``, where known (reversing ``rhs``
    back is then no operation at all: XLA:CPU does not cancel two reversals of a bfloat16 array,
    which it reverses in float32)."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    strides, dil = params["lhs_dilation"], params["rhs_dilation"]
    groups = params["feature_group_count"]
    kernel = [rhs.shape[a] for a in rhs_spec[2:]]
    x_size = [out_shape[a] for a in out_spec[2:]]
    pads = _forward_pads(x_size, [dy.shape[a] for a in lhs_spec[2:]], kernel, strides, dil,
                         [(k - 1) * d - lo for k, d, (lo, _) in zip(kernel, dil, params["padding"])])
    if pads is None:
        return _why("pad range")
    in_channels, out_per_group = rhs.shape[rhs_spec[0]], rhs.shape[rhs_spec[1]]
    # W[k, i, g O/G + o] = rev(rhs)[g I/G + i, o, k]: the roles swapped back per group
    w = unreversed if unreversed is not None else lax.rev(rhs, tuple(rhs_spec[2:]))
    w = _to(w, (*rhs_spec[2:], rhs_spec[0], rhs_spec[1]))
    n = len(kernel)
    if groups > 1:
        w = w.reshape(*kernel, groups, in_channels // groups, out_per_group)
        w = w.transpose((*range(n), n + 1, n, n + 2)).reshape(*kernel, in_channels // groups,
                                                               groups * out_per_group)
    layout = _data_layout(lhs_spec, out_spec)
    dys = _to(dy, _nxc_axes(lhs_spec, layout))
    batch = dy.shape[lhs_spec[0]]
    x_shape = (batch, in_channels, *x_size) if layout == "NCX" else (batch, *x_size, in_channels)
    p = _problem(layout, x_shape, tuple(dys.shape), tuple(w.shape), strides, dil, *pads, groups)
    precision, out_dtype = _options(params)
    dx = primitive.data_grad(dys, w, p=p, precision=precision, preferred_element_type=out_dtype,
                             method=lowering)
    return _place(dx, _roles(layout, n), out_spec)


def weight_pattern(params: dict[str, Any], lhs: Array, dy: Array,
                   out_shape: Sequence[int], lowering: str = "auto") -> Array | str:
    """A weight gradient (module docstring): W from x (batch and feature swapped) and dy."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    strides, dil = params["rhs_dilation"], params["window_strides"]
    groups = params["batch_group_count"]
    kernel = [out_shape[a] for a in out_spec[2:]]
    pads = _forward_pads([lhs.shape[a] for a in lhs_spec[2:]], [dy.shape[a] for a in rhs_spec[2:]],
                         kernel, strides, dil, [lo for lo, _ in params["padding"]])
    if pads is None:
        return _why("pad range")
    x_spec = (lhs_spec[1], lhs_spec[0], *lhs_spec[2:])  # the forward's (batch, feature, ...)
    y_spec = (rhs_spec[1], rhs_spec[0], *rhs_spec[2:])
    layout = _data_layout(x_spec, y_spec)
    xs, dys = _to(lhs, _nxc_axes(x_spec, layout)), _to(dy, _nxc_axes(y_spec, layout))
    in_channels, out_channels = lhs.shape[lhs_spec[0]], dy.shape[rhs_spec[0]]
    w_shape = (*kernel, in_channels // groups, out_channels)
    p = _problem(layout, tuple(xs.shape), tuple(dys.shape), w_shape, strides, dil, *pads, groups)
    precision, out_dtype = _options(params)
    dw = primitive.weight_grad(xs, dys, p=p, precision=precision, preferred_element_type=out_dtype,
                               method=lowering)
    n = len(kernel)  # XIO: I (the result's batch role) at n, O (its feature role) at n + 1
    return _place(dw, (n, n + 1, *range(n)), out_spec)


def forward_pattern(params: dict[str, Any], lhs: Array, rhs: Array,
                    lowering: str = "auto") -> Array:
    """A forward convolution: :func:`jaxconv.conv_general_dilated` with the equation's
    arguments (which hands lax the calls it has no kernel for)."""
    return lax_conv.conv_general_dilated(
        lhs, rhs, params["window_strides"], params["padding"], params["lhs_dilation"],
        params["rhs_dilation"], params["dimension_numbers"], params["feature_group_count"],
        params["batch_group_count"], params["precision"], params["preferred_element_type"],
        lowering=lowering)  # type: ignore[arg-type]


def conv_pattern(params: dict[str, Any], lhs: Array, rhs: Array, out_shape: Sequence[int],
                 unreversed: Array | None = None, lowering: str = "auto") -> Array | str:
    """The equation through jaxconv's kernel, or why it runs as lax wrote it; ``unreversed``:
    the filter before autodiff's ``rev`` (:func:`filter_before_rev`), where it is one;
    ``lowering``: ``"auto"``, or ``"direct"`` (no Winograd) for every kernel it runs."""
    kind = conv_kind(params, lhs, rhs, out_shape, unreversed is not None)
    if not isinstance(kind, Kernel):  # a reason (Kernel is a str enum: test it first)
        return kind
    if kind is Kernel.DATA:
        out = data_pattern(params, lhs, rhs, out_shape, unreversed, lowering)
        if not isinstance(out, str) or any(d > 1 for d in params["lhs_dilation"]):
            return out
    if kind is Kernel.WEIGHT:
        out = weight_pattern(params, lhs, rhs, out_shape, lowering)
        if not isinstance(out, str) or params["batch_group_count"] > 1:
            return out
    return forward_pattern(params, lhs, rhs, lowering)


# ------------------------------------------------------------------------------ max pool

def _window_why(params: dict[str, Any], x: Any) -> str | None:
    """Why a ``reduce_window``-family equation over ``x`` is no window jaxconv computes: not
    floating, or dilated; else None."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return _why("dtype")
    ones = (1,) * x.ndim
    if (tuple(params.get("base_dilation", ones)) != ones
            or tuple(params.get("window_dilation", ones)) != ones):
        return _why("pool dilation")
    return None


def pool_of(params: dict[str, Any], x: Any) -> PoolProblem | str:
    """The max pool a ``reduce_window``-family equation over ``x`` computes, or why none."""
    why = _window_why(params, x)
    if why is not None:
        return why
    if x.ndim < 3:
        return _why("rank")
    window, strides = params["window_dimensions"], params["window_strides"]
    padding = [tuple(p) for p in params["padding"]]
    moved = {a for a in range(x.ndim)
             if window[a] != 1 or strides[a] != 1 or padding[a] != (0, 0)}
    if not moved & {0, x.ndim - 1}:
        layout, spatial = "NXC", range(1, x.ndim - 1)
    elif not moved & {0, 1}:
        layout, spatial = "NCX", range(2, x.ndim)
    else:
        return _why("pool axes")
    try:
        _, p = pool_problem(_OP, x, tuple(window[a] for a in spatial),
                            tuple(strides[a] for a in spatial),
                            tuple(padding[a] for a in spatial), layout)
    except (TypeError, ValueError):
        return _why("pool padding")
    return p


def max_pool_pattern(params: dict[str, Any], x: Array) -> Array | str:
    """``reduce_window_max``: jaxconv's max pool (its derivatives: gather and scatter)."""
    p = pool_of(params, x)
    return p if isinstance(p, str) else pooling.pool(x, p)


def _selects_max(params: dict[str, Any]) -> bool:
    return params["select_prim"] is lax.ge_p


def max_pool_scatter_pattern(params: dict[str, Any], ct: Array, x: Array) -> Array | str:
    """``select_and_scatter_add`` with ``>=``: ``ct`` added at each window's first maximum."""
    p = pool_of(params, x) if _selects_max(params) else _why("pool select")
    return p if isinstance(p, str) else pooling.scatter(ct, x, p)


def max_pool_gather_pattern(params: dict[str, Any], t: Array, x: Array) -> Array | str:
    """``select_and_gather_add`` with ``>=``: ``t`` at each window's first maximum."""
    p = pool_of(params, x) if _selects_max(params) else _why("pool select")
    return p if isinstance(p, str) else pooling.gather(t, x, p)


# ------------------------------------------------------------------------ window sums

#: the most taps a window sum is unrolled into (its slices and adds are one fused loop)
WINDOW_SUM_MAX_TAPS = 64


def window_sum_pattern(params: dict[str, Any], x: Array) -> Array | str:
    """``reduce_window_sum`` without dilations (an average pool's sum, and its transpose: the
    same sum over the cotangent spread by an interior pad, where :func:`spread_sum` does not
    take it): the sum of its taps, each a strided
    slice of the padded operand, one loop that XLA fuses, in float32 for 16-bit floats (one
    rounding at the end). Measured on XLA:CPU only, whose own reduce_window is several times
    slower in float32 and bfloat16 (docs/performance.md, "bfloat16 (mixed precision)"); other
    backends run the same program, not timed."""
    why = _window_why(params, x)
    if why is not None:
        return why
    window, strides = tuple(params["window_dimensions"]), tuple(params["window_strides"])
    if math.prod(window) > WINDOW_SUM_MAX_TAPS:
        return _why("window size")
    wide = pooling.wide(x)
    xp = lax_refs.pad(wide, jnp.zeros((), wide.dtype),
                      [(lo, hi, 0) for lo, hi in params["padding"]])
    out = [(n - k) // s + 1 for n, k, s in zip(xp.shape, window, strides)]
    acc = None
    for tap in np.ndindex(*window):
        piece = lax.slice(xp, tap, [t + (o - 1) * s + 1 for t, o, s in zip(tap, out, strides)],
                          strides)
        acc = piece if acc is None else acc + piece
    assert acc is not None
    return acc.astype(x.dtype)


# The transpose of a window sum is a window sum over the cotangent spread by an interior pad:
#     l = reduce_window_sum(pad(ct, 0, (lo, hi, s - 1) per axis), window w, strides 1)
# Where each axis's window w equals its spread s (a pool whose windows do not overlap:
# flax's ``nn.avg_pool`` with strides equal to the window), each window of the padded
# cotangent holds exactly one of its elements: output p reads ct[ceil((p - lo) / s)] where
# 0 <= that index < n, else 0. That is ct repeated s times along the axis (up[r] = ct[r // s])
# shifted by d = s - 1 - lo: l[p] = up[p + d], one pad (or crop) of the repeated array, the
# same values bit for bit (a sum of one element and zeros). XLA fuses the repeat into the
# reader, where it wrote the padded array and summed w taps of it (the MNIST CNN's step:
# docs/performance.md, "bfloat16 (mixed precision)"; measured on XLA:CPU).


def spreads(eqns: Sequence[Any]) -> dict[Any, Any]:
    """The ``pad`` equations that spread an array with zeros between its elements, by their
    result."""
    return {e.outvars[0]: e for e in eqns if e.primitive.name == "pad"
            and any(c[2] for c in e.params["padding_config"])
            and isinstance(e.invars[1], Literal) and e.invars[1].val == 0}


def spread_before_sum(eqn: Any, spread_pads: dict[Any, Any]) -> Any:
    """The interior ``pad`` whose result ``eqn`` sums with a window per element it spreads
    (the transpose of a pool whose windows do not overlap), or None."""
    if eqn.primitive.name != "reduce_window_sum" or isinstance(eqn.invars[0], Literal):
        return None
    pad = spread_pads.get(eqn.invars[0])
    if pad is None:
        return None
    p, ones = eqn.params, (1,) * eqn.invars[0].aval.ndim
    if (tuple(p["window_strides"]) != ones or tuple(p["base_dilation"]) != ones
            or tuple(p["window_dilation"]) != ones
            or any(tuple(q) != (0, 0) for q in p["padding"])):
        return None
    config = pad.params["padding_config"]
    if any(w != c[2] + 1 for w, c in zip(p["window_dimensions"], config)):
        return None
    return pad


def pads_only_spread_sums_read(jaxpr: Any, spread_pads: dict[Any, Any]) -> set[Any]:
    """The pads of ``spread_pads`` whose every reader is a window sum that
    :func:`spread_before_sum` takes (their result is then never needed)."""
    readers: dict[Any, list[Any]] = {}
    for e in jaxpr.eqns:
        for v in e.invars:
            if not isinstance(v, Literal) and v in spread_pads:
                readers.setdefault(v, []).append(e)
    results = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    return {pad for v, pad in spread_pads.items() if v not in results and readers.get(v)
            and all(spread_before_sum(e, spread_pads) is pad for e in readers[v])}


def spread_sum(pad: Any, ct: Array, out_shape: Sequence[int]) -> Array:
    """The window sum :func:`spread_before_sum` found over ``pad``'s result, from ``ct`` (the
    array ``pad`` spreads): ``ct`` repeated along each axis, shifted into place."""
    crops = []
    for axis, (lo, _, interior) in enumerate(pad.params["padding_config"]):
        s, n = interior + 1, ct.shape[axis]
        if s > 1:
            shape = (*ct.shape[:axis + 1], s, *ct.shape[axis + 1:])
            kept = tuple(a for a in range(ct.ndim + 1) if a != axis + 1)
            ct = lax.reshape(lax.broadcast_in_dim(ct, shape, kept),
                             (*ct.shape[:axis], n * s, *ct.shape[axis + 1:]))
        d = s - 1 - lo
        crops.append((-d, out_shape[axis] - n * s + d, 0))
    zero = jnp.asarray(pad.invars[1].val, ct.dtype)  # the pad's own zero (a -0.0 stays one)
    return lax_refs.pad(ct, zero, crops)  # the crops: a slice
