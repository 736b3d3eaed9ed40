"""Which formulation each gradient kernel uses, per backend (docs/performance.md).

``lowering="auto"`` (the default of every op that has a choice) does not look at
``jax.default_backend()``: a jitted op is traced once and may be lowered for
another platform (``jax.export``, or arrays placed on another device). The
primitive registers one lowering per platform (``autodiff.py``): the program
lowered for a platform runs that backend's table, once per kernel call, and the
compiler never sees the other backends' choices. Every name a table returns is a
method of ``lowering/registry.py`` (tests/test_lowerings.py checks it).

The rules are tables over the resolved problem, one per backend:

* ``"cpu"``: ``"onednn"`` (oneDNN's own primitive, with the ``onednn`` extra built) for
  every problem it takes except the smallest (below :data:`ONEDNN_MIN_FLOPS`, or
  :data:`ONEDNN_OVER_XLA_CONV_MIN_MACS` where the rest would be XLA's convolution); the rest,
  and every problem without the extra, by the XLA:CPU rules, measured on XLA:CPU (2-core
  AMD EPYC, jaxlib 0.10.2; the benchdnn lists of ``jaxconv/_src/bench/shapes``); the
  ``block_diagonal`` rule and the element-wise outer product on a 2-core Intel Xeon
  (AVX-512).
* ``"gpu"`` (CUDA and ROCm): measured on an NVIDIA H100 (jax 0.11.2, CUDA 13)
  on the benchdnn resnet_50 and 3D lists; ROCm was not measured and shares the
  table. Where a rule has no measurement behind it, the GPU table keeps
  ``"vjp"``.
* ``"default"`` (TPU and any other platform): ``"vjp"``, the program JAX's own
  autodiff emits, so that jaxconv is never slower there than ``jax.vjp``.
"""

from __future__ import annotations

import math
from typing import Literal

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Kernel
from jaxconv._src.onednn import library

#: The backends with a rule table, and the platforms each one covers.
BACKENDS = ("cpu", "gpu", "default")
PLATFORMS = {"cpu": ("cpu",), "gpu": ("cuda", "rocm"), "default": ()}

# "dot" keeps about 8x its result in temporaries (the per-tap slices and the phases; measured
# with XLA's memory analysis: 2.8 GiB for the 0.33 GiB result of the 3D GroupConvolutionBackpropData
# example at half size), "phases" about 2.4x: past 2^27 result elements (0.5 GiB in float32)
# no rule picks "dot".
DOT_MAX_RESULT_ELEMENTS = 2 ** 27


def _operands_fit(p: ConvProblem) -> bool:
    """Whether x and y both have at most :data:`DOT_MAX_RESULT_ELEMENTS` elements."""
    return max(math.prod(p.x_shape), math.prod(p.y_shape)) <= DOT_MAX_RESULT_ELEMENTS


#: The most groups "per_group" unrolls into separate problems (one convolution each).
PER_GROUP_MAX_GROUPS = 64


def _per_group_pays(p: ConvProblem) -> bool:
    """XLA:CPU: a grouped (not depthwise) 1D/2D problem of at most 2^27 elements runs as g dense ones.

    XLA:CPU runs a grouped convolution far below the dense speed: g dense problems were
    2.3-4.3x faster forward, 1.4-8.7x on weight gradients and 1.6-4.2x on data gradients
    (N16, 2D, g = 2..32; alexnet deconv2's 5x5 g2: 168/199/197 -> 39/43/78 ms). In 3D the
    per-tap products already avoid the grouped convolution, and g 3D problems were mixed
    against them on benchdnn's 3d_gconv rows (0.5-2x), so 3D keeps its rules.
    """
    return (_operands_fit(p) and p.rank <= 2 and 1 < p.groups <= PER_GROUP_MAX_GROUPS
            and p.in_channels > p.groups)


#: The most channels (input or output, all groups) "block_diagonal" expands into one dense problem.
BLOCK_DIAGONAL_MAX_CHANNELS = 64


