"""The convolution rewrite: a ``conv_general_dilated`` equation as one of jaxconv's kernels.

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
spatial axes (as autodiff writes it: ``Analysis.reversed_filters``) and it has one group, it runs
as the data gradient of the filter before the ``rev``: the two reversals cancel and the
handler reads the filter as it is, where a forward kernel needs a transposed copy (XLA:CPU
took 3.5 ms to copy a reversed 3 x 3 x 512 x 512 bfloat16 filter with its roles swapped, a
third of the data gradient's time). Otherwise it runs as a forward convolution.

A served model's transposed convolution (its filter a constant of the program: the variables
closed over) is computed from its filter reversed and role-swapped once, when the program is
traced, and packed once for oneDNN's call (``fused.data``; docs/onednn.md, "Packed filters"):
no reversal of the filter or of the activations, and no move of the filter, per call.

``match`` reads which kernel an equation is, or why it has none (``base.REASONS``); ``emit``
runs it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal
from jax.sharding import AxisType

from jaxconv._src import geometry, lax_conv, lowering, options, primitive
from jaxconv._src.accelerate.rewrites import mirrored
from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope, packs
from jaxconv._src.geometry import ConvProblem, Names
from jaxconv._src.lowering import chooser, fused
from jaxconv._src.kernel import Array, Kernel

_OP = "accelerate"
_NAMES = Names(x="lhs", y="rhs", w_shape="result", w_format="dimension_numbers",
               layout_arguments=False)


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


def _common(params: dict[str, Any], lhs: Any, rhs: Any, out_shape: Sequence[int]) -> str | None:
    if lhs.dtype != rhs.dtype or not jnp.issubdtype(lhs.dtype, jnp.floating):
        return "dtype"
    sharding = params.get("out_sharding")
    return lowering.lax_computes(lhs.ndim - 2, (*lhs.shape, *rhs.shape, *out_shape),
                                 out_sharding=None if _auto(sharding) else sharding)


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
            return "dilation and stride"
        return Kernel.DATA
    if params["batch_group_count"] > 1:
        return Kernel.WEIGHT if params["feature_group_count"] == 1 else "groups"
    out_sp = math.prod(out_shape[a] for a in out_spec[2:])
    rhs_sp = math.prod(rhs.shape[a] for a in rhs_spec[2:])
    if params["feature_group_count"] == 1 and lhs_spec[0] > lhs_spec[1] and out_sp <= rhs_sp:
        return Kernel.WEIGHT
    if (reversed_filter and params["feature_group_count"] == 1
            and all(s == 1 for s in params["window_strides"])):
        return Kernel.DATA  # autodiff's stride-1 data gradient (module docstring)
    return Kernel.FORWARD


def _data_pads(params: dict[str, Any], dy_shape: Sequence[int], rhs_shape: Sequence[int],
               out_shape: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """A data gradient's forward pads (module docstring), or None where it has none."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    dil = params["rhs_dilation"]
    kernel = [rhs_shape[a] for a in rhs_spec[2:]]
    return _forward_pads([out_shape[a] for a in out_spec[2:]], [dy_shape[a] for a in lhs_spec[2:]],
                         kernel, params["lhs_dilation"], dil,
                         [(k - 1) * d - lo for k, d, (lo, _) in zip(kernel, dil, params["padding"])])


