"""The per-backend tables: which formulation each kernel uses (docs/lowerings.md).

Data the chooser (``chooser.py``) reads, and nothing else does: it tells each table whether
oneDNN may be picked (``onednn``, which ``lowering/onednn.py``'s ``applies`` decides).

``lowering="auto"`` (the default of every op that has a choice) does not look at
``jax.default_backend()``: a jitted op is traced once and may be lowered for
another platform (``jax.export``, or arrays placed on another device). The
primitive registers one lowering per platform (``primitive.py``): the program
lowered for a platform runs that backend's table, once per kernel call, and the
compiler never sees the other backends' choices. Every name a table returns is a
method of ``lowering/methods.py`` (tests/lowering/test_registry.py checks it).

The rules are tables over the resolved problem, one per backend:

* ``"cpu"``: ``"winograd"`` (Winograd's minimal filtering through the same handler) for 2D
  3x3 stride-1 float32 problems of at least :data:`WINOGRAD_MIN_CHANNELS` channels and
  :data:`WINOGRAD_MIN_POSITIONS` output positions per image (then each of its tiles timed
  against oneDNN on the running machine); ``"onednn"`` (oneDNN's own
  primitive, with the ``onednn`` extra built) for every other problem it takes except the
  smallest (below :data:`ONEDNN_MIN_MACS`, or :data:`ONEDNN_OVER_XLA_CONV_MIN_MACS` where the
  rest would be XLA's convolution); the rest, and every problem without the extra, by the
  XLA:CPU rules.
* ``"gpu"`` (CUDA and ROCm; ROCm shares the CUDA table). Where a rule has no measurement
  behind it, the GPU table keeps ``"vjp"``.
* ``"default"`` (TPU and any other platform): ``"vjp"``, the program JAX's own
  autodiff emits, so that jaxconv is never slower there than ``jax.vjp``.

Every rule was measured faster where it applies; the measurements are in docs/lowerings.md
(the CPU and GPU tables, and "Thresholds" for the named constants below) and docs/onednn.md
("Which problems lowering="auto" gives it").
"""

from __future__ import annotations

import math
from typing import Literal

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Kernel
from jaxconv._src.native import library

#: The backends with a rule table, and the platforms each one covers.
BACKENDS = ("cpu", "gpu", "default")
PLATFORMS = {"cpu": ("cpu",), "gpu": ("cuda", "rocm"), "default": ()}

#: "dot" keeps about 8x its result in temporaries, "phases" about 2.4x: past this many result
#: elements (0.5 GiB in float32) no rule picks "dot" (docs/lowerings.md, "Thresholds").
DOT_MAX_RESULT_ELEMENTS = 2 ** 27


def _operands_fit(p: ConvProblem) -> bool:
    """Whether x and y both have at most :data:`DOT_MAX_RESULT_ELEMENTS` elements."""
    return max(math.prod(p.x_shape), math.prod(p.y_shape)) <= DOT_MAX_RESULT_ELEMENTS


#: The most groups "per_group" unrolls into separate problems (one convolution each).
PER_GROUP_MAX_GROUPS = 64


def _per_group_pays(p: ConvProblem) -> bool:
    """XLA:CPU: a grouped (not depthwise) 1D/2D problem of at most 2^27 elements runs as g
    dense ones: XLA:CPU runs a grouped convolution far below the dense speed. 3D keeps its
    per-tap rules (docs/lowerings.md, the CPU tables)."""
    return (_operands_fit(p) and p.rank <= 2 and 1 < p.groups <= PER_GROUP_MAX_GROUPS
            and p.in_channels > p.groups)


#: The most channels (input or output, all groups) "block_diagonal" expands into one dense problem.
BLOCK_DIAGONAL_MAX_CHANNELS = 64