def _block_diagonal_pays(p: ConvProblem, kind: Literal["forward", "data", "weight"]) -> bool:
    """XLA:CPU: a grouped problem of few channels per group as one dense, block-diagonal one.

    g times the arithmetic, but XLA:CPU's products of 2-8 channels per group run far below
    the dense speed. Measured (2 cores, float32, ms, the CPU choice before -> block_diagonal):
    benchdnn's 3d_gconv rows (N2, 24-64 channels, 2-8 per group) forward 1.5-3.4x, data
    gradients 1.4-4.5x; weight gradients 2x on 1x1, 3.2x at 2 channels per group (C64 g32
    16^3, against ``conv``), level with ``dot`` at 4-5 (1.03x) and behind it at 8 (0.97x) or
    strided (0.8x). At 128-256 channels it lost (0.7-0.9x).
    In 2D only the data gradient gained (N8 56x56 C64 g32: 43 -> 11; C24 g4: 8.6 -> 2.8),
    against 0.06-0.9x for the 2D forward and weight gradient (the dense 2D convolution).
    """
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


# Measured with benchmarks/onednn_choice.py (2-core AMD EPYC, AVX2, oneDNN 3.2.0; the first
# two problems of the resnet_50, mobilenet, mobilenet_dw, 3D and dilated lists, N <= 8;
# docs/benchmarks/onednn_choice.json): oneDNN against the XLA:CPU rules below, per kernel,
# weight 1.4-7.7x (resnet_50 conv1 431 -> 56 ms; 3d_conv_pad:1 33 -> 8.6 ms), data 1.0-4.0x,
# forward 0.94-4.8x (one tie: resnet_50 res2a_branch1 18.2 vs 17.0 ms), within 1.0-1.3x of
# PyTorch's own oneDNN. Its fixed cost per call (~0.1 ms through the FFI) loses on the
# smallest problem (dilated_conv:2, 8.6e4 multiply-adds: 0.16 vs 0.09 ms; the call cost
# less since, ONEDNN_OVER_XLA_CONV_MIN_MACS below).
#: below this many multiply-adds a problem stays with the XLA:CPU rules
ONEDNN_MIN_FLOPS = 1e5


#: Where the XLA:CPU rules take XLA's own convolution for a forward ("conv") or a data
#: gradient ("grid"), oneDNN from this many multiply-adds: after its call's fixed cost fell to
#: ~20 us (a 2x2 problem; XLA's convolution 12-18 us), it beat XLA's convolution on every such
#: problem of benchdnn's dilated list from 2e4 to 1e5 multiply-adds, most of them 1D and
#: dilated, where XLA's convolution takes 40-480 us: data gradients 0.16-0.61x of its time
#: (dilated_conv:6 484 -> 72 us, dilated_conv:2 273 -> 67), forwards 0.30-0.69x and one tie
#: (dilated_conv:1, 45 vs 49 us); below 2e4 it lost as often as it won (dilated_conv:3 data
#: gradient 28 vs 70 us). Where the rules reorganise the problem (a product per tap, a
#: multiply-add per tap) and for weight gradients (1.7-6.5x slower through oneDNN below 1e5)
#: ONEDNN_MIN_FLOPS holds (2-core Zen 3 EPYC, AVX2, oneDNN 3.2; AVX-512 machines take the same
#: threshold, not measured there).
ONEDNN_OVER_XLA_CONV_MIN_MACS = 2e4


#: Without AVX-512, oneDNN 3.2 computes the weight gradient of a small dense problem by its
#: gemm-based implementation (im2col, then a product), and XLA's convolution beat it: benchdnn
#: dilated_conv:11, 13 and 14 (1.1e5-2.2e5 multiply-adds, "x64:gemm:jit") ran at 0.74, 0.80
#: and 0.24x jax.vjp's speed (71 vs 53 us, 86 vs 69, 88 vs 21; 2-core Zen 3 EPYC, AVX2, full
#: bench run), where on AVX-512 its direct kernel won (dilated_conv:14 14 vs 18 us, Zen 5).
#: Below this many multiply-adds such a weight gradient stays with the XLA:CPU rules.
ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS = 3e5


