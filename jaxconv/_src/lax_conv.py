"""``jaxconv.conv_general_dilated``: ``lax.conv_general_dilated``'s signature, jaxconv's gradients.

A model switches with one import line: the value equals
``lax.conv_general_dilated``'s, and ``jax.grad`` / ``jax.jvp`` run jaxconv's
kernels (``primitive.py``) instead of lax's transpose rules.

Any ``dimension_numbers`` are accepted: NXC/NCX data with XIO/OIX filters run
as they are; other orders are transposed to NXC/XIO (a copy) and the result to
the requested output order. Every call lax accepts is accepted. Where jaxconv has
no kernel, the call is ``lax.conv_general_dilated`` itself (same value, lax's
gradients): operands that are not real floating point (complex, integer, bool),
0 or more than 3 spatial axes, an input dilation (``lhs_dilation`` > 1, a
transposed convolution: use :func:`jaxconv.conv_transpose` for jaxconv's
gradients), ``batch_group_count`` > 1, ``out_sharding``, or a zero-size extent (of
lhs, rhs or the result); lax's hand-offs crop a negative pad with ``lax.slice`` first. A
negative pad (a crop) elsewhere is a ``lax.slice`` of lhs, then jaxconv's kernel: no negative
pad reaches XLA (``lax_refs``). A call lax rejects is rejected
before anything runs, with lax's exception type (TypeError or ValueError) and a
message prefixed ``conv_general_dilated:``; lax's unknown padding string
(RuntimeError there) and a non-array operand (AttributeError there) raise
ValueError and TypeError here, and a zero or negative stride or dilation, which
lax's shape rule lets through to fail in the compiler, is a ValueError.
"""

from __future__ import annotations

import functools
import typing
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import geometry, lax_refs, options, primitive
from jaxconv._src.geometry import Names
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import chooser
from jaxconv._src.typing import ArrayLike, DTypeLike, ForwardLowering, PrecisionLike

_OP = "conv_general_dilated"
_NAMES = Names(x="lhs", y="output", w_shape="rhs", w_format="dimension_numbers",
               layout_arguments=False)

ConvDimensionNumbersLike = (
    lax.ConvDimensionNumbers | tuple[str, str, str] | tuple[Sequence[int], Sequence[int],
                                                            Sequence[int]] | None
)


def _ints(name: str, value: Sequence[int] | None, n: int) -> tuple[int, ...]:
    return geometry.int_tuple(_OP, name, value, n, default=1, minimum=1)


def _pads(padding: str | Sequence[tuple[int, int]], in_size: Sequence[int],
          window: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "SAME_LOWER", "VALID"):
            raise ValueError(f"{_OP}: padding must be 'SAME', 'SAME_LOWER', 'VALID' or a sequence "
                             f"of (low, high) pairs, got {padding!r}")
        return [(int(lo), int(hi)) for lo, hi in lax.padtype_to_pads(in_size, window, strides, padding)]
    pairs = list(padding)
    if len(pairs) != len(in_size) or not all(
            isinstance(pq, (tuple, list)) and len(pq) == 2 for pq in pairs):
        raise ValueError(f"{_OP}: padding must hold {len(in_size)} (low, high) pairs, one per "
                         f"spatial axis, got {padding!r}")
    return [(int(lo), int(hi)) for lo, hi in pairs]


