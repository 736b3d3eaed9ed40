"""The fused-chain rewrite: a forward convolution and the element-wise chain after it as one
primitive (``lowering/fused.py``: oneDNN's post-ops, where oneDNN runs the forward).

A chain starts at a ``conv_general_dilated`` equation that is a forward convolution (the
convolution rewrite's forward kernel: no input dilation, no batch groups, float32, bfloat16 or
float16 in and out, its result in its input's layout, pads of at least 0) and goes on through
equations each of which is the only reader of the value so far (nothing else needs an intermediate value: a training step's
derivatives do, so its chains stay as written) and computes one or more post-ops
(``fused.PostOp``) of it:

* ``add``, ``sub``, ``mul``, ``div``, ``max``, ``min`` of the value (for ``sub`` and ``div`` as
  the first operand) and a scalar or an array that varies along the channel axis alone (a
  bias; BatchNorm's mean, scale and offset in inference mode, as flax writes them), or an
  array of the value's shape and dtype (a residual); ``max`` with the literal 0 is ReLU;
* ``clamp`` between two literals, ``tanh``, ``logistic``;
* ``convert_element_type`` between float32 and the convolution's 16-bit dtype (a mixed-precision
  chain, as the widening pass writes it: ``accelerate/widening.py``); the chain ends in the
  convolution's dtype (or in float32 rounded from it: :func:`_typed`), and a residual read in
  float32 is read in the convolution's dtype where it is one widened;
* a ``mul`` by BatchNorm's normalizer, ``rsqrt(var + eps)`` (times its scale), computed from
  channel vectors that nothing else reads (flax's inference BatchNorm): ``mul_rsqrt`` of the
  variance with ``eps`` (then ``mul`` of the scale), so that the handler computes the
  normalizer inside its call and XLA runs no operation of its own per BatchNorm;
* a ``custom_jvp_call`` or a nested ``jit`` whose body is such a chain of its first input with
  literal operands, or scalars passed in as literals (``jax.nn.relu``, ``jax.nn.relu6``,
  ``jnp.clip``); ``max(0)`` then ``min(c)`` is one clip; a ``jit`` whose body is
  ``x * logistic(x)`` (``jax.nn.silu``) is oneDNN's swish.

Where two chains meet in an ``add`` (a residual block whose shortcut is a convolution too), the
add continues its second operand's chain (flax's ``x + y``, ``y`` the block's last convolution)
and reads the first as its residual. ``match`` takes the chain's last equation: one whose result
is not the value a next chain equation continues. ``emit`` computes the whole chain by the fused
primitive from the convolution's operands and the post-ops' operands; the convolution and the
chain's earlier equations, whose results nothing else reads, are left to XLA to drop. A float32
filter that is a constant of the program takes the chain's leading affine run (BatchNorm) folded
in once, when traced (``folded.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Literal

from jaxconv._src import lax_conv, options
from jaxconv._src.accelerate.rewrites import folded
from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope, packs
from jaxconv._src.accelerate.rewrites.convolution import kernel_of
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import chooser, fused
from jaxconv._src.lowering.fused import PostOp

#: the binary equations a chain reads, and those whose operands commute
_BINARY = frozenset(fused.BINARY)
_COMMUTE = frozenset({"add", "mul", "max", "min"})
#: the nested jaxprs a chain equation may be (their body a chain of literals)
_NESTED = {"custom_jvp_call": "call_jaxpr", "jit": "jaxpr", "pjit": "jaxpr"}

#: the dtypes of the convolutions that start a chain
_DTYPES = tuple(np.dtype(d) for d in fused.CONVERTS)
#: one post-op of a chain equation and its operand (None, a Literal or a variable)
Step = tuple[PostOp, Any]


def _channels(aval: Any, y: Any, channel_axis: int) -> bool:
    """Whether ``aval`` is a scalar or varies along ``y``'s channel axis alone."""
    shape = tuple(aval.shape)
    if shape == ():
        return True
    return (len(shape) == len(y.shape) and shape[channel_axis] == y.shape[channel_axis]
            and all(d == 1 for a, d in enumerate(shape) if a != channel_axis))