#: Without AVX-512, XLA's convolution (Eigen) runs a small dense forward fast where its
#: channel counts fill AVX2's 8-float vectors, and oneDNN's fixed cost per call (the weights'
#: reorder, the kernel's set-up, ~20 us) then outweighs its kernel: 3x3 forwards, N16 8x2..8x3
#: outputs, 8 -> 8 channels, 1.5e5-2.2e5 multiply-adds, ran at 0.71-1.07x of XLA's speed
#: through oneDNN (benchdnn dilated_conv:14, 1.5e5: 79 vs 53 us), where 4 -> 4 channels
#: (XLA's vectors half empty) ran 1.5-3.6x faster and 16 -> 16 from 5.9e5 up 1.05-2.5x faster
#: (2-core Zen 3 EPYC, oneDNN 3.2). Below this many multiply-adds such a forward (dense, every
#: channel count a multiple of 8) stays with the XLA:CPU rules.
ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS = 2e5


#: a forward or data gradient of fewer multiply-adds per element of x and y is bound by
#: memory, where XLA's loop is as fast as oneDNN's call (measured on a 2-core AMD EPYC, Zen 4
#: with AVX-512, jaxconv bench --preset full: vnet:conv4, 1x1x1 with 2 -> 2 channels
#: on 2 x 128x128x64: data gradient 1.9 ms against 3.4, forward 1.5 against 2.0; its weight
#: gradient 13 -> 1.2 ms stays oneDNN's; strided depthwise rows, at 1.8, gain 2-120x)
ONEDNN_MIN_MACS_PER_ELEMENT = 1.5


#: XLA:CPU's 3D per-tap products beat its convolution on benchdnn's 3D problems (1e7-1e10
#: multiply-adds, below); on the smallest ones of the dilated list (2 x 16 channels, windows of
#: 2-5 taps, 1e3-6e4 multiply-adds, 10-40 us per call) they lost to it: forward below 1e4
#: (dilated_conv:26-31, 0.64-0.95x of jax.vjp's time) and weight gradient below 1e5
#: (dilated_conv:32-40, 0.76-0.97x), where the extra slices and the sum cost more than the
#: arithmetic they reorganise; there the dense weight gradient is jax.vjp's own program
#: (2-core AMD EPYC, Zen 5; jaxconv bench --lists conv_shapes_dilated).
PER_TAP_3D_MIN_MACS = {"forward": 1e4, "weight": 1e5}


#: A 1D or 2D forward whose window covers the whole input (one output position per axis) is
#: one product ("dot") on XLA:CPU from this many multiply-adds (XLA's convolution took 5-10x
#: its time from 1e7 up, below); under it XLA's own convolution, which the product's slice
#: and copy fusions cost more than: benchdnn's dilated list, 16 x 4 -> 6 channels, 5x5-7x7
#: dilated windows (1e4-2e4 multiply-adds), 21.4 us against jax.vjp's 18.2; 2 x 12x12 x 4 -> 6
#: channels, 13.0 us against 16.2 (2-core AVX-512 Xeon). Not for 3D windows (a 3x3x3 one of
#: 1.4e4 multiply-adds: 19.4 against 15.5) nor for data gradients, where XLA's convolution
#: on the grid took 3-13x the product's time (2D 12x12: 177 against 16 us).
WHOLE_WINDOW_DOT_MIN_MACS = 1e5


