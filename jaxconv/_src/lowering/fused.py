"""A forward convolution and the element-wise chain after it, as one primitive (fused chains).

Serving a CNN computes, per convolution, ``y = conv(x, W)`` and then a chain of element-wise
functions of ``y`` that XLA computes in one more pass over ``y``: a bias, BatchNorm in inference
mode (a per-channel affine map: subtract the mean, multiply by ``scale / sqrt(var + eps)``, add
the offset), a residual, an activation. oneDNN computes such a chain on each output while it is
in registers, before it is stored (its post-ops): no second pass. So the chain is a list of
:class:`PostOp`, each one of

* an element-wise function of the value so far (``eltwise``: ReLU, clip to ``[alpha, beta]``
  (ReLU6), tanh, logistic, swish (SiLU: y * logistic(y)));
* a binary operation of the value so far and an operand, in that order (``add``, ``sub``,
  ``mul``, ``div``, ``max``, ``min``): a float32 vector of the output channels (``channel``), or a
  tensor of y's shape (``tensor``: a residual) in x's dtype or, where the chain is float32 at
  that point, in float32;
* ``mul_rsqrt`` (``channel`` only): the value times ``rsqrt(c + alpha)``, for a channel vector
  ``c``: BatchNorm's normalizer from its running variance and epsilon, so that the program's
  per-call arithmetic on BatchNorm's vectors runs inside the call, not as XLA operations of its
  own (``accelerate/rewrites/fused.py``);
* ``convert`` to float32 or back to the convolution's 16-bit dtype (``alg``, the dtype's name):
  a mixed-precision chain (flax's BatchNorm on a bfloat16 convolution computes in float32 and
  rounds back). The chain ends in the convolution's dtype, and a tensor operand has it.

:data:`fused_p` binds ``(x, W, *operands)`` with the forward's :class:`ConvProblem` and the
chain; its value is :func:`reference`'s, the forward kernel (:func:`primitive.forward`) followed
by the chain in lax, operation by operation as the program wrote it. Its lowering on one CPU
device is one call of oneDNN's primitive with the chain as post-ops (the handler composes a
leading channel-wise affine run into one multiply and add per channel, and folds the multiply
into the filter where the filter is no larger than y: docs/onednn.md, "Fused chains"), where
the chooser runs the forward on oneDNN (``"onednn"``, or ``"onednn_f32"`` for 16-bit operands:
its measured choice, docs/lowerings.md). oneDNN computes every post-op in float32 on the
accumulated sums and rounds once, to the result's dtype: a 16-bit chain's converts are no
post-ops there, and its values are at least as accurate as the program's, which rounds the
convolution's result and each ``convert`` back (the rule of ``accelerate/widening.py``);
everywhere else (XLA's own convolution or Winograd chosen, another platform, a program split
across devices, an export) it is :func:`reference`, the program as before. Derivatives and
batching are :func:`reference`'s (``jax.jvp`` and ``jax.vmap`` of it: jaxconv's kernels), so a fused chain
composes with ``grad`` and ``vmap`` as the unfused one does. A filter that is a constant of the
program may come packed (:func:`pack`: moved once into the primitive's layout), an operand
after the chain's that the oneDNN call reads in place of ``W`` and everything else leaves
unread (docs/onednn.md, "Packed filters"). ``accelerate`` binds it where it
sees such a chain (``accelerate/rewrites/fused.py``); docs/onednn.md, "Fused chains".

The same primitive computes a data gradient (``kernel``; :func:`data`) whose filter is a
constant: a served transposed convolution, whose call reads its filter packed. Its chain is
empty (oneDNN's data gradient has no post-ops), and it is oneDNN's call only where it reads the
filter packed (``accelerate/rewrites/convolution.py`` binds it).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxconv._src import primitive, rounding
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import chooser, onednn

#: the kinds of post-op, and their algorithms (the handler's codes are their positions:
#: native/onednn/problem.h); ``convert`` is the program's alone (no post-op of oneDNN's)
KINDS = (*(k for k in onednn.POST_KINDS if k != "wide_tensor"), "convert")
ELTWISE, BINARY = onednn.POST_ELTWISE, onednn.POST_BINARY
#: the dtypes a ``convert`` post-op goes to
CONVERTS = ("float32", "bfloat16", "float16")

_BINARY_FN = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "max": lax.max,
              "min": lax.min, "mul_rsqrt": lax.mul}


@dataclasses.dataclass(frozen=True)
class PostOp:
    """One operation of a fused chain (module docstring)."""

    kind: str  # one of KINDS
    alg: str   # one of ELTWISE (kind "eltwise"), CONVERTS (kind "convert") or BINARY
    alpha: float = 0.0  # clip's lower bound; mul_rsqrt's epsilon
    beta: float = 0.0   # clip's upper bound

    def __post_init__(self) -> None:
        algs = {"eltwise": ELTWISE, "convert": CONVERTS}.get(self.kind, BINARY)
        if self.kind not in KINDS or self.alg not in algs:
            raise ValueError(f"fused: a post-op must be one of {KINDS} with an algorithm of "
                             f"{algs}, got {self.kind!r} {self.alg!r}")
        if self.alg == "mul_rsqrt" and self.kind != "channel":
            raise ValueError(f"fused: mul_rsqrt must be a channel post-op, got {self.kind!r}")

    @property
    def binary(self) -> bool:
        """Whether it reads an operand."""
        return self.kind in ("channel", "tensor")


def dtypes(post: Sequence[PostOp], start: Any) -> list[np.dtype]:
    """The chain's dtype after each post-op of ``post``, from ``start`` (y's dtype): a
    ``convert`` changes it, every other post-op keeps it."""
    out, at = [], np.dtype(start)
    for op in post:
        at = np.dtype(op.alg) if op.kind == "convert" else at
        out.append(at)
    return out


def apply_post_ops(y: Array, post: Sequence[PostOp], operands: Sequence[Array],
                   channel_axis: int) -> Array:
    """The chain on ``y`` in lax, one operation at a time (a channel vector broadcast along
    ``channel_axis``)."""
    it = iter(operands)
    for op in post:
        if op.kind == "eltwise":
            y = _eltwise(op, y)
            continue
        if op.kind == "convert":
            y = lax.convert_element_type(y, np.dtype(op.alg))
            continue
        side = next(it).astype(y.dtype)  # exact: the program's operand, widened by the caller
        if op.kind == "channel":
            if op.alg == "mul_rsqrt":  # the vector's normalizer, then a product
                side = lax.rsqrt(side + jnp.asarray(op.alpha, y.dtype))
            side = lax.broadcast_in_dim(side, y.shape, (channel_axis,))
        y = _BINARY_FN[op.alg](y, side)
    return y


def _eltwise(op: PostOp, y: Array) -> Array:
    if op.alg == "relu":
        return lax.max(y, jnp.zeros((), y.dtype))
    if op.alg == "clip":
        return lax.clamp(jnp.asarray(op.alpha, y.dtype), y, jnp.asarray(op.beta, y.dtype))
    if op.alg == "swish":  # SiLU: y * logistic(y), as jax.nn.silu writes it
        return lax.mul(y, lax.logistic(y))
    return lax.tanh(y) if op.alg == "tanh" else lax.logistic(y)


fused_p = Primitive("jaxconv_fused")

_PARAMS = ("p", "post", "precision", "preferred_element_type", "method", "packed", "constant",
           "kernel")


def reference(x: Array, w: Array, *operands: Array, p: ConvProblem, post: tuple[PostOp, ...],
              precision: Precision, preferred_element_type: DType, method: str,
              packed: str = "", constant: bool = False, kernel: Kernel = Kernel.FORWARD
              ) -> Array:
    """The fused primitive's value: jaxconv's ``kernel`` (its first operand x, or dy for the
    data gradient), then the chain in lax (a packed filter, the last operand where ``packed``
    names its method, unread: :func:`pack`)."""
    if packed:
        operands = operands[:-1]
    fn = primitive.forward if kernel is Kernel.FORWARD else primitive.data_grad
    y = fn(x, w, p=p, precision=precision, preferred_element_type=preferred_element_type,
           method=method)
    return apply_post_ops(y, post, operands, p.data.channel_axis)


def _abstract_eval(x: Any, w: Any, *operands: Any, p: ConvProblem, post: tuple[PostOp, ...],
                   precision: Precision, preferred_element_type: DType, method: str,
                   packed: str, constant: bool, kernel: Kernel) -> Any:
    dtype = np.dtype(preferred_element_type if preferred_element_type is not None else x.dtype)
    return primitive.result_aval(fused_p.name, kernel.out_shape(p), dtype, x, w)


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> tuple[Any, Any]:
    tangents = [ad.instantiate_zeros(t) for t in tangents]  # type: ignore[no-untyped-call]
    return jax.jvp(functools.partial(reference, **params), tuple(primals), tuple(tangents))


def _batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[Any, int]:
    return jax.vmap(functools.partial(reference, **params), in_axes=tuple(dims))(*args), 0


def cpu_method(p: ConvProblem, dtype: Any, precision: Precision, preferred_element_type: DType,
               method: str, constant: bool = False, kernel: Kernel = Kernel.FORWARD) -> str:
    """The method that runs ``kernel`` of ``p`` in a program on one CPU device: the chooser's
    plan, timed where it times, with oneDNN's filter packed where it is a constant of the
    program (``constant``: docs/onednn.md, "Packed filters")."""
    return chooser.plan(kernel, p, method=method, backend="cpu", dtype=dtype,
                        precision=precision, preferred_element_type=preferred_element_type,
                        packed=constant).method


def onednn_method(p: ConvProblem, dtype: Any, precision: Precision,
                  preferred_element_type: DType, method: str, constant: bool = False,
                  kernel: Kernel = Kernel.FORWARD) -> str | None:
    """The oneDNN method that runs ``kernel`` of ``p`` (:func:`cpu_method`): ``"onednn"`` or
    ``"onednn_f32"``, where a forward's chain fuses and a filter packs; None where another
    method runs it."""
    ours = cpu_method(p, dtype, precision, preferred_element_type, method, constant, kernel)
    return ours if ours in ("onednn", "onednn_f32") else None


def _onednn_program(x: Array, w: Array, *operands: Array, p: ConvProblem,
                    post: tuple[PostOp, ...], precision: Precision,
                    preferred_element_type: DType, method: str, packed: str, constant: bool,
                    kernel: Kernel, widen: bool, read_packed: bool) -> Array:
    # oneDNN computes the post-ops in float32 and rounds once: the converts are no post-ops
    # (module docstring); widened (onednn_f32), the operands go to float32 and the result
    # comes back to the convolution's dtype, as for its plain forward (lowering/onednn.py);
    # a filter packed for the method that runs is the call's filter as it is (pack); a data
    # gradient has no chain
    kept = tuple(op for op in post if op.kind != "convert")
    if packed:
        w = operands[-1] if read_packed else w
        operands = operands[:-1]

    def call(a: Array, b: Array, sides: Sequence[Array]) -> Array:
        if kernel is Kernel.DATA:  # its filter read packed (_cpu_rule)
            return onednn.packed_data(a, b, p)
        return onednn.fused_forward(a, b, sides, p, kept)
    if not widen or x.dtype == np.float32:
        return call(x, w, operands)
    wide = [v.astype(np.float32) for v in (x, *operands)]
    wide_w = w if read_packed else w.astype(np.float32)
    out = x.dtype if preferred_element_type is None else preferred_element_type
    return rounding.narrowed(call(wide[0], wide_w, wide[1:]), out)


_ONEDNN_RULE = mlir.lower_fun(_onednn_program, multiple_results=False)
_REFERENCE_RULE = mlir.lower_fun(reference, multiple_results=False)


def _cpu_rule(ctx: mlir.LoweringRuleContext, *args: Any, **params: Any) -> Any:
    if primitive.partitioned(ctx) or primitive.exported(ctx, params["method"]):
        return _REFERENCE_RULE(ctx, *args, **params)
    ours = cpu_method(params["p"], ctx.avals_in[0].dtype,  # type: ignore[attr-defined]
                      params["precision"], params["preferred_element_type"], params["method"],
                      params["constant"], params["kernel"])
    read_packed = params["packed"] == ours
    # the method chosen with the filter constant; a data gradient is the fused call's only
    # where it reads its filter packed (it has no chain)
    if ours not in ("onednn", "onednn_f32") or (
            params["kernel"] is Kernel.DATA and not read_packed):
        return _REFERENCE_RULE(ctx, *args, **{**params, "method": ours} if params["constant"]
                               else params)
    return _ONEDNN_RULE(ctx, *args, widen=ours == "onednn_f32", read_packed=read_packed,
                        **params)


@functools.partial(jax.jit, static_argnames=_PARAMS)
def _eager(x: Array, w: Array, *operands: Array, **params: Any) -> Array:
    out: Array = fused_p.bind(x, w, *operands, **params)  # type: ignore[no-untyped-call]
    return out


fused_p.def_impl(_eager)  # type: ignore[no-untyped-call]
fused_p.def_abstract_eval(_abstract_eval)  # type: ignore[no-untyped-call]
ad.primitive_jvps[fused_p] = _jvp
batching.primitive_batchers[fused_p] = _batch
mlir.register_lowering(fused_p, _REFERENCE_RULE)
mlir.register_lowering(fused_p, _cpu_rule, platform="cpu")


def pack(w: Any, p: ConvProblem, method: str, kernel: Kernel = Kernel.FORWARD,
         post: Sequence[PostOp] = (), operands: Sequence[Any] = ()
         ) -> tuple[np.ndarray | None, str]:
    """The filter ``w`` of ``kernel`` (the forward or the data gradient) of ``p``, a constant
    of the program (a host array in ``p``'s filter layout), packed once for the oneDNN
    ``method`` that runs it (``onednn_method``; float32 for ``"onednn_f32"``): the bytes the
    fused call reads in place of a filter it would move into its primitive's layout at every
    call, and ""; or None and why not (docs/onednn.md, "Packed filters"). A forward's chain
    ``post`` and its ``operands`` (as :func:`forward` takes them) are the call's: its filter
    is packed on the layouts the layout trial keeps for the convolution with that chain."""
    host = np.asarray(w)
    kept = tuple(op for op in post if op.kind != "convert")  # as _onednn_program calls
    return onednn.pack_filter(kernel, host.astype(np.float32) if method == "onednn_f32" else host,
                              p, kept, operands)


def forward(x: Array, w: Array, operands: Sequence[Array], *, p: ConvProblem,
            post: Sequence[PostOp], precision: Precision = None,
            preferred_element_type: DType = None, method: str = "auto",
            packed: tuple[Any, str] | None = None, constant: bool = False) -> Array:
    """``conv(x, W)`` of ``p`` followed by ``post`` (each binary post-op reading the next of
    ``operands``), as one oneDNN primitive where oneDNN runs the forward (module docstring).

    Args:
      x: the input, in ``p``'s data layout.
      w: the filter, in ``p``'s filter layout.
      operands: one per binary post-op, in order: a vector of the output channels (float32)
        for a ``channel`` post-op, an array of y's shape for a ``tensor`` one, in x's dtype
        or the chain's dtype at that post-op (float32 after a ``convert`` to it).
      p: the forward problem.
      post: the chain; its ``convert`` post-ops end it in y's dtype.
      precision, preferred_element_type, method: as for jaxconv's forward kernel.
      packed: ``w`` packed by :func:`pack` and the method it was packed for; the call reads
        it where that method runs the forward, and ``w`` everywhere else (derivatives, vmap,
        other platforms).
      constant: ``w`` is a constant of the program (``packed`` implies it): the method is the
        one chosen with oneDNN's candidates timed on the filter packed (:func:`cpu_method`).

    Returns:
      The chain's value, y's shape and dtype.

    Raises:
      ValueError: ``operands`` do not match ``post`` (their number, a channel vector's length
        or dtype, a tensor's shape or dtype), or ``post`` ends in another dtype than y's.
    """
    post = tuple(post)
    dtype = np.dtype(x.dtype if preferred_element_type is None else preferred_element_type)
    along = dtypes(post, dtype)
    ends = along[-1] if along else dtype
    if ends != dtype:
        raise ValueError(f"fused: post must end in y's dtype {dtype}, got a chain that ends "
                         f"in {ends}")
    y_shape = Kernel.FORWARD.out_shape(p)
    channels = y_shape[p.data.channel_axis]
    binary = [op for op in post if op.binary]
    if len(binary) != len(operands):
        raise ValueError(f"fused: operands must be one per binary post-op ({len(binary)}), "
                         f"got {len(operands)}")
    checked, sides = [], iter(operands)
    for op, at in zip(post, along):
        if not op.binary:
            continue
        v = jnp.asarray(next(sides))
        if op.kind == "channel" and (v.shape != (channels,) or v.dtype != np.float32):
            raise ValueError(f"fused: a channel operand must be float32[{channels}], got "
                             f"{v.dtype}{list(v.shape)}")
        if op.kind == "tensor" and (v.shape != y_shape or v.dtype not in (x.dtype, at)):
            there = f" (or {at}, the chain's dtype there)" if at != x.dtype else ""
            raise ValueError(f"fused: a tensor operand must be {x.dtype}{list(y_shape)}{there}, "
                             f"got {v.dtype}{list(v.shape)}")
        checked.append(v)
    return _bind(Kernel.FORWARD, x, w, checked, p, post, precision, preferred_element_type,
                 method, packed, constant)


def data(dy: Array, w: Array, *, p: ConvProblem, precision: Precision = None,
         preferred_element_type: DType = None, method: str = "auto",
         packed: tuple[Any, str] | None = None, constant: bool = False) -> Array:
    """The data gradient of ``p`` (a transposed convolution) whose filter ``w`` is a constant
    of the program, read packed where oneDNN runs it (:func:`pack`; no chain: oneDNN's data
    gradient has no post-ops).

    Args:
      dy: the forward's output, in ``p``'s data layout.
      w: the filter, in ``p``'s filter layout.
      precision, preferred_element_type, method: as for jaxconv's data-gradient kernel.
      packed, constant: as for :func:`forward`, for the data gradient.

    Returns:
      dx, ``p``'s x shape, in dy's dtype (or ``preferred_element_type``).

    Raises:
      ValueError: ``packed`` is not :func:`pack`'s bytes and a oneDNN method.
    """
    return _bind(Kernel.DATA, dy, w, [], p, (), precision, preferred_element_type, method,
                 packed, constant)


def _bind(kernel: Kernel, a: Array, w: Array, operands: Sequence[Array], p: ConvProblem,
          post: tuple[PostOp, ...], precision: Precision, preferred_element_type: DType,
          method: str, packed: tuple[Any, str] | None, constant: bool) -> Array:
    filt, packed_for = packed if packed is not None else (np.zeros(0, np.uint8), "")
    if packed_for not in ("", "onednn", "onednn_f32") or (
            np.dtype(filt.dtype) != np.uint8 or np.ndim(filt) != 1):
        raise ValueError(f"fused: packed must be pack's uint8 bytes and 'onednn' or "
                         f"'onednn_f32', got {filt.dtype} for {packed_for!r}")
    out: Array = fused_p.bind(  # type: ignore[no-untyped-call]
        a, w, *operands, *([filt] if packed_for else []), p=p, post=post, precision=precision,
        preferred_element_type=preferred_element_type, method=method, packed=packed_for,
        constant=constant or bool(packed_for), kernel=kernel)
    return out
