"""``"onednn"``: each kernel as oneDNN's own primitive, called through XLA's FFI (CPU only).

oneDNN Graph's spec defines the first family; its runtime computes the same three kernels:
``convolution_forward`` (y from x and W), ``convolution_backward_data`` (dx from dy and W)
and ``convolution_backward_weights`` (dW from x and dy), with oneDNN's strides, 0-based
dilations (D - 1) and pads. The handler (``native/onednn/``) maps the caller's layout
onto oneDNN's logical dims with strided memory descriptors: every data and filter format of
jaxconv reaches it as it is, with no transpose in the program; oneDNN reorders its weights
into its own blocked format (and the activations where no implementation takes the caller's).

The FFI target is registered for the ``cpu`` platform only (``Method.platforms``: a program
lowered for another platform never holds the call), and only when the handler is built and
loads (``native/library.py``); otherwise the method does not apply and says why. Whether
oneDNN computes a call is decided in one place, :func:`applies`, which the chooser
(``chooser.py``) asks before it plans a call: the handler is loaded and takes the problem, the
operands are float32 or, where this CPU has the instructions (oneDNN is asked once when it
loads), bfloat16 or float16, ``preferred_element_type`` is their dtype, and the fitted input
keeps a position. Operands it does not take go to the default leaf formulation.
A negative pad (a ConvTranspose output past its full result) is a crop
of x (the data gradient's cropped elements are zeros). The gradients leave out the output
positions whose windows read only padding (above ``_kernel``); the weight gradient's problem
is fitted exactly (no trailing element unread), and a strided 1x1 weight gradient is the
unit-stride one on the grid of x it reads (``_grid`` below), except on AVX-512 without pads,
where oneDNN takes the stride and x whole (``_strided_1x1_in_onednn``); its data gradient is the handler's
unit-stride one scattered onto dx's grid (``Spread`` in the handler).
``threads``: 0, the handler's own rule (batch chunks on XLA's pool or one call on oneDNN's
OpenMP team, ``Chunks`` in ``native/onednn/decisions.h``); 1, one thread on the calling one (a device's shard
where several devices of this process run their calls at once, ``spmd.py``).
Zero-size problems never reach a method (``registry.run``). Batching happens before: the
primitive's batching rule folds a mapped operand into the batch or the groups, so the handler
always sees the problem's own rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src import rounding
from jaxconv._src.geometry import ConvProblem, conv_output_size
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import common
from jaxconv._src.lowering.method import Method
from jaxconv._src.native import library


def _cropped(p: ConvProblem, fitted: bool) -> tuple[ConvProblem, list[tuple[int, int]]]:
    """``p`` with its negative pads as crops of x (and, ``fitted``, without the trailing
    elements no window reads: ``p.fit_pads``): the problem, and the elements cropped from x's
    start and end per axis. Not fitted, a negative end pad within the stride's slack is no crop
    (oneDNN's output size rounds down as ours does: ``floor((I + pb + pe - DK) / S) + 1``)."""
    ends = [hi for _, hi in p.fit_pads] if fitted else [
        0 if e < 0 and conv_output_size(i, k, s, d, pb, 0) == o else e
        for i, o, k, s, d, pb, e in zip(p.input_size, p.output_size, p.kernel, p.strides,
                                        p.dilations, p.pads_begin, p.pads_end)]
    crop = [(max(0, -b), max(0, -e)) for b, e in zip(p.pads_begin, ends)]
    sub = dataclasses.replace(p, input_size=tuple(i - lo - hi for i, (lo, hi) in
                                                  zip(p.input_size, crop)),
                              pads_begin=tuple(max(0, b) for b in p.pads_begin),
                              pads_end=tuple(max(0, e) for e in ends))
    return sub, crop


# A 1x1 kernel with strides reads x only at o*S - pb: the grid of x padded (or cropped) to
# (O - 1)*S + 1 elements from -pb, every S-th element (zeros where it falls in the padding).
# Its weight gradient is the unit-stride 1x1 problem on that grid. oneDNN 3.2's strided 1x1
# weight gradient miscomputes on AVX2 when x has trailing elements no window reads (the
# lowering matrix caught it: 38% off), and on a fitted (cropped) x it leaves its 1x1 kernel
# for a generic one, 2.5x slower. On the grid it is oneDNN's unit-stride 1x1 kernel, a
# product of matrices, for a copy of 1/S^rank of x. (The data gradient is the unit-stride one
# too, scattered onto dx's grid by the handler itself: ``Spread`` in ``native/onednn/primitives.cc``.)
def _grid_of_1x1(p: ConvProblem) -> bool:
    return all(k == 1 for k in p.kernel) and any(s > 1 for s in p.strides)


# On AVX-512 the stride of an unpadded 1x1 weight gradient goes to oneDNN as it is, x whole:
# its 1x1 kernel there (jit_1x1:avx512_core) reads the grid itself, exact with trailing
# elements unread, and faster than the grid copied by XLA (docs/onednn.md, "What the handler
# does"). With pads it leaves that kernel for the generic one: those keep the grid.
def _strided_1x1_in_onednn(p: ConvProblem) -> bool:
    return (_grid_of_1x1(p) and not any(p.pads_begin) and not any(p.pads_end)
            and library.status().avx512)


def _unit(p: ConvProblem) -> ConvProblem:
    """The unit-stride 1x1 problem on the grid."""
    ones, zeros = (1,) * p.rank, (0,) * p.rank
    return dataclasses.replace(p, input_size=p.output_size, strides=ones, dilations=ones,
                               pads_begin=zeros, pads_end=zeros)


def _grid(x: Array, p: ConvProblem) -> Array:
    """The elements of x a strided 1x1 kernel reads (zeros where they fall in the padding)."""
    # for a 1x1 kernel the fitted pads span the grid: (O - 1)*S + 1 elements from -pb
    return common.window(common.pad_spatial(x, p.data.spatial_axes, p.fit_pads), p,
                         (0,) * p.rank, p.output_size, p.strides)


def _dtypes() -> tuple[np.dtype, ...]:
    """The dtypes the handler takes on this CPU (probed when it loads)."""
    return tuple(np.dtype(getattr(jax.numpy, name)) for name in library.status().dtypes)


def applies(kernel: Kernel | None, p: ConvProblem, dtype: DType | None = None,
            preferred_element_type: DType = None) -> str | None:
    """Why oneDNN does not compute ``kernel`` of ``p`` with operands of ``dtype``, or None
    where it does: the one place that decides it (the chooser, the backends' tables and the
    method's record all ask here). ``kernel`` or ``dtype`` None: the checks that need them are
    left out (a forced ``lowering=`` is checked on the problem alone)."""
    why = library.why_not(p)
    if why is not None:
        return why
    if dtype is not None:
        found = _dtypes()
        if np.dtype(dtype) not in found:
            return (f"computes {', '.join(str(d) for d in found)} on this CPU, got "
                    f"{np.dtype(dtype)}")
        if preferred_element_type is not None and np.dtype(preferred_element_type) != np.dtype(dtype):
            return (f"computes in the operands' dtype, got preferred_element_type "
                    f"{np.dtype(preferred_element_type)} for {np.dtype(dtype)} operands")
    if kernel is not None:
        fitted, _ = _cropped(p, fitted=kernel is Kernel.WEIGHT and not _strided_1x1_in_onednn(p))
        if min(fitted.input_size) <= 0:
            return "needs an input of at least one position after its crops"
    return None


#: oneDNN's ISAs (``library.status().isa``) with native bfloat16 dot products
NATIVE_BF16_ISAS = ("AVX-512 BF16", "AVX-512 FP16", "AVX-512 AMX", "AVX-512 AMX FP16")


def native_bfloat16() -> bool:
    """Whether jaxconv's handler is loaded and its oneDNN computes bfloat16 natively."""
    found = library.status()
    return found.available and found.isa in NATIVE_BF16_ISAS


def product_applies(a: Any, b: Any, dimension_numbers: Any,
                    preferred_element_type: DType) -> str | None:
    """Why ``dot_general(a, b, dimension_numbers, preferred_element_type=...)`` (abstract
    values) is not a product ``matmul.matmul`` computes on oneDNN, or None: two bfloat16
    matrices where oneDNN computes bfloat16 natively, or two float32 ones (the chooser
    then times it against XLA's: ``chooser.product_why_not``)."""
    (ca, cb), (ba, bb) = dimension_numbers
    if ba or bb or a.ndim != 2 or b.ndim != 2 or len(ca) != 1 or len(cb) != 1:
        return "a matmul multiplies two matrices over one axis each, without batch axes"
    bf16, f32 = np.dtype(jnp.bfloat16), np.dtype(np.float32)
    dtype = np.dtype(a.dtype)
    if dtype not in (bf16, f32) or np.dtype(b.dtype) != dtype:
        return (f"oneDNN's matmul multiplies two bfloat16 or two float32 matrices, got "
                f"{np.dtype(a.dtype)} and {np.dtype(b.dtype)}")
    if preferred_element_type is not None and np.dtype(preferred_element_type) not in (
            dtype, f32):
        return (f"a {dtype} matmul returns {dtype} or float32, got preferred_element_type "
                f"{np.dtype(preferred_element_type)}")
    if dtype == f32 and not library.status().available:
        return "jaxconv's handler is not loaded: XLA's product"
    if dtype == bf16 and not native_bfloat16():
        return ("oneDNN does not compute bfloat16 natively on this CPU (or jaxconv's handler is "
                "not loaded): XLA's float32 product")
    return None


def matmul_call(a: Array, b: Array, contracting: tuple[int, int],
                preferred_element_type: DType) -> Array:
    """The handler's product of two matrices (``native/onednn/matmul.h``): ``a`` and ``b``
    read in their layouts, ``contracting`` the axis of each that it sums over."""
    # oneDNN's C = op(A) op(B): A is M x K, stored K x M where a sums over its axis 0; B is
    # K x N, stored N x K where b sums over its axis 1
    ca, cb = contracting
    dtype = a.dtype if preferred_element_type is None else preferred_element_type
    out = jax.ShapeDtypeStruct((a.shape[1 - ca], b.shape[1 - cb]), dtype)  # type: ignore[no-untyped-call]
    call = jax.ffi.ffi_call(library.MATMUL_TARGET, out)
    result: Array = call(a, b, op="matmul", a_transposed=ca == 0, b_transposed=cb == 1)
    return result


# Output positions whose windows read only padding (ConvProblem.padding_only_outputs: a 1x1
# kernel with pads, pads past the dilated kernel) add nothing to dx or dW, and with such pads
# oneDNN 3.2's gradients leave its fast kernels: the gradients are computed without them. The
# forward keeps its pads (cut, y would be padded back with zeros: a copy of y, no faster).
# Measured: docs/onednn.md, "What the handler does".
def _kernel(kernel: Kernel) -> object:
    def compute(a: Array, b: Array, p: ConvProblem, precision: Precision,
                preferred_element_type: DType, threads: int = 0, post: tuple[Any, ...] = (),
                operands: Sequence[Array] = ()) -> Array:
        strided = kernel is Kernel.WEIGHT and _strided_1x1_in_onednn(p)
        grid = kernel is Kernel.WEIGHT and _grid_of_1x1(p) and not strided
        axes = p.data.spatial_axes
        dead = p.padding_only_outputs
        if kernel is Kernel.WEIGHT and any(lo or hi for lo, hi in dead):
            # dy at output positions whose windows read only padding reaches neither dx nor
            # dW: the gradient of the problem without them (measured: above _kernel)
            live = p.without_padding_only_outputs()
            if 0 in live.output_size:
                return jnp.zeros(kernel.out_shape(p), a.dtype)
            b = common.pad_spatial(b, axes, [(-lo, -hi) for lo, hi in dead])  # b is dy
            return compute(a, b, live, precision, preferred_element_type, threads)
        if kernel is Kernel.DATA:
            q, crop, cut = _data_call(p)
            if q is None:  # no live output: dx is zeros
                return jnp.zeros(kernel.out_shape(p), a.dtype)
            a = common.pad_spatial(a, axes, cut)  # a is dy
            p = q
        elif grid:  # a is x
            a, p, crop = _grid(a, p), _unit(p), [(0, 0)] * p.rank
        else:
            # the weight gradient is fitted: oneDNN 3.2's 1x1 one miscomputed with unread
            # elements on AVX2 (not the one above)
            p, crop = _cropped(p, fitted=kernel is Kernel.WEIGHT and not strided)
        if kernel is not Kernel.DATA:  # a is x
            a = common.pad_spatial(a, axes, [(-lo, -hi) for lo, hi in crop])
        target = library.TARGETS["fused" if post else kernel.value]
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(kernel.out_shape(p), a.dtype))  # type: ignore[no-untyped-call]
        out: Array = call(
            a, b, *operands, op=p.op, groups=np.int64(p.groups),
            **_post_attrs(post, operands, a.dtype),
            **{k: np.array(v, np.int64) for k, v in _problem_attrs(p).items()},
            threads=np.int64(threads))
        if kernel is Kernel.DATA:  # dx's cropped head and tail: zeros
            out = common.pad_spatial(out, axes, crop)
        return out
    return compute