def conv_general_dilated(
    lhs: ArrayLike,
    rhs: ArrayLike,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: ConvDimensionNumbersLike = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: PrecisionLike = None,
    preferred_element_type: DTypeLike | None = None,
    out_sharding: Any = None,
    *,
    lowering: ForwardLowering = "auto",
) -> jax.Array:
    r"""``lax.conv_general_dilated`` whose derivatives are jaxconv's kernels.

    With ``lhs_dilation`` 1 (jaxconv's kernels; otherwise this is lax itself), per output
    position ``o`` and group ``g``:

    .. math::
        out[n, g \cdot O_g + oc, o] = \sum_{ic, k} lhs[n, g \cdot I_g + ic, o S + k D - p_{lo}]
        \, rhs[g \cdot O_g + oc, ic, k]

    with ``S = window_strides``, ``D = rhs_dilation``, ``lhs`` zero outside its extent, in
    the axis orders ``dimension_numbers`` name: NXC data (``"NHWC"``) with an XIO filter
    (``"HWIO"``), or NCX (``"NCHW"``) with OIX (``"OIHW"``), run as they are; any other order
    is transposed to NXC/XIO and back. ``jax.grad``, ``jax.jvp`` and ``jax.vmap``
    compose as with lax; the derivatives are jaxconv's data and weight gradients.

    Args:
      lhs: the input, in the order ``dimension_numbers`` gives.
      rhs: the filter, likewise.
      window_strides: one positive int per spatial axis.
      padding: ``"SAME"``, ``"SAME_LOWER"``, ``"VALID"`` or one (low, high) pair per
        spatial axis.
      lhs_dilation: input dilation (a transposed convolution; computed by lax).
      rhs_dilation: filter dilation.
      dimension_numbers: as in ``lax.conv_general_dilated`` (strings such as
        ``("NHWC", "HWIO", "NHWC")``, index tuples, or ``None`` for NCHW/OIHW).
      feature_group_count: groups of input channels.
      batch_group_count: as in lax (values > 1 are computed by lax).
      precision: as in lax; ``lax.Precision.HIGHEST`` for exact float32 on GPU/TPU.
      preferred_element_type: the result and accumulation dtype.
      out_sharding: as in lax (explicit sharding mode); when given, lax computes the call.
      lowering: jaxconv's forward formulation, as in :func:`jaxconv.convolution`
        (where lax computes the call, only ``"auto"`` is accepted; the module
        docstring lists those calls).

    Returns:
      The value of ``lax.conv_general_dilated`` with the same arguments.

    Raises:
      ValueError: where lax raises ValueError (inconsistent channels or groups,
        ...), and for an unknown padding string or a non-positive stride or
        dilation (message prefixed with ``conv_general_dilated:``).
      TypeError: where lax raises TypeError (mismatched ranks or dtypes, a
        wrong number of pads or dimension numbers, ...), and non-array operands.

    Example:
      >>> import jax, jax.numpy as jnp, jaxconv
      >>> x, w = jnp.ones((2, 8, 8, 4)), jnp.ones((3, 3, 4, 6))
      >>> dn = ("NHWC", "HWIO", "NHWC")
      >>> y = jaxconv.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=dn)
      >>> y.shape
      (2, 4, 4, 6)
      >>> gw = jax.grad(lambda w: jaxconv.conv_general_dilated(
      ...     x, w, (2, 2), "SAME", dimension_numbers=dn).sum())(w)
      >>> float(gw[1, 1, 0, 0])
      32.0
    """
    lax_call = functools.partial(
        lax_refs.conv, window_strides=window_strides, padding=padding,
        lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=typing.cast(Any, dimension_numbers),  # lax checks the kind itself
        feature_group_count=feature_group_count, batch_group_count=batch_group_count,
        precision=precision, preferred_element_type=preferred_element_type,
        out_sharding=out_sharding)
    refused = _lax_refusal(lax_call, lhs, rhs)
    if refused is not None:  # lax's exception type, our message where we have one
        try:
            jax.eval_shape(lambda: _jaxconv(lhs, rhs, lax_call, window_strides, padding,
                                            lhs_dilation, rhs_dilation, dimension_numbers,
                                            feature_group_count, batch_group_count, precision,
                                            preferred_element_type, out_sharding, lowering))
        except (TypeError, ValueError) as ours:
            kind = type(refused) if isinstance(refused, (TypeError, ValueError)) else type(ours)
            mine = str(ours).startswith(f"{_OP}: ")  # else lax's own words, from a call it computes
            # lax's own words come along, so that code matching lax's messages keeps working
            raise kind(f"{ours} (lax.conv_general_dilated: {refused})" if mine
                       else f"{_OP}: {refused}") from None
        kind = type(refused) if isinstance(refused, (TypeError, ValueError)) else ValueError
        raise kind(f"{_OP}: {refused}") from None
    return _jaxconv(lhs, rhs, lax_call, window_strides, padding, lhs_dilation, rhs_dilation,
                    dimension_numbers, feature_group_count, batch_group_count, precision,
                    preferred_element_type, out_sharding, lowering)