def _steps(eqn: Any, v: Any, y: Any, channel_axis: int, literals_only: bool = False
           ) -> list[Step] | None:
    """``eqn`` as post-ops of the value ``v`` (abstract value ``y``), or None."""
    name = eqn.primitive.name
    if len(eqn.outvars) != 1 or eqn.outvars[0].aval.shape != y.shape:
        return None
    if name == "convert_element_type":
        to = np.dtype(eqn.params["new_dtype"])
        if (list(eqn.invars) != [v] or to.name not in fused.CONVERTS
                or np.dtype(y.dtype).name not in fused.CONVERTS
                or eqn.params.get("sharding") is not None):
            return None
        return [(PostOp("convert", to.name), None)] if to != y.dtype else []
    if eqn.outvars[0].aval.dtype != y.dtype:
        return None
    if name in _NESTED:
        body = eqn.params.get(_NESTED[name])
        body = body.jaxpr if isinstance(body, ClosedJaxpr) else body
        if (body is None or not eqn.invars or eqn.invars[0] is not v or body.constvars
                or len(body.invars) != len(eqn.invars)
                or not all(isinstance(u, Literal) and np.ndim(u.val) == 0
                           for u in eqn.invars[1:])):
            return None
        if _silu(body):
            return [(PostOp("eltwise", "swish"), None)]
        # scalar literals passed in (jnp.clip's bounds), and their converts: the body's literals
        known: dict[Any, Any] = dict(zip(body.invars[1:], eqn.invars[1:]))
        steps, value = [], body.invars[0]
        for inner in body.eqns:
            ins = [u if isinstance(u, Literal) else known.get(u, u) for u in inner.invars]
            if inner.primitive.name == "convert_element_type" and isinstance(ins[0], Literal):
                (out,) = inner.outvars
                scalar = np.asarray(ins[0].val, out.aval.dtype)
                known[out] = Literal(scalar, out.aval)  # type: ignore[no-untyped-call]
                continue
            got = _steps(inner.replace(invars=ins), value, value.aval, channel_axis,
                         literals_only=True)
            if got is None:
                return None
            steps += got
            value = inner.outvars[0]
        return _clips(steps) if list(body.outvars) == [value] and steps else None
    if name in ("tanh", "logistic"):
        return [(PostOp("eltwise", name), None)] if list(eqn.invars) == [v] else None
    if name == "clamp":
        lo, x, hi = eqn.invars
        if x is not v or not isinstance(lo, Literal) or not isinstance(hi, Literal):
            return None
        return [(PostOp("eltwise", "clip", float(lo.val), float(hi.val)), None)]
    if name not in _BINARY:
        return None
    a, b = eqn.invars
    if b is v and a is not v and name in _COMMUTE:
        a, b = b, a
    if a is not v or b is v:
        return None
    if isinstance(b, Literal):
        if name == "max" and float(b.val) == 0.0:
            return [(PostOp("eltwise", "relu"), None)]
        return [(PostOp("channel", name), b)]
    if literals_only:
        return None
    if _channels(b.aval, y, channel_axis):
        return [(PostOp("channel", name), b)]
    if tuple(b.aval.shape) == tuple(y.shape) and b.aval.dtype == y.dtype:
        return [(PostOp("tensor", name), b)]
    return None


def _silu(body: Any) -> bool:
    """Whether ``body`` is ``x * logistic(x)`` of its one input (``jax.nn.silu``'s)."""
    if len(body.invars) != 1 or len(body.eqns) != 2:
        return False
    (x,), (sig, mul) = body.invars, body.eqns
    return (sig.primitive.name == "logistic" and list(sig.invars) == [x]
            and mul.primitive.name == "mul" and set(mul.invars) == {x, sig.outvars[0]}
            and len(mul.invars) == 2 and list(body.outvars) == [mul.outvars[0]])


def _clips(steps: list[Step]) -> list[Step]:
    """``max`` then ``min`` with literal bounds (ReLU6's body) as one clip."""
    out: list[Step] = []
    for op, side in steps:
        if op.alg == "min" and isinstance(side, Literal) and out:
            last, last_side = out[-1]
            low = (0.0 if last.alg == "relu" else float(last_side.val)
                   if last.alg == "max" and isinstance(last_side, Literal) else None)
            if low is not None:
                out[-1] = (PostOp("eltwise", "clip", low, float(side.val)), None)
                continue
        out.append((op, side))
    return out