def _data_call(p: ConvProblem) -> tuple[ConvProblem | None, list[tuple[int, int]],
                                         list[tuple[int, int]]]:
    """The data gradient of ``p`` as the handler's call computes it: its problem (None where
    no output position is live), the elements of dx cropped from its start and end per axis
    (zeros), and the pads that cut dy to the live outputs (above :func:`_kernel`)."""
    dead = p.padding_only_outputs
    cut = [(-lo, -hi) for lo, hi in dead]
    if any(lo or hi for lo, hi in dead):
        p = p.without_padding_only_outputs()
        if 0 in p.output_size:
            return None, [], cut
    q, crop = _cropped(p, fitted=False)
    return q, crop, cut


def _problem_attrs(p: ConvProblem) -> dict[str, tuple[int, ...]]:
    """The handler's attributes of ``p`` as its call (and a pack of its filter) names them
    (``native/onednn/problem.h``), groups aside."""
    return dict(data_axes=tuple(p.data.spec),
                filter_axes=tuple(p.filter_layout.spec(swap=p.filter_swap)),
                strides=tuple(p.strides), dilations=tuple(p.dilations),
                pads_begin=tuple(p.pads_begin), pads_end=tuple(p.pads_end))


#: a fused forward's post-op kinds and algorithms (``fused.PostOp``), each the handler's code
#: by its position (``native/onednn/problem.h``); a float32 ``tensor`` beside a 16-bit y is
#: the handler's ``wide_tensor``
POST_KINDS = ("eltwise", "channel", "tensor", "wide_tensor")
POST_ELTWISE = ("relu", "clip", "tanh", "logistic", "swish")
POST_BINARY = ("add", "sub", "mul", "div", "max", "min", "mul_rsqrt")