def _weight_pads(params: dict[str, Any], lhs_shape: Sequence[int], dy_shape: Sequence[int],
                 out_shape: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """A weight gradient's forward pads (module docstring), or None where it has none."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    return _forward_pads([lhs_shape[a] for a in lhs_spec[2:]], [dy_shape[a] for a in rhs_spec[2:]],
                         [out_shape[a] for a in out_spec[2:]], params["rhs_dilation"],
                         params["window_strides"], [lo for lo, _ in params["padding"]])


def kernel_of(params: dict[str, Any], lhs: Any, rhs: Any, out_shape: Sequence[int],
              reversed_filter: bool = False) -> Kernel | str:
    """The kernel that computes a ``conv_general_dilated`` equation (:func:`conv_kind`, where
    its pads make a forward problem: else a forward convolution, or the reason), or why none."""
    kind = conv_kind(params, lhs, rhs, out_shape, reversed_filter)
    if kind is Kernel.DATA and _data_pads(params, lhs.shape, rhs.shape, out_shape) is None:
        return "pad range" if any(d > 1 for d in params["lhs_dilation"]) else Kernel.FORWARD
    if kind is Kernel.WEIGHT and _weight_pads(params, lhs.shape, rhs.shape, out_shape) is None:
        return "pad range" if params["batch_group_count"] > 1 else Kernel.FORWARD
    return kind


def _options(params: dict[str, Any]) -> tuple[Any, Any]:
    return options.compute_options(_OP, params["precision"], params["preferred_element_type"])


def _problem(layout: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...] | None,
             w_shape: tuple[int, ...], strides: Sequence[int], dilations: Sequence[int],
             begins: Sequence[int], ends: Sequence[int], groups: int) -> ConvProblem:
    return geometry.convolution_problem(
        _OP, _NAMES, x_shape=x_shape, y_shape=y_shape, w_shape=w_shape, strides=tuple(strides),
        pads_begin=tuple(begins), pads_end=tuple(ends), dilations=tuple(dilations),
        auto_pad="explicit", groups=groups, data_format=layout, filter_format="XIO")


def _data_problem(params: dict[str, Any], dy_shape: Sequence[int], rhs_shape: Sequence[int],
                  out_shape: Sequence[int]) -> tuple[str, ConvProblem] | None:
    """A data gradient's layout and forward problem (module docstring), from the equation's
    shapes; None where it has no forward pads."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    groups = params["feature_group_count"]
    kernel = [rhs_shape[a] for a in rhs_spec[2:]]
    pads = _data_pads(params, dy_shape, rhs_shape, out_shape)
    if pads is None:
        return None
    in_channels, out_per_group = rhs_shape[rhs_spec[0]], rhs_shape[rhs_spec[1]]
    w_shape = (*kernel, in_channels // groups, groups * out_per_group)
    layout = _data_layout(lhs_spec, out_spec)
    dys_shape = tuple(dy_shape[a] for a in _nxc_axes(lhs_spec, layout))
    x_size = [out_shape[a] for a in out_spec[2:]]
    batch = dy_shape[lhs_spec[0]]
    x_shape = (batch, in_channels, *x_size) if layout == "NCX" else (batch, *x_size, in_channels)
    return layout, _problem(layout, x_shape, dys_shape, w_shape, params["lhs_dilation"],
                            params["rhs_dilation"], *pads, groups)


def data_pattern(params: dict[str, Any], dy: Array, rhs: Array, out_shape: Sequence[int],
                 unreversed: Array | None = None, lowering: str = "auto") -> Array | str:
    """A data gradient (module docstring): dx from dy and the reversed, role-swapped filter
    ``rhs``; ``unreversed``: ``rhs`` before autodiff's ``rev``, where known (reversing ``rhs``
    back is then no operation at all: XLA:CPU does not cancel two reversals of a bfloat16 array,
    which it reverses in float32)."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    groups = params["feature_group_count"]
    kernel = [rhs.shape[a] for a in rhs_spec[2:]]
    found = _data_problem(params, dy.shape, rhs.shape, out_shape)
    if found is None:
        return "pad range"
    layout, p = found
    in_channels, out_per_group = rhs.shape[rhs_spec[0]], rhs.shape[rhs_spec[1]]
    n = len(kernel)
    # a constant filter (a served model's) in the kernel's layout once, when traced
    with jax.ensure_compile_time_eval() if packs(rhs) else contextlib.nullcontext():
        # W[k, i, g O/G + o] = rev(rhs)[g I/G + i, o, k]: the roles swapped back per group
        w = unreversed if unreversed is not None else lax.rev(rhs, tuple(rhs_spec[2:]))
        w = _to(w, (*rhs_spec[2:], rhs_spec[0], rhs_spec[1]))
        if groups > 1:
            w = w.reshape(*kernel, groups, in_channels // groups, out_per_group)
            w = w.transpose((*range(n), n + 1, n, n + 2)).reshape(
                *kernel, in_channels // groups, groups * out_per_group)
    dys = _to(dy, _nxc_axes(lhs_spec, layout))
    precision, out_dtype = _options(params)
    if packs(w):  # a served transposed convolution: its filter packed once (_packed)
        dx = _packed(dys, w, p, precision, out_dtype, lowering)
    else:
        dx = primitive.data_grad(dys, w, p=p, precision=precision,
                                 preferred_element_type=out_dtype, method=lowering)
    return _place(dx, _roles(layout, n), out_spec)


def _packed(dy: Array, w: Array, p: ConvProblem, precision: Any, out_dtype: Any,
            lowering: str) -> Array:
    """The data gradient of ``p`` whose filter ``w`` is a constant (in ``p``'s filter layout,
    computed when the program is traced): its filter packed once where oneDNN runs it, and the
    method chosen with oneDNN's candidates timed on it packed (``fused.data``; docs/onednn.md,
    "Packed filters")."""
    method = fused.onednn_method(p, dy.dtype, precision, out_dtype, lowering, True, Kernel.DATA)
    packed = None
    if method is not None:
        got, _ = fused.pack(np.asarray(w), p, method, Kernel.DATA)  # None: moved every call
        packed = None if got is None else (got, method)
    return fused.data(dy, w, p=p, precision=precision, preferred_element_type=out_dtype,
                      method=lowering, packed=packed, constant=True)


def weight_pattern(params: dict[str, Any], lhs: Array, dy: Array,
                   out_shape: Sequence[int], lowering: str = "auto") -> Array | str:
    """A weight gradient (module docstring): W from x (batch and feature swapped) and dy."""
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    strides, dil = params["rhs_dilation"], params["window_strides"]
    groups = params["batch_group_count"]
    kernel = [out_shape[a] for a in out_spec[2:]]
    pads = _weight_pads(params, lhs.shape, dy.shape, out_shape)
    if pads is None:
        return "pad range"
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


def _written_faster(eqn: Any, scope: Scope) -> bool:
    """Whether a transposed convolution the program wrote (input dilation, its own filter: not
    autodiff's reversed one) runs faster as written than as jaxconv's data-gradient kernel of
    its filter reversed and role-swapped (which XLA copies first; a constant filter: once, and
    packed, so that ours is timed reading the program's filter packed): the chooser times the
    two in the program's context, once per problem and machine (``chooser.as_written``). One
    with a dilated kernel stays jaxconv's: XLA:CPU may abort on it (docs/semantics.md)."""
    params, shape = eqn.params, eqn.outvars[0].aval.shape
    if any(d > 1 for d in params["rhs_dilation"]):  # never to XLA: it may abort (hazard 1)
        return False
    lhs, rhs = (v.aval for v in eqn.invars)
    found = _data_problem(params, lhs.shape, rhs.shape, shape)
    if found is None:
        return False
    precision, out_dtype = _options(params)

    fixed: Any = scope.env.get(eqn.invars[1])  # an array where the filter is a constant
    constant = packs(fixed)

    def ours(a: Array, b: Array) -> Array:
        out = written_pattern(params, a, fixed if constant else b, shape, scope.lowering)
        assert not isinstance(out, str), out
        return out

    def written(a: Array, b: Array) -> Array:
        out: Array = scope.equation(eqn, [a, b])[0]
        return out
    mirror = mirrored.problem(params, lhs.shape, rhs.shape, shape)
    return chooser.as_written(Kernel.DATA, found[1], lhs.dtype, precision, out_dtype,
                              shapes=(tuple(lhs.shape), tuple(rhs.shape)), ours=ours,
                              written=written, mirrored=(not isinstance(mirror, str)
                                                        and mirrored.mirrors(mirror)),
                              packed=constant)


def written_pattern(params: dict[str, Any], lhs: Array, rhs: Array, out_shape: Sequence[int],
                    lowering: str = "auto") -> Array | str:
    """A transposed convolution the program wrote (its own filter): mirrored where that reads
    the filter in place at less cost (``mirrored.py``), else :func:`data_pattern` of its
    filter reversed (a constant filter always: it is reversed and packed once)."""
    p = mirrored.problem(params, lhs.shape, rhs.shape, out_shape)
    if not isinstance(p, str) and mirrored.mirrors(p) and not packs(rhs):
        return mirrored.data_pattern(params, lhs, rhs, p, lowering)
    return data_pattern(params, lhs, rhs, out_shape, None, lowering)


class Convolution(Rewrite):
    """A ``conv_general_dilated`` equation as jaxconv's forward, data-gradient or
    weight-gradient kernel (module docstring)."""

    name = "convolution"
    primitives = frozenset({"conv_general_dilated"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        lhs, rhs = (v.aval for v in eqn.invars)
        before = filter_before_rev(eqn, scope.analysis.reversed_filters)
        kind = kernel_of(eqn.params, lhs, rhs, eqn.outvars[0].aval.shape, before is not None)
        if not isinstance(kind, Kernel):  # a reason (Kernel is a str enum: test it first)
            return kind
        if (kind is Kernel.DATA and before is None
                and any(d > 1 for d in eqn.params["lhs_dilation"])
                and _written_faster(eqn, scope)):
            return "written faster"
        # the filter before autodiff's rev, read in its place (module docstring)
        reads = (*eqn.invars, before) if before is not None and kind is Kernel.DATA else (
            tuple(eqn.invars))
        label = f"jaxconv's {kind.label} kernel"
        if kind is Kernel.DATA and before is None and packs(scope.env.get(eqn.invars[1])):
            label += "; the filter, a constant, packed once (where oneDNN runs it)"
        elif kind is Kernel.DATA and before is None:
            p = mirrored.problem(eqn.params, lhs.shape, rhs.shape, eqn.outvars[0].aval.shape)
            if not isinstance(p, str) and mirrored.mirrors(p):
                label += ", mirrored (its filter read in place)"
        return Match(self, eqn, reads, kind, label)

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        params, shape = match.eqn.params, match.eqn.outvars[0].aval.shape
        lhs, rhs, *rest = values
        if match.detail is Kernel.DATA and not rest:
            out = written_pattern(params, lhs, rhs, shape, scope.lowering)
        elif match.detail is Kernel.DATA:
            out = data_pattern(params, lhs, rhs, shape, rest[0], scope.lowering)
        elif match.detail is Kernel.WEIGHT:
            out = weight_pattern(params, lhs, rhs, shape, scope.lowering)
        else:
            out = forward_pattern(params, lhs, rhs, scope.lowering)
        assert not isinstance(out, str), out  # match resolved the pads
        return [out]