def forward_operands(x: Any, w: Any, dn: lax.ConvDimensionNumbers, strides: Sequence[int],
                     pads: Sequence[tuple[int, int]], rhs_dilation: Sequence[int], groups: int
                     ) -> tuple[Any, Any, Any]:
    """The operands of a forward convolution of ``dimension_numbers`` ``dn`` (pads at least 0)
    in jaxconv's layouts, and its problem: data (N, *X, C) with filter (*X, I, O), or
    (N, C, *X) with (O, I, *X) where both already are (no transpose)."""
    lhs_spec, _, _ = dn
    ws, filter_format = forward_filter(w, dn)
    if filter_format == "OIX":
        data_format, xs = "NCX", x
    else:
        data_format = "NXC"
        xs = _transposed(x, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
    p = geometry.convolution_problem(
        _OP, _NAMES, x_shape=tuple(xs.shape), y_shape=None, w_shape=tuple(ws.shape),
        strides=tuple(strides), pads_begin=[lo for lo, _ in pads],
        pads_end=[hi for _, hi in pads], dilations=tuple(rhs_dilation), auto_pad="explicit",
        groups=groups, data_format=data_format, filter_format=filter_format)
    return xs, ws, p


def forward_filter(w: Any, dn: lax.ConvDimensionNumbers) -> tuple[Any, str]:
    """The filter of :func:`forward_operands` (a host array stays one) and its format."""
    lhs_spec, rhs_spec, _ = dn
    n = w.ndim - 2
    if tuple(lhs_spec) == tuple(range(n + 2)) and tuple(rhs_spec) == tuple(range(n + 2)):
        return w, "OIX"
    return _transposed(w, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])), "XIO"


def _transposed(a: Any, perm: Sequence[int]) -> Any:
    return a if tuple(perm) == tuple(range(a.ndim)) else a.transpose(perm)


def _lax_refusal(lax_call: Any, lhs: Any, rhs: Any) -> Exception | None:
    """What ``lax.conv_general_dilated`` raises for this call (abstractly: nothing is computed).

    The verdict depends only on the operands' shapes and dtypes and on the other arguments,
    so it is cached by them (an abstract trace of lax costs more than an eager call of it);
    arguments that cannot be hashed are checked every time.
    """
    try:
        key = (_frozen([np.shape(lhs), lhs.dtype, np.shape(rhs), rhs.dtype]),
               _frozen(sorted(lax_call.keywords.items())))
        hash(key)
    except (AttributeError, TypeError):  # a non-array operand, an unhashable argument
        return _refusal(lax_call, lhs, rhs)
    return _cached_refusal(key, lax_call, lhs, rhs)


def _frozen(v: Any) -> Any:
    """``v`` with its lists and plain tuples made hashable, each tagged with its kind (lax may
    treat a list and a tuple differently: the verdict of one is not the other's)."""
    if isinstance(v, list) or type(v) is tuple:
        return (type(v).__name__, *(_frozen(u) for u in v))
    return v


_REFUSALS: dict[Any, Exception | None] = {}


def _cached_refusal(key: Any, lax_call: Any, lhs: Any, rhs: Any) -> Exception | None:
    if key not in _REFUSALS:
        if len(_REFUSALS) >= 1024:  # bounded: forget the oldest verdict
            del _REFUSALS[next(iter(_REFUSALS))]
        _REFUSALS[key] = _refusal(lax_call, lhs, rhs)
    return _REFUSALS[key]


def _refusal(lax_call: Any, lhs: Any, rhs: Any) -> Exception | None:
    try:
        args = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in (lhs, rhs)]  # type: ignore[no-untyped-call]
        with warnings.catch_warnings():  # lax's shape rule divides by a zero stride
            warnings.simplefilter("ignore", RuntimeWarning)
            jax.eval_shape(lax_call, *args)
    except Exception as e:  # noqa: BLE001 - lax's own refusal, whatever its type
        return e
    return None