def _post_attrs(post: tuple[Any, ...], operands: Sequence[Array], dtype: Any
                ) -> dict[str, np.ndarray]:
    """A fused forward's post-ops as the handler's attributes (none for a plain kernel): a
    float32 tensor operand beside a 16-bit ``dtype`` is a ``wide_tensor``."""
    if not post:
        return {}
    sides = iter(operands)
    kinds = []
    for op in post:
        side = next(sides) if op.binary else None
        wide = (op.kind == "tensor" and side is not None and side.dtype == np.float32
                and np.dtype(dtype) != np.float32)
        kinds.append(POST_KINDS.index("wide_tensor" if wide else op.kind))
    return dict(
        post_kinds=np.array(kinds, np.int64),
        post_algs=np.array([(POST_ELTWISE if op.kind == "eltwise" else POST_BINARY).index(op.alg)
                            for op in post], np.int64),
        post_alphas=np.array([op.alpha for op in post], np.float32),
        post_betas=np.array([op.beta for op in post], np.float32))


def fused_forward(x: Array, w: Array, operands: Sequence[Array], p: ConvProblem,
                  post: tuple[Any, ...]) -> Array:
    """The forward of ``p`` with the chain ``post`` as oneDNN's post-ops, one call
    (``lowering/fused.py``): the forward kernel's call, its operands after x and W (which may
    be packed: :func:`pack_filter`)."""
    out: Array = _FORWARD(x, w, p, None, None, 0, post, operands)  # type: ignore[operator]
    return out