def _block_diagonal_pays(p: ConvProblem, kind: Literal["forward", "data", "weight"]) -> bool:
    """XLA:CPU: a grouped problem of few channels per group as one dense, block-diagonal one
    (g times the arithmetic, at the dense speed): data gradients in 2D and 3D with at most 8
    channels per group; forwards and weight gradients in 3D, unstrided, with at most 8 and 5
    (docs/lowerings.md, the CPU tables)."""
    icg = p.in_channels // p.groups
    if not (p.groups > 1 and icg > 1 and max(p.in_channels, p.out_channels) <= BLOCK_DIAGONAL_MAX_CHANNELS
            and _operands_fit(p)):
        return False
    unstrided = all(s == 1 for s in p.strides)
    if kind == "data":
        return p.rank >= 2 and icg <= 8
    if kind == "forward":
        return p.rank == 3 and icg <= 8 and unstrided
    return p.rank == 3 and icg <= 5 and unstrided


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")


#: below this many multiply-adds a problem stays with the XLA:CPU rules (the FFI call's fixed
#: cost; docs/onednn.md, "Which problems ... gives it")
ONEDNN_MIN_MACS = 1e5


#: where the XLA:CPU rules take XLA's own convolution for a forward ("conv") or a data
#: gradient ("grid"), oneDNN from this many multiply-adds (docs/onednn.md, as above)
ONEDNN_OVER_XLA_CONV_MIN_MACS = 2e4


#: without AVX-512 a dense weight gradient below this many multiply-adds stays with the XLA:CPU
#: rules (oneDNN 3.2 has only its gemm-based implementation for it there; docs/onednn.md)
ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS = 3e5


#: without AVX-512 a dense forward below this many multiply-adds whose channel counts are
#: multiples of 8 stays with the XLA:CPU rules (XLA's convolution fills AVX2's vectors;
#: docs/onednn.md)
ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS = 2e5


#: a forward or data gradient of fewer multiply-adds per element of x and y is bound by memory
#: and stays with the XLA:CPU rules (docs/onednn.md, as above)
ONEDNN_MIN_MACS_PER_ELEMENT = 1.5


#: XLA:CPU's 3D per-tap products from this many multiply-adds per kernel; below, XLA's
#: convolution (docs/lowerings.md, "Thresholds")
PER_TAP_3D_MIN_MACS = {"forward": 1e4, "weight": 1e5}


#: a 1D or 2D forward whose window covers the whole input is one product ("dot") from this
#: many multiply-adds; below, XLA's convolution (docs/lowerings.md, "Thresholds")
WHOLE_WINDOW_DOT_MIN_MACS = 1e5


#: Winograd (``lowering/winograd.py``) for a 2D 3x3 stride-1 problem it takes from this many
#: input and output channels (with 16, the padded products lose to oneDNN's direct kernel)
#: and this many output positions per image (at 5x5 the 3x3 tile's forward and data gradient
#: won, where the 4x4 tile, computing 8x8 outputs, lost: measured on a 2-core Zen 4 only; the
#: running machine times each against oneDNN, measured.py); docs/lowerings.md, "Thresholds"
WINOGRAD_MIN_CHANNELS = 32
WINOGRAD_MIN_POSITIONS = 25


def _winograd_pays(p: ConvProblem) -> bool:
    """Whether Winograd may pay for ``p`` where it applies: measured on Zen 4 with the AVX-512
    kernels and with the AVX2 ones against oneDNN limited to AVX2 (docs/lowerings.md,
    "Winograd"); the running machine then times it against oneDNN (``measured.py``)."""
    from jaxconv._src.lowering import winograd
    return (winograd.inapplicable(p) is None
            and min(p.in_channels, p.out_channels) >= WINOGRAD_MIN_CHANNELS
            and math.prod(p.output_size) >= WINOGRAD_MIN_POSITIONS)