def _forward(eqn: Any) -> str | None:
    """Why the convolution ``eqn`` does not start a chain (None where it does)."""
    params = eqn.params
    lhs, rhs = (v.aval for v in eqn.invars)
    out = eqn.outvars[0].aval
    if kernel_of(params, lhs, rhs, out.shape) is not Kernel.FORWARD:
        return "no forward"
    if lhs.dtype not in _DTYPES or not lhs.dtype == rhs.dtype == out.dtype:
        return "fused dtype"
    if (any(d != 1 for d in params["lhs_dilation"]) or params["batch_group_count"] != 1
            or any(lo < 0 or hi < 0 for lo, hi in params["padding"])
            or params["preferred_element_type"] not in (None, out.dtype)):
        return "no forward"
    lhs_spec, _, out_spec = params["dimension_numbers"]
    n = lhs.ndim - 2
    if tuple(lhs_spec) != tuple(out_spec) or tuple(lhs_spec) not in (
            tuple(range(n + 2)), (0, n + 1, *range(1, n + 1))):
        return "fused layout"
    if chooser.lax_computes(n, (*lhs.shape, *rhs.shape, *out.shape)) is not None:
        return "no forward"
    return None


class FusedConvolution(Rewrite):
    """A forward convolution and its element-wise chain, as one fused primitive (module
    docstring)."""

    name = "fused chain"
    primitives = frozenset({*_BINARY, "clamp", "tanh", "logistic", "convert_element_type",
                            *_NESTED})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        found = _chain(eqn, scope.analysis, scope.narrow)
        if found == "no fused chain":
            return found
        (out,) = eqn.outvars
        readers = scope.analysis.reading.get(out, [])
        if len(readers) == 1 and out not in scope.analysis.results:
            carried = _carried(readers[0], scope.analysis)
            if carried is not None and carried[0] is out:  # its chain, through ours
                return "chain goes on"
        if isinstance(found, str):
            return found
        conv, steps, dtype = found
        reads = (*conv.invars, *(side for _, side in steps if side is not None))
        label = "post-ops " + " ".join(_describe(op) for op, _ in steps)
        if packs(scope.env.get(conv.invars[1])):
            label += "; the filter, a constant, packed once"
            run = _folds(conv, steps, scope)
            if run is not None:
                label += f" with the first {run[0]} post-ops folded in"
        return Match(self, eqn, tuple(reads), (conv, tuple(op for op, _ in steps), dtype),
                     f"{label} (where oneDNN runs the forward)")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        conv, post, dtype = match.detail
        x, w, *sides = values
        params = conv.params
        xs, ws, p = lax_conv.forward_operands(
            x, w, params["dimension_numbers"], params["window_strides"],
            [tuple(q) for q in params["padding"]], params["rhs_dilation"],
            params["feature_group_count"])
        channels = Kernel.FORWARD.out_shape(p)[p.data.channel_axis]
        host = None  # the filter in p's layout, on the host, where it is a constant
        run = _folds(conv, tuple(zip(post, _sides(match, post))), scope) if packs(w) else None
        if run is not None:  # its leading affine run folded into it, once (folded.py)
            length, a, b = run
            filt, fmt = lax_conv.forward_filter(np.asarray(w), params["dimension_numbers"])
            host = folded.scaled(filt, fmt, a)
            ws = jnp.asarray(host)
            post = (PostOp("channel", "add"), *post[length:])
            sides = [b.astype(np.float32), *sides[length:]]
            reads = (None, *match.reads[2 + length:])
        else:
            reads = match.reads[2:]
        operands, it = [], iter(zip(reads, sides))
        for op in post:
            if not op.binary:
                continue
            var, side = next(it)
            if op.kind == "tensor" and side.dtype != x.dtype and var in scope.narrow:
                side = scope.narrow[var]  # a chain's 16-bit result, which the program widened
            side = jnp.asarray(side)
            if op.kind == "channel":
                side = jnp.broadcast_to(side.astype(jnp.float32).reshape(-1), (channels,))
            operands.append(side)
        precision, out_dtype = options.compute_options(
            "accelerate", params["precision"], params["preferred_element_type"])
        packed, fixed = None, packs(w)
        method = fused.onednn_method(p, xs.dtype, precision, out_dtype, scope.lowering, fixed)
        if method is not None and fixed:  # packed once, not moved every call
            if host is None:
                host, _ = lax_conv.forward_filter(np.asarray(w), params["dimension_numbers"])
            got, _ = fused.pack(host, p, method, post=post, operands=operands)  # None: moved
            packed = None if got is None else (got, method)
        y = fused.forward(xs, ws, operands, p=p, post=post, precision=precision,
                          preferred_element_type=out_dtype, method=scope.lowering,
                          packed=packed, constant=fixed)
        if y.dtype == dtype:
            return [y]
        (end,) = match.eqn.outvars
        scope.narrow[end] = y  # a convert back reads it (the narrowing rewrite)
        return [y.astype(dtype)]