def packed_data(dy: Array, w: Array, p: ConvProblem) -> Array:
    """The data gradient of ``p`` whose filter ``w`` is packed (:func:`pack_filter`): the data
    kernel's call, reading the bytes as they are (``lowering/fused.py``)."""
    out: Array = _DATA(dy, w, p, None, None)  # type: ignore[operator]
    return out


_FORWARD, _DATA = _kernel(Kernel.FORWARD), _kernel(Kernel.DATA)


def pack_filter(kernel: Kernel, w: Any, p: ConvProblem, post: tuple[Any, ...] = (),
                operands: Sequence[Array] = ()) -> tuple[np.ndarray | None, str]:
    """The filter ``w`` of ``kernel`` (the forward or the data gradient) of ``p`` (a host
    array in ``p``'s filter layout) packed for that kernel's call (``native/onednn/packed.h``),
    which takes it in place of ``w``: the bytes and "", or None and why not. The call's problem
    is the one the kernel's call builds (x cropped where a pad is negative; a data gradient's
    dy cut to its live outputs); a forward's chain ``post`` and its ``operands`` are those
    of the fused call that reads it (:func:`fused_forward`)."""
    if kernel is Kernel.DATA:
        q, _, _ = _data_call(p)
        if q is None:
            return None, "no output position of the data gradient is live"
    elif kernel is Kernel.FORWARD:
        q, _ = _cropped(p, fitted=False)
    else:
        return None, f"packs a forward's or a data gradient's filter, got the {kernel.label}"
    chain = _post_attrs(post, operands, w.dtype)
    return library.pack_filter(np.asarray(w), kernel=kernel.value, x_shape=q.x_shape,
                               y_shape=Kernel.FORWARD.out_shape(q), groups=q.groups,
                               **_problem_attrs(q), post_kinds=chain.get("post_kinds", ()),
                               post_algs=chain.get("post_algs", ()),
                               post_alphas=chain.get("post_alphas", ()),
                               post_betas=chain.get("post_betas", ()))


