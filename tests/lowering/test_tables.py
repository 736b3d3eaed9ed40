"""What ``lowering="auto"`` picks: the CPU table with and without the oneDNN extra, the GPU
and default tables, unknown or inapplicable methods refused, and the override reaching every
family's op."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src import geometry, lowering
from jaxconv._src.lowering import tables
from jaxconv._src.kernel import Kernel
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support import oracles
from tests.support.cases import pack_fractal_z_loop
from tests.support.lowering_matrix import (
    HIGHEST,
    _problem_strided,
)


def test_cpu_table_picks_onednn_where_built_and_large_enough():
    """With the extra built, every kernel of a problem of at least ONEDNN_MIN_MACS
    multiply-adds is oneDNN's on CPU (never on the other backends); below it, and without the
    extra, the XLA:CPU rules."""
    def problem(n, size, cin, cout, k=3):
        return geometry.convolution_problem(
            "convolution", geometry.Names(), x_shape=(n, size, size, cin), y_shape=None,
            w_shape=(k, k, cin, cout), strides=None, pads_begin=None, pads_end=None,
            dilations=None, auto_pad="none", groups=1, data_format="NXC", filter_format="XIO")

    big, small = problem(8, 32, 16, 32), problem(1, 4, 2, 2)  # 3.3e7 and 288 multiply-adds
    # 1x1, 2 -> 2 channels: one multiply-add per element of x and y, bound by memory
    thin = problem(8, 128, 2, 2, k=1)
    whole = problem(2, 33, 16, 4, k=33)  # one window over the whole input: XLA's product
    built = library.status().available
    for kernel in Kernel:
        assert (lowering.choose(kernel, big, "cpu") == "onednn") == built
        assert lowering.choose(kernel, small, "cpu") != "onednn"
        assert (lowering.choose(kernel, thin, "cpu") == "onednn") == (
            built and kernel is Kernel.WEIGHT)
        assert lowering.choose(kernel, whole, "cpu") != "onednn"
        for backend in ("gpu", "default"):
            assert lowering.choose(kernel, big, backend) != "onednn"


def test_cpu_table_picks_onednn_over_xla_convolution_from_fewer_multiply_adds():
    """Between ONEDNN_OVER_XLA_CONV_MIN_MACS and ONEDNN_MIN_MACS multiply-adds oneDNN takes a
    forward or data gradient that the XLA:CPU rules give XLA's convolution ("conv", "grid"),
    never a weight gradient, nor a problem the rules reorganise (a product per tap)."""
    def problem(n, size, cin, cout, k, dilation=1, pads_end=0):
        return geometry.convolution_problem(
            "convolution", geometry.Names(), x_shape=(n, size, size, cin), y_shape=None,
            w_shape=(k, k, cin, cout), strides=None, pads_begin=1, pads_end=pads_end,
            dilations=dilation, auto_pad="none", groups=1, data_format="NXC",
            filter_format="XIO")

    # benchdnn dilated_conv:2 at N16 (8.6e4 multiply-adds; XLA's convolution 0.11-0.27 ms)
    medium = problem(16, 8, 4, 6, 3, dilation=2)
    # the same at N2 (1.1e4): below the threshold
    small = problem(2, 8, 4, 6, 3, dilation=2)
    # a window over the whole input at N8 with 8 channels (2.5e4): the rules' product for the
    # data gradient, XLA's convolution for the forward (below WHOLE_WINDOW_DOT_MIN_MACS), never
    # oneDNN (whose direct kernels do not tile it)
    whole = problem(8, 5, 8, 8, 7, pads_end=1)
    macs = tables.macs
    assert tables.ONEDNN_OVER_XLA_CONV_MIN_MACS <= macs(medium) < tables.ONEDNN_MIN_MACS
    assert macs(small) < tables.ONEDNN_OVER_XLA_CONV_MIN_MACS
    assert tables.ONEDNN_OVER_XLA_CONV_MIN_MACS <= macs(whole) < tables.ONEDNN_MIN_MACS
    built = library.status().available
    xla = {kernel: tables.METHOD[kernel](medium, "cpu", False) for kernel in Kernel}
    assert (xla[Kernel.FORWARD], xla[Kernel.DATA]) == ("conv", "grid")
    for kernel in (Kernel.FORWARD, Kernel.DATA):
        assert lowering.choose(kernel, medium, "cpu") == ("onednn" if built else xla[kernel])
        assert lowering.choose(kernel, small, "cpu") != "onednn"
        assert lowering.choose(kernel, whole, "cpu") == (
            "conv" if kernel is Kernel.FORWARD else "dot")
    assert lowering.choose(Kernel.WEIGHT, medium, "cpu") != "onednn"


@pytest.mark.skipif(not library.status().available, reason="the onednn extra is not built")
@pytest.mark.parametrize("isa,onednn", [("AVX2", False), ("AVX-512 BF16", True)])
def test_small_dense_problems_stay_xla_without_avx512(monkeypatch, isa, onednn):
    """Without AVX-512, a dense weight gradient of fewer than ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS
    multiply-adds (oneDNN's gemm-based implementation) and a dense forward of fewer than
    ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS whose channel counts are multiples of 8 (XLA's vectors
    full) take the XLA:CPU rules; the data gradient, 4 -> 4 channels and larger problems keep
    oneDNN."""
    status = dataclasses.replace(library.status(), isa=isa)
    monkeypatch.setattr(library, "status", lambda: status)
    # benchdnn dilated_conv:14 at N16: 1.5e5 multiply-adds
    dense = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(16, 8, 5, 8), y_shape=None, w_shape=(3, 3, 8, 8),
        strides=None, pads_begin=(1, 3), pads_end=(1, 0), dilations=(1, 3), auto_pad="none",
        groups=1, data_format="NXC", filter_format="XIO")
    assert tables.macs(dense) < tables.ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS
    assert (lowering.choose(Kernel.WEIGHT, dense, "cpu") == "onednn") == onednn
    assert tables.macs(dense) < tables.ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS
    assert (lowering.choose(Kernel.FORWARD, dense, "cpu") == "onednn") == onednn
    assert lowering.choose(Kernel.DATA, dense, "cpu") == "onednn"
    half = geometry.convolution_problem(  # 4 -> 4 channels: XLA's AVX2 vectors half empty
        "t", geometry.Names(), x_shape=(16, 8, 12, 4), y_shape=None, w_shape=(3, 3, 4, 4),
        strides=None, pads_begin=1, pads_end=1, dilations=(1, 3), auto_pad="none", groups=1,
        data_format="NXC", filter_format="XIO")
    assert tables.ONEDNN_MIN_MACS <= tables.macs(half) < \
        tables.ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS
    assert lowering.choose(Kernel.FORWARD, half, "cpu") == "onednn"
    big = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(16, 16, 10, 8), y_shape=None, w_shape=(3, 3, 8, 8),
        strides=None, pads_begin=1, pads_end=1, dilations=None, auto_pad="none", groups=1,
        data_format="NXC", filter_format="XIO")
    assert tables.macs(big) >= tables.ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS
    assert tables.macs(big) >= tables.ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS
    assert lowering.choose(Kernel.WEIGHT, big, "cpu") == "onednn"
    assert lowering.choose(Kernel.FORWARD, big, "cpu") == "onednn"


def test_forward_auto_choice(xla_cpu_rules):
    def problem(groups, ic, kernel, strides=1, n=2, size=9):
        return geometry.convolution_problem(
            "t", geometry.Names(), x_shape=(n, *[size] * len(kernel), ic), y_shape=None,
            w_shape=(*kernel, ic // groups, max(8, ic)), strides=strides, pads_begin=None,
            pads_end=None, dilations=None, auto_pad="valid", groups=groups,
            data_format="NXC", filter_format="XIO")

    def cpu(*args, **kw):
        return lowering.choose(Kernel.FORWARD, problem(*args, **kw), "cpu")

    assert cpu(4, 4, (3, 3)) == "shifted"  # depthwise: a multiply-add per tap
    assert cpu(4, 4, (3, 3), strides=2) == "dot"
    assert cpu(2, 8, (3, 3)) == "per_group"  # grouped: one dense problem per group
    assert cpu(128, 256, (3, 3)) == "dot"  # ... up to 64 groups; past them products per tap
    assert cpu(1, 8, (1, 1)) == "dot"  # 1x1: one product
    assert cpu(1, 2, (1, 1)) == "conv"  # ... but not with < 4 channels
    assert cpu(1, 8, (3, 3, 3)) == "dot"  # 3D, stride 1
    assert cpu(1, 4, (2, 1, 1), n=1, size=2) == "conv"  # ... past the smallest (< 1e4 MACs)
    assert cpu(1, 8, (2, 2, 2), strides=2) == "conv"
    assert cpu(1, 8, (3, 3)) == "conv"  # 2D dense: XLA's convolution
    assert cpu(2, 8, (3, 3, 3)) == "block_diagonal"  # 3D, few channels per group: one dense problem
    assert cpu(2, 8, (3, 3, 3), strides=2) == "dot"  # ... at stride 1
    assert cpu(2, 128, (3, 3, 3)) == "dot"  # ... and at most 64 channels
    # one window over the whole input: one product, or XLA's convolution for one output
    # channel per group (its reduction over the window) and below WHOLE_WINDOW_DOT_MIN_MACS
    assert cpu(1, 8, (9, 9), n=32) == "dot"
    assert cpu(4, 8, (9, 9), n=128) == "dot"  # 2 output channels per group
    assert cpu(1, 8, (9, 9), n=2) == "conv"  # 1.0e4 multiply-adds
    assert cpu(1, 8, (9, 9, 9), n=2) == "dot"  # ... in 2D only
    whole_one = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(2, 9, 9, 9, 8), y_shape=None, w_shape=(9, 9, 9, 8, 1),
        strides=None, pads_begin=None, pads_end=None, dilations=None, auto_pad="valid",
        groups=1, data_format="NXC", filter_format="XIO")
    assert lowering.choose(Kernel.FORWARD, whole_one, "cpu") == "conv"
    assert lowering.choose(Kernel.DATA, whole_one, "cpu") == "dot"
    for args in [(4, 4, (3, 3)), (2, 8, (3, 3)), (1, 8, (3, 3, 3))]:
        assert lowering.choose(Kernel.FORWARD, problem(*args), "gpu") == "conv"
        assert lowering.choose(Kernel.FORWARD, problem(*args), "default") == "conv"


def test_auto_choice(xla_cpu_rules):
    def problem(groups, ic, kernel, n=2, size=9):
        return geometry.convolution_problem(
            "t", geometry.Names(), x_shape=(n, *[size] * len(kernel), ic), y_shape=None,
            w_shape=(*kernel, ic // groups, max(8, ic)), strides=None, pads_begin=None, pads_end=None,
            dilations=None, auto_pad="valid", groups=groups, data_format="NXC",
            filter_format="XIO")

    def cpu(*args, **kw):
        return lowering.choose(Kernel.WEIGHT, problem(*args, **kw), "cpu")

    assert cpu(1, 4, (3, 3)) == "conv"
    assert cpu(2, 4, (3, 3)) == "per_group"  # one dense problem per group
    assert cpu(128, 256, (3, 3)) == "feature_group"  # past 64 groups
    assert cpu(4, 4, (3, 3)) == "shifted"
    assert cpu(2, 4, (1, 1)) == "dot"
    # 3D: per-tap products, except with fewer than 4 channels per group, and jax.vjp's own
    # program for the smallest (< 1e5 multiply-adds).
    assert cpu(1, 4, (3, 3, 3)) == "dot"
    assert cpu(1, 4, (3, 3, 3), n=1, size=5) == "vjp"
    assert cpu(2, 8, (3, 3, 3)) == "block_diagonal"  # 3D, <= 5 channels per group: one dense problem
    assert cpu(2, 16, (3, 3, 3)) == "dot"  # 3D grouped: per-tap products, not per_group
    assert cpu(4, 8, (3, 3, 3)) == "block_diagonal"
    assert cpu(4, 256, (3, 3, 3)) == "dot"  # 64 channels per group, over 64 in all
    assert cpu(4, 4, (3, 3, 3)) == "shifted"
    # GPU (H100 measurements): per-tap products for dense 3D only, jax.vjp's program elsewhere.
    gpu = {args: lowering.choose(Kernel.WEIGHT, problem(*args), "gpu") for args in [
        (1, 4, (3, 3)), (2, 4, (3, 3)), (4, 4, (3, 3)), (2, 4, (1, 1)), (1, 4, (1, 1)),
        (1, 4, (3, 3, 3)), (2, 8, (3, 3, 3))]}
    assert gpu.pop((1, 4, (3, 3, 3))) == "dot"
    assert set(gpu.values()) == {"vjp"}
    # Backends without measurements: always jax.vjp's program.
    assert lowering.choose(Kernel.WEIGHT, problem(2, 4, (3, 3)), "default") == "vjp"
    with pytest.raises(ValueError, match="backend must be one of"):
        lowering.choose(Kernel.WEIGHT, problem(2, 4, (3, 3)), "tpu")


def test_kernels_reject_an_unknown_method():
    """The kernels' own dispatch is exhaustive: nothing falls through to a default form."""

    p = _problem_strided(2)
    dy, w = jnp.ones(p.y_shape), jnp.ones(p.filter_shape)
    with pytest.raises(ValueError, match=r"lowering: method must be 'auto', 'direct' or one of \['grid', "
                                         r"'phases', 'dot', 'vjp', 'onednn', 'onednn_f32', 'winograd', "
                                         r"'winograd_2x2', 'winograd_3x3', 'winograd_4x4', 'per_group', "
                                         r"'block_diagonal'\], "
                                         r"got 'fft'"):
        lowering.data_grad(dy, w, p, method="fft")
    with pytest.raises(ValueError, match="got 'grid'"):
        lowering.weight_grad(jnp.ones(p.x_shape), dy, p, method="grid")


def test_inapplicable_or_unknown_method():
    x, dy = jnp.ones((1, 6, 6, 4)), jnp.ones((1, 4, 4, 4))
    with pytest.raises(ValueError, match=r"^convolution_backprop_filters: lowering must be one of "
                                         r"\['auto', 'direct', 'conv', 'feature_group', 'shifted', 'dot', "
                                         r"'vjp', 'onednn', 'onednn_f32', 'winograd', 'winograd_2x2', "
                                         r"'winograd_3x3', 'winograd_4x4', 'per_group', "
                                         r"'block_diagonal'\], got 'fast'"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="fast")
    with pytest.raises(ValueError, match=r"lowering='shifted' does not apply to this problem: "
                                         r"'shifted' needs one input channel per group"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="shifted")
    with pytest.raises(ValueError, match=r"'feature_group' regroups a grouped problem, got "
                                         r"groups=1; use one of \['auto', 'direct', 'conv', 'dot', 'vjp'\]"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="feature_group")
    with pytest.raises(ValueError, match=r"'per_group' splits a grouped problem, got groups=1"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="per_group")
    with pytest.raises(ValueError, match=r"'per_group' splits a grouped problem, got groups=1"):
        jaxconv.convolution_backward_data(dy, jnp.ones((3, 3, 4, 4)), (6, 6), lowering="per_group")
    with pytest.raises(TypeError, match="convolution_backprop_filters: lowering must be a string"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering=None)
    with pytest.raises(ValueError, match="^convolution_backward_data: lowering must be one of "
                                         r"\['auto', 'direct', 'grid', 'phases', 'dot', 'vjp', 'onednn', "
                                         r"'onednn_f32', 'winograd', 'winograd_2x2', 'winograd_3x3', "
                                         r"'winograd_4x4', 'per_group', 'block_diagonal'\], "
                                         r"got 'fft'"):
        jaxconv.convolution_backward_data(dy, jnp.ones((3, 3, 4, 4)), (6, 6), lowering="fft")


@pytest.mark.parametrize("method", ["conv", "feature_group", "dot", "vjp"])
def test_conv_transpose_and_tbe_follow_the_override(method):
    """The ConvTranspose and TBE weight gradients use the same kernels."""
    rng = np.random.default_rng(1)
    x = h.random(rng, (2, 4, 5, 5))
    dy = h.random(rng, (2, 6, 11, 11))  # 2*(5-1) + 3 - 1 - 0 + 1
    kw = dict(strides=2, pads_begin=1, pads_end=0, output_padding=1, groups=2,
              data_format="NCX", weights_format="IOX", precision=HIGHEST)
    ref = jaxconv.conv_transpose_backward_weights(x, dy, (4, 3, 3, 3), **kw)
    got = jaxconv.conv_transpose_backward_weights(x, dy, (4, 3, 3, 3), **kw, lowering=method)
    h.assert_close(got, ref, jnp.float32)
    _, _, dw_t = oracles.conv_transpose_all(h.to_f64(x), np.zeros((4, 3, 3, 3)), h.to_f64(dy),
                                            strides=(2, 2), dilations=(1, 1), pads_begin=(1, 1),
                                            out_size=(11, 11), groups=2)
    h.assert_close(got, dw_t, jnp.float32)

    x5 = jaxconv.tbe.to_5hd(h.random(rng, (2, 6, 7, 7)))
    dy5 = jaxconv.tbe.to_5hd(h.random(rng, (2, 4, 7, 7)))
    para = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilations": [1, 1, 1, 1], "groups": 2}
    ref = jaxconv.conv2d_backprop_filter(x5, dy5, (4, 3, 3, 3), para)
    got = jaxconv.conv2d_backprop_filter(x5, dy5, (4, 3, 3, 3), para, lowering=method)
    h.assert_close(got, ref, jnp.float32)
    _, _, dw_t = oracles.conv_all(
        h.to_f64(jaxconv.tbe.from_5hd(x5, 6)), np.zeros((4, 3, 3, 3)),
        h.to_f64(jaxconv.tbe.from_5hd(dy5, 4)), strides=(1, 1), dilations=(1, 1),
        pads_begin=(1, 1), pads_end=(1, 1), groups=2)
    h.assert_close(got, pack_fractal_z_loop(dw_t, 2), jnp.float32)