def _jaxconv(lhs: ArrayLike, rhs: ArrayLike, lax_call: Any, window_strides: Sequence[int],
             padding: str | Sequence[tuple[int, int]], lhs_dilation: Sequence[int] | None,
             rhs_dilation: Sequence[int] | None, dimension_numbers: ConvDimensionNumbersLike,
             feature_group_count: int, batch_group_count: int, precision: PrecisionLike,
             preferred_element_type: DTypeLike | None, out_sharding: Any,
             lowering: ForwardLowering) -> jax.Array:
    """The call through jaxconv's forward kernel, or ``lax_call`` where jaxconv has none."""
    def by_lax(why: str) -> jax.Array:
        if lowering not in ("auto", "direct"):
            raise ValueError(
                f"{_OP}: lowering must be 'auto' or 'direct' where lax computes the call ({why}; see the "
                f"docstring), got {lowering!r}")
        out: jax.Array = lax_call(lhs, rhs)
        return out

    arrays = {name: geometry.check_array(_OP, name, v) for name, v in (("lhs", lhs), ("rhs", rhs))}
    dtype = arrays["lhs"].dtype
    if dtype == arrays["rhs"].dtype and not jnp.issubdtype(dtype, jnp.floating):
        return by_lax("operands not real floating point")
    (x, w), valid_precision, out_dtype = options.check_inputs(
        _OP, arrays, precision, preferred_element_type, floating=False)
    if x.ndim != w.ndim or x.ndim < 2:
        raise ValueError(f"{_OP}: lhs and rhs must have the same rank >= 2, got shapes "
                         f"{list(x.shape)} and {list(w.shape)}")
    n = x.ndim - 2
    try:
        dn = lax.conv_dimension_numbers(x.shape, w.shape, dimension_numbers)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{_OP}: dimension_numbers {dimension_numbers!r} do not fit lhs "
                         f"{list(x.shape)} and rhs {list(w.shape)}: {e}") from None
    strides = _ints("window_strides", window_strides, n)
    lhs_dil = _ints("lhs_dilation", lhs_dilation, n)
    rhs_dil = _ints("rhs_dilation", rhs_dilation, n)
    groups = geometry.check_groups(_OP, feature_group_count)
    batch_groups = geometry.check_groups(_OP, batch_group_count)
    lhs_spec, rhs_spec, out_spec = dn
    if isinstance(padding, str) and any(d > 1 for d in lhs_dil):
        raise ValueError(f"{_OP}: string padding {padding!r} is not defined with lhs_dilation "
                         f"{list(lhs_dil)} (a transposed convolution), as in lax; give (low, "
                         f"high) pairs, or use jaxconv.conv_transpose")
    in_size = [x.shape[a] for a in lhs_spec[2:]]
    window = [(w.shape[a] - 1) * d + 1 for a, d in zip(rhs_spec[2:], rhs_dil)]
    pads = _pads(padding, [(i - 1) * d + 1 for i, d in zip(in_size, lhs_dil)], window, strides)
    out_size = [(i + lo + hi - k) // s + 1 for i, (lo, hi), k, s in zip(in_size, pads, window, strides)]
    if all(d == 1 for d in lhs_dil) and min(out_size, default=1) > 0:
        # a negative pad is a crop: lax.slice first (XLA:CPU computes a convolution with a
        # negative pad from the memory beside its input: lax_refs), then jaxconv's kernel
        x, cropped = lax_refs.crop_operands(x, {"padding": pads, "dimension_numbers": dn})
        pads = [tuple(p) for p in cropped["padding"]]
    why_lax = chooser.lax_computes(n, (*x.shape, *w.shape, *out_size), out_sharding=out_sharding,
                                   lhs_dilation=lhs_dil, batch_groups=batch_groups)
    if why_lax is not None:
        return by_lax(why_lax)
    xs, ws, p = forward_operands(x, w, dn, strides, pads, rhs_dil, groups)
    src = p.data.spec  # where N, C, *X are in our result
    y = primitive.forward(xs, ws, p=p, precision=valid_precision,
                         preferred_element_type=out_dtype,
                         method=options.check_lowering(_OP, Kernel.FORWARD, lowering, p))
    perm = [0] * (n + 2)  # result axis that goes to each output axis
    for role, axis in enumerate(out_spec):
        perm[axis] = src[role]
    return y if perm == list(range(n + 2)) else y.transpose(perm)