def macs(p: ConvProblem) -> int:
    """The problem's multiply-adds."""
    return p.batch * math.prod(p.output_size) * p.out_channels * math.prod(p.kernel) * (
        p.in_channels // max(p.groups, 1))


def _onednn_pays(p: ConvProblem, kernel: Kernel = Kernel.WEIGHT, xla: str = "") -> bool:
    """Whether oneDNN pays for ``kernel`` of ``p`` where it applies (large enough; a forward or
    data gradient not bound by memory), where the XLA:CPU rules pick ``xla``."""
    if p.whole_window:
        # oneDNN computes it in its reference code (docs/onednn.md, as above)
        return False
    count = macs(p)
    elements = math.prod(p.x_shape) + math.prod(p.y_shape)
    if kernel is not Kernel.WEIGHT and count < ONEDNN_MIN_MACS_PER_ELEMENT * elements:
        return False
    if (kernel is Kernel.WEIGHT and p.groups == 1 and count < ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS
            and not library.status().avx512):
        return False
    if (kernel is Kernel.FORWARD and p.groups == 1 and count < ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS
            and p.in_channels % 8 == 0 and p.out_channels % 8 == 0
            and not library.status().avx512):
        return False
    xla_conv = kernel is not Kernel.WEIGHT and xla in ("conv", "grid")
    minimum = ONEDNN_OVER_XLA_CONV_MIN_MACS if xla_conv else ONEDNN_MIN_MACS
    return count >= minimum


def _cpu(kernel: Kernel, p: ConvProblem, onednn: bool, xla: str) -> str:
    """The CPU table: Winograd where it pays, else oneDNN where it pays, else ``xla`` (the
    XLA:CPU rules' method), oneDNN's and Winograd's only where ``onednn``."""
    if onednn and _winograd_pays(p):
        return "winograd"
    return "onednn" if onednn and _onednn_pays(p, kernel, xla) else xla


def forward_method(p: ConvProblem, backend: str, onednn: bool) -> str:
    """The forward method ``lowering="auto"`` picks for ``p`` on ``backend`` (``onednn``: whether
    the CPU table may pick oneDNN)."""
    _check_backend(backend)
    if backend == "cpu":
        return _cpu(Kernel.FORWARD, p, onednn, _forward_cpu(p))
    return "conv"


def weight_grad_method(p: ConvProblem, backend: str, onednn: bool) -> str:
    """The weight-gradient method ``lowering="auto"`` picks for ``p`` on ``backend``."""
    _check_backend(backend)
    if backend == "cpu":
        return _cpu(Kernel.WEIGHT, p, onednn, _weight_grad_cpu(p))
    if backend == "gpu":
        return _weight_grad_gpu(p)
    return "vjp"


def data_grad_method(p: ConvProblem, backend: str, onednn: bool) -> str:
    """The data-gradient method ``lowering="auto"`` picks for ``p`` on ``backend``."""
    _check_backend(backend)
    if backend == "cpu":
        return _cpu(Kernel.DATA, p, onednn, _data_grad_cpu(p))
    if backend == "gpu":
        return _data_grad_gpu(p)
    return "vjp"


def _forward_cpu(p: ConvProblem) -> str:
    # The CPU forward table (docs/lowerings.md, "Forward"): depthwise per tap ("shifted"
    # unstrided, "dot" strided); other grouped as block-diagonal, per group or "dot"; 1x1
    # kernels and unstrided 3D as products ("dot"); 2D dense kxk as XLA's convolution.
    # Past 2^27 elements in x or y no rule picks a per-tap form (its slices are copies).
    small = _operands_fit(p)
    icg = p.in_channels // p.groups
    unstrided = all(s == 1 for s in p.strides)
    if p.whole_window:
        # one product over the window's axes (lowering/taps.py); with one output channel per
        # group (a reduction over the window) or a small 1D/2D problem, XLA's convolution
        one_out = p.out_channels // p.groups == 1
        tiny = p.rank <= 2 and macs(p) < WHOLE_WINDOW_DOT_MIN_MACS
        return "conv" if one_out or tiny else "dot"
    if not small:
        return "conv"
    if p.groups > 1 and icg == 1:
        return "shifted" if unstrided else "dot"
    if _block_diagonal_pays(p, "forward"):
        return "block_diagonal"
    if _per_group_pays(p):
        return "per_group"
    if p.groups > 1:
        return "dot"
    per_tap_3d = p.rank == 3 and unstrided and macs(p) >= PER_TAP_3D_MIN_MACS["forward"]
    if icg >= 4 and (all(k == 1 for k in p.kernel) or per_tap_3d):
        return "dot"
    return "conv"


def _weight_grad_cpu(p: ConvProblem) -> str:
    if all(o == 1 for o in p.output_size):
        return "dot"
    if _block_diagonal_pays(p, "weight"):
        return "block_diagonal"
    if all(k == 1 for k in p.kernel):
        return "dot"
    if _per_group_pays(p):
        return "per_group"
    # 3D: per-tap products (XLA:CPU has no fast 3D convolution); 2D keeps the convolution
    # (docs/lowerings.md, "Weight gradient")
    if len(p.kernel) == 3 and p.in_channels > p.groups and (p.groups == 1 or
                                                            p.in_channels // p.groups >= 4):
        if macs(p) >= PER_TAP_3D_MIN_MACS["weight"]:
            return "dot"
        if p.groups == 1:
            return "vjp"  # the smallest: jax.vjp's own program (its pads inside the convolution)
    if p.groups > 1 and p.in_channels == p.groups:
        return "shifted"
    # XLA:CPU's 1D/2D convolution expands batch_group_count into a dense problem
    if p.groups > 1 and len(p.kernel) <= 2:
        return "feature_group"
    return "conv"


def _weight_grad_gpu(p: ConvProblem) -> str:
    # dense 3D: per-tap products; elsewhere jax.vjp's own program (docs/lowerings.md, "GPU")
    if p.rank == 3 and p.groups == 1:
        return "dot"
    return "vjp"


def _data_grad_cpu(p: ConvProblem) -> str:
    # The CPU data-gradient table (docs/lowerings.md, "Data gradient"): one product for a
    # whole window or a 1x1 kernel; block-diagonal or per group for grouped problems; per-tap
    # products for undilated grouped and small 3D problems; the grid for small 1D/2D results;
    # otherwise one convolution per stride phase (at most 64), or the grid.
    undilated = all(d == 1 for d in p.dilations)
    small = math.prod(p.x_shape) <= DOT_MAX_RESULT_ELEMENTS
    if p.whole_window:
        return "dot"
    if _block_diagonal_pays(p, "data"):
        return "block_diagonal"
    if small and all(k == 1 for k in p.kernel):
        if p.out_channels // p.groups < 4:
            # a product over 2-3 channels is bound by memory: XLA's convolution on the grid
            return "grid"
        return "dot"  # one product per stride phase
    if _per_group_pays(p):
        return "per_group"
    if undilated and small and (p.groups > 1 or
                                (p.rank == 3 and max(p.in_channels, p.out_channels) <= 128)):
        return "dot"
    if p.rank <= 2 and p.in_channels <= 4:
        return "grid"
    phases = math.prod(p.strides)
    return "phases" if 1 < phases <= 64 else "grid"


def _data_grad_gpu(p: ConvProblem) -> str:
    # 3D windows that do not overlap (one tap per output element) with at most 32 result
    # channels: per-tap products; elsewhere jax.vjp's own program (docs/lowerings.md, "GPU")
    non_overlapping = p.kernel == p.strides and all(d == 1 for d in p.dilations)
    small = math.prod(p.x_shape) <= DOT_MAX_RESULT_ELEMENTS
    if p.rank == 3 and p.groups == 1 and non_overlapping and p.in_channels <= 32 and small:
        return "dot"
    return "vjp"


#: The chooser of each kernel.
METHOD = {Kernel.FORWARD: forward_method, Kernel.DATA: data_grad_method,
          Kernel.WEIGHT: weight_grad_method}