ONEDNN = Method(
    "onednn", "oneDNN's own primitive through XLA's FFI (CPU, with the ``onednn`` extra)",
    {k: _kernel(k) for k in Kernel},  # type: ignore[misc]
    lambda p: applies(None, p), platforms=("cpu",), per_shard=True, refuses=applies)


#: the 16-bit float dtypes whose convolutions oneDNN's float32 kernel may compute, widened
WIDENED_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def widened_applies(kernel: Kernel | None, p: ConvProblem, dtype: DType | None = None,
                    preferred_element_type: DType = None) -> str | None:
    """Why ``onednn_f32`` does not compute ``kernel`` of ``p`` with operands of ``dtype``, or
    None: oneDNN takes the problem in float32, and the result's dtype is the operands' or
    float32."""
    why = applies(kernel, p, None if dtype is None else np.dtype(np.float32))
    if why is not None or dtype is None:
        return why
    if np.dtype(dtype) not in (*WIDENED_DTYPES, np.dtype(np.float32)):
        return (f"widens bfloat16 and float16 operands (float32 ones run as they are), got "
                f"{np.dtype(dtype)}")
    if preferred_element_type is None:
        return None
    if np.dtype(preferred_element_type) not in (np.dtype(dtype), np.dtype(np.float32)):
        return (f"returns the operands' dtype or float32, got preferred_element_type "
                f"{np.dtype(preferred_element_type)} for {np.dtype(dtype)} operands")
    return None


# A 16-bit convolution widened: both operands to float32 (exactly: every bfloat16 and float16
# value is a float32), oneDNN's float32 kernel, the result rounded once to the operands'
# dtype (bfloat16 by integer operations, rounding.py) or kept in float32
# (preferred_element_type). The products are exact in float32 and
# summed in float32, as oneDNN's 16-bit kernels sum them, so the two differ by the order of
# the sums only. It is a challenger ``auto`` times against oneDNN's 16-bit kernel
# (``chooser.candidates``): on a CPU without AMX oneDNN's float32 kernels can be the faster
# (docs/lowerings.md, "Timed choices").
def _widened(kernel: Kernel) -> object:
    leaf = _kernel(kernel)

    def compute(a: Array, b: Array, p: ConvProblem, precision: Precision,
                preferred_element_type: DType) -> Array:
        out = preferred_element_type if preferred_element_type is not None else a.dtype
        wide = jnp.float32
        got: Array = leaf(a.astype(wide), b.astype(wide), p, precision, None)  # type: ignore[operator]
        return rounding.narrowed(got, out)
    return compute


ONEDNN_F32 = Method(
    "onednn_f32", "oneDNN's float32 primitive on the operands widened to float32, the result "
    "rounded back to their dtype (CPU, with the ``onednn`` extra)",
    {k: _widened(k) for k in Kernel},  # type: ignore[misc]
    lambda p: applies(None, p), platforms=("cpu",), refuses=widened_applies)