def _sides(match: Match, post: Sequence[PostOp]) -> list[Any]:
    """Each post-op's operand variable (None for a unary one), as ``match`` read them."""
    it = iter(match.reads[2:])
    return [next(it) if op.binary else None for op in post]


def _folds(conv: Any, steps: Sequence[tuple[PostOp, Any]], scope: Scope
           ) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The leading affine run of a float32 chain of ``conv`` that folds into its filter, a
    constant (``folded.affine_run``), or None."""
    lhs, rhs = (v.aval for v in conv.invars)
    out = conv.outvars[0].aval
    if not np.dtype(lhs.dtype) == np.dtype(rhs.dtype) == np.dtype(out.dtype) == np.float32:
        return None
    lhs_spec = conv.params["dimension_numbers"][0]
    return folded.affine_run(steps, scope, out.shape[lhs_spec[1]])


def _operand_order(eqn: Any) -> list[Any]:
    """The operands that may carry a chain into ``eqn``, in the order they are tried: the
    second of a binary equation first (module docstring)."""
    ins = [v for v in eqn.invars if not isinstance(v, Literal)]
    if eqn.primitive.name in _BINARY:
        return ins[::-1]
    if eqn.primitive.name == "clamp":
        return [eqn.invars[1]] if not isinstance(eqn.invars[1], Literal) else []
    return ins


def _carried(eqn: Any, analysis: Any) -> tuple[Any, Any, list[Step]] | None:
    """The value a chain carries into ``eqn`` (the first of :func:`_operand_order` that only
    ``eqn`` reads and that ``eqn`` computes post-ops of), its producer and those post-ops; or
    None."""
    for v in _operand_order(eqn):
        producer = analysis.producer.get(v)
        if producer is None or analysis.readers(v) != 1:
            continue
        axis = _channel_axis(v.aval, producer, analysis)
        got = _steps(eqn, v, v.aval, axis)
        if got is not None:
            return v, producer, [s for step in got
                                 for s in _normalizer(step, v.aval, axis, analysis)]
    return None


def _normalizer(step: Step, y: Any, channel_axis: int, analysis: Any) -> list[Step]:
    """A channel ``mul`` by ``rsqrt(u + eps)`` or ``rsqrt(u + eps) * s`` (module docstring) as
    ``mul_rsqrt`` of ``u`` (then ``mul`` of ``s``), where each vector between is read only on
    the way; else ``[step]``."""
    op, side = step
    if op != PostOp("channel", "mul") or isinstance(side, Literal):
        return [step]

    def made(v: Any, name: str) -> Any:  # v's producer, if a `name` only it feeds
        eqn = analysis.producer.get(v)
        ok = (eqn is not None and eqn.primitive.name == name and analysis.readers(v) == 1
              and v not in analysis.results)
        return eqn if ok else None

    scale, root = None, made(side, "rsqrt")
    if root is None and (product := made(side, "mul")) is not None:
        for r, s in (product.invars, product.invars[::-1]):
            if not isinstance(r, Literal) and (root := made(r, "rsqrt")) is not None:
                scale = s
                break
    total = made(root.invars[0], "add") if root is not None else None
    if total is None:
        return [step]
    u, eps = total.invars
    if isinstance(u, Literal):
        u, eps = eps, u
    if (isinstance(u, Literal) or not isinstance(eps, Literal) or np.shape(eps.val) != ()
            or not _channels(u.aval, y, channel_axis) or u.aval.dtype != np.float32
            or (scale is not None and not isinstance(scale, Literal)
                and not _channels(scale.aval, y, channel_axis))):
        return [step]
    steps: list[Step] = [(PostOp("channel", "mul_rsqrt", float(eps.val)), u)]
    return steps + ([(PostOp("channel", "mul"), scale)] if scale is not None else [])


def _chain(eqn: Any, analysis: Any, narrow: dict[Any, Any]
           ) -> tuple[Any, list[Step], np.dtype] | str:
    """The convolution, the post-ops and the result's dtype of the chain that ends at ``eqn``
    (:func:`_typed`), or why none."""
    steps: list[Step] = []
    end = eqn.outvars[0]
    while True:
        found = _carried(eqn, analysis)
        if found is None:  # the chain does not reach a convolution
            return "no fused chain"
        _, producer, got = found
        steps = got + steps
        if producer.primitive.name == "conv_general_dilated":
            why = _forward(producer)
            return why if why is not None else _typed(producer, steps, end, analysis, narrow)
        eqn = producer


def _typed(conv: Any, steps: list[Step], end: Any, analysis: Any, narrow: dict[Any, Any]
           ) -> tuple[Any, list[Step], np.dtype] | str:
    """The chain of ``conv`` as the fused call computes it, in the convolution's dtype, and
    the dtype of ``end``, its last value, which the call's result is converted to; or why not.

    A tensor operand read in float32 where the program widened it from the convolution's
    dtype, or where it is an earlier fused chain's 16-bit result widened (``narrow``), is read
    in that dtype (exact, and half the bytes); any other is read in float32. The call's
    post-ops end where the chain last is in the convolution's dtype; converts after that are
    the result's. A 16-bit chain whose
    arithmetic goes on in float32 past that point ends rounded to its dtype where a reader of
    ``end`` rounds it so (flax's BatchNorm result, which the widening pass keeps in float32 for
    its element-wise readers: they read the rounded value, as the program reads it); else it
    is refused (module docstring)."""
    dtype = np.dtype(conv.outvars[0].aval.dtype)
    out, last = [], 0
    for (op, side), at in zip(steps, fused.dtypes([op for op, _ in steps], dtype)):
        if op.kind == "tensor" and side.aval.dtype != dtype and not (
                side in narrow and narrow[side].dtype == dtype):
            widening = analysis.producer.get(side)
            if (widening is not None and widening.primitive.name == "convert_element_type"
                    and not isinstance(widening.invars[0], Literal)
                    and widening.invars[0].aval.dtype == dtype):
                side = widening.invars[0]
        out.append((op, side))
        if at == dtype:
            last = len(out)
    if any(op.kind != "convert" for op, _ in out[last:]):
        rounded = any(r.primitive.name == "convert_element_type"
                      and np.dtype(r.params["new_dtype"]) == dtype
                      for r in analysis.reading.get(end, []))
        if not rounded:
            return "fused dtype"
        out, last = [*out, (PostOp("convert", dtype.name), None)], len(out) + 1
    if not any(op.kind != "convert" for op, _ in out[:last]):
        return "no fused chain"
    return conv, out[:last], np.dtype(end.aval.dtype)


def _channel_axis(y: Any, producer: Any, analysis: Any) -> int:
    """The channel axis of the chain value ``y``: its convolution's output feature axis
    (followed back through the chain's producers), else the last axis."""
    seen = 0
    while producer is not None and seen < 64:
        if producer.primitive.name == "conv_general_dilated":
            return int(producer.params["dimension_numbers"][2][1])
        operands = [u for u in producer.invars if not isinstance(u, Literal)
                    and tuple(u.aval.shape) == tuple(y.shape)]
        producer = analysis.producer.get(operands[-1]) if operands else None
        seen += 1
    return int(y.ndim) - 1


def _describe(op: PostOp) -> str:
    """``relu``, ``clip(0, 6)``, ``mul(c)`` (by a channel vector), ``add(t)`` (a tensor),
    ``mul_rsqrt(c, 1e-05)`` (its epsilon), ``float32`` (a convert)."""
    if op.alg == "mul_rsqrt":
        return f"mul_rsqrt(c, {op.alpha:g})"
    if op.kind == "convert":
        return op.alg
    if op.kind == "eltwise":
        return f"clip({op.alpha:g}, {op.beta:g})" if op.alg == "clip" else op.alg
    return f"{op.alg}({'c' if op.kind == 'channel' else 't'})"