def macs(p: ConvProblem) -> int:
    """The problem's multiply-adds."""
    return p.batch * math.prod(p.output_size) * p.out_channels * math.prod(p.kernel) * (
        p.in_channels // max(p.groups, 1))


def _onednn_pays(p: ConvProblem, kernel: Kernel = Kernel.WEIGHT, xla: str = "") -> bool:
    """Whether the CPU table picks ``"onednn"`` for ``kernel`` of ``p`` (built, loaded,
    applicable, large enough; a forward or data gradient not bound by memory), where the
    XLA:CPU rules pick ``xla``."""
    if p.whole_window:
        # oneDNN's direct kernels do not tile it (its reference code: 192^3 weight gradient
        # 18 s against XLA's 1.0 s, Zen 4 EPYC, in the full bench run)
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
    minimum = ONEDNN_OVER_XLA_CONV_MIN_MACS if xla_conv else ONEDNN_MIN_FLOPS
    return count >= minimum and library.why_not(p) is None


def forward_method(p: ConvProblem, backend: str, onednn: bool = True) -> str:
    """The forward method ``lowering="auto"`` picks for ``p`` on ``backend`` (``onednn=False``:
    the XLA:CPU rules alone, for programs XLA partitions across devices)."""
    _check_backend(backend)
    if backend == "cpu":
        xla = _forward_cpu(p)
        return "onednn" if onednn and _onednn_pays(p, Kernel.FORWARD, xla) else xla
    return "conv"


def weight_grad_method(p: ConvProblem, backend: str, onednn: bool = True) -> str:
    """The weight-gradient method ``lowering="auto"`` picks for ``p`` on ``backend``."""
    _check_backend(backend)
    if backend == "cpu":
        return "onednn" if onednn and _onednn_pays(p) else _weight_grad_cpu(p)
    if backend == "gpu":
        return _weight_grad_gpu(p)
    return "vjp"


def data_grad_method(p: ConvProblem, backend: str, onednn: bool = True) -> str:
    """The data-gradient method ``lowering="auto"`` picks for ``p`` on ``backend``."""
    _check_backend(backend)
    if backend == "cpu":
        xla = _data_grad_cpu(p)
        return "onednn" if onednn and _onednn_pays(p, Kernel.DATA, xla) else xla
    if backend == "gpu":
        return _data_grad_gpu(p)
    return "vjp"


def _forward_cpu(p: ConvProblem) -> str:
    # Measured with jaxconv.convolution on the benchdnn lists (N <= 16, float32, medians of 3):
    # * depthwise: 10-35x faster per tap than XLA:CPU's grouped convolution (mobilenet dw
    #   conv3_1 23.9 -> 0.94 ms; 56x56 C144 N8 111 -> 3.2 ms); a multiply-add per tap
    #   ("shifted") at stride 1, a product per tap ("dot") when strided (0.33 vs 0.50 ms).
    # * other grouped: "dot", 1.2-5x (N8 C256 g32 28x28 53 -> 43 ms; 3d_gconv_channel-block-4
    #   83 -> 17 ms; 3d_gconv_non-block_s2 89 -> 30 ms).
    # * 1x1 kernels: one matrix product, 1.1-4.6x (resnet_50 res2b_branch2a 51 -> 13 ms)
    #   except with < 4 input channels (vnet:conv4, 2 channels: 4.1 vs 10.6 ms).
    # * 3D, stride 1: per-tap products 1.1-2.1x (3d_conv:1 6.4 -> 3.0 ms); with
    #   non-overlapping strided windows (vnet) they ran 1.5x slower.
    # * 2D dense kxk: the convolution (res2a_branch2b 44 vs 92 ms; 3-channel 7x7
    #   resnet_50:conv1 112 vs 1475 ms).
    # Past 2^27 elements in x or y no rule picks a per-tap form (its slices are copies).
    small = _operands_fit(p)
    icg = p.in_channels // p.groups
    unstrided = all(s == 1 for s in p.strides)
    if p.whole_window:
        # "dot" is one product over the window's axes (lowering/taps.py), not the per-tap
        # loop of the rules below (a 33^3 window: 35,937 products, minutes to compile); with
        # one output channel per group (a reduction over the window) XLA's convolution, which
        # splits it across threads, ran faster: 33^3x16 -> 1, N2 0.33 vs 0.55 ms; 12x12
        # depthwise C64, N8 0.037 vs 0.072; "dot" won at 33^3x16 -> 8 (0.79 vs 5.5) and
        # 7x7x512 -> 1000, N16 (11 vs 104; 2-core Zen 3 EPYC)
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
    # XLA:CPU has no fast 3D convolution: per-tap matrix products (batched over groups)
    # ran 1.2-3.8x faster than the convolution on benchdnn's 3D problems, except with
    # 2 channels per group (1.15x slower). On 2D they ran 1.3-2.6x slower: the strided
    # slices cost more there than the library convolution saves.
    if len(p.kernel) == 3 and p.in_channels > p.groups and (p.groups == 1 or
                                                            p.in_channels // p.groups >= 4):
        if macs(p) >= PER_TAP_3D_MIN_MACS["weight"]:
            return "dot"
        if p.groups == 1:
            return "vjp"  # the smallest: jax.vjp's own program (its pads inside the convolution)
    if p.groups > 1 and p.in_channels == p.groups:
        return "shifted"
    # XLA:CPU's 1D/2D convolution expands batch_group_count into a dense problem: 30-80x
    # slower than feature_group on N16 g4..g32 28x28 k3. (3D: "dot" above, or "conv".)
    if p.groups > 1 and len(p.kernel) <= 2:
        return "feature_group"
    return "conv"


def _weight_grad_gpu(p: ConvProblem) -> str:
    # H100, f32 HIGHEST, medians: per-tap products beat the 3D convolution 1.4-24x
    # (vnet:conv5 0.21 vs 5.0 ms, 3d_conv_pad:1 0.071 vs 0.30 ms, 3d_conv:4 (1x1x1)
    # 0.077 vs 0.11 ms). Grouped 3D was not measured.
    if p.rank == 3 and p.groups == 1:
        return "dot"
    # 2D: "feature_group" lost on every grouped problem (N16 C256 g32 28x28 k3: 2.14 vs
    # 0.89 ms); "dot" was 1.9x slower on the 7x7 resnet_50:conv1 and mixed on 1x1
    # (0.77-1.22x of jax.vjp's time); depthwise methods were within noise. jax.vjp's own
    # program is never slower than itself.
    return "vjp"


def _data_grad_cpu(p: ConvProblem) -> str:
    # * "dot" for grouped problems without dilation, and 3D ones of at most 128 channels,
    #   whose result has at most 2^27 elements (memory, above): XLA:CPU's grouped and 3D
    #   convolutions are slow, a matrix product per tap is not (20x on benchdnn's
    #   3d_gconv_non-block_s2, 3.2x on alexnet deconv4, 25-125x on depthwise 56x56).
    #   With a dilation, or g = 1 in 2D, it ran 1.4-2.4x slower than the convolution.
    # * "grid" for 1D/2D results of at most 4 channels (image-sized first layers:
    #   alexnet deconv1, googlenet conv1), where the S^rank phase convolutions ran
    #   1.1-2.3x slower than the one on the grid.
    # * "phases" when a stride is > 1 (at most 64 phases), else "grid".
    undilated = all(d == 1 for d in p.dilations)
    small = math.prod(p.x_shape) <= DOT_MAX_RESULT_ELEMENTS
    if p.whole_window:
        # one product (XLA:CPU's convolution ran 3d_conv_large_shape:1's at 0.01 GFLOP/s):
        # 33^3x16 -> 1, N2 0.4-1.4 ms against jax.vjp's 335; 7x7x512 -> 1000,
        # N16 6 ms against 266 (2-core Zen 3 EPYC)
        return "dot"
    if _block_diagonal_pays(p, "data"):
        return "block_diagonal"
    if small and all(k == 1 for k in p.kernel):
        if p.out_channels // p.groups < 4:
            # a product over 2-3 channels is bound by memory and slower than the convolution:
            # vnet:conv4 (1x1x1, 2 <- 2, 2 x 128x128x64) 1.8 ms against "grid" 0.42, jax.vjp
            # 0.39 (2-core AMD EPYC, Zen 5)
            return "grid"
        return "dot"  # one product (per stride phase): 1.1-2.8x (N8 56x56 1x1 24 <- 144: 2.2 vs 6.2 ms)
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
    # H100: on 3D windows that do not overlap (kernel == stride, no dilation) each output
    # element takes one tap, and per-tap products beat the convolution on the grid at
    # <= 32 result channels (vnet:conv5 0.38 vs 0.59 ms, vnet:conv1 0.145 vs 0.161 ms)
    # but not at 64 (vnet:conv2 0.091 vs 0.081 ms). With overlapping windows "dot" was
    # 2.7-4x slower than jax.vjp (3d_conv_pad:1, 3d_conv:3) and "phases" up to 2x slower.
    non_overlapping = p.kernel == p.strides and all(d == 1 for d in p.dilations)
    small = math.prod(p.x_shape) <= DOT_MAX_RESULT_ELEMENTS
    if p.rank == 3 and p.groups == 1 and non_overlapping and p.in_channels <= 32 and small:
        return "dot"
    return "vjp"


#: The chooser of each kernel.
METHOD = {Kernel.FORWARD: forward_method, Kernel.DATA: data_grad_method,
          Kernel.WEIGHT: weight_grad_method}
