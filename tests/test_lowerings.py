"""Every lowering, forced, against PyTorch on a matrix of problems, and the per-backend choice.

The ops' ``lowering=`` argument forces a formulation; each applicable one must
agree with torch autograd (float64) in every layout, rank, group kind and
geometry here; ``"vjp"`` must compile to the program of ``jax.vjp``; the
automatic choice must be the documented one on every backend, and reach the
compiled program of the platform it is lowered for.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import backends, geometry, lowering
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import shifted, taps
from jaxconv._src.onednn import library
from tests import helpers as h
from tests import oracles
from tests.cases import CONV_TRANSPOSE_MATRIX, pack_fractal_z_loop
from tests.cases import ConvCase as Case

HIGHEST = lax.Precision.HIGHEST
#: every weight-gradient method of the registry (what the matrix below runs, where it applies)
ALL = lowering.methods(Kernel.WEIGHT)
#: the combinators (grouped problems only) and, per kernel, the leaf formulations
COMBINATORS = tuple(m for m, rec in lowering.METHODS.items() if rec.combinator)
DATA_LEAVES = tuple(m for m in lowering.methods(Kernel.DATA) if m not in COMBINATORS)


def _applies(method, case: Case, kernel) -> bool:
    if method == "onednn":  # with the onednn extra built (tests/test_onednn.py says why not)
        return library.status().available
    if method == "shifted":
        return case.groups_name == "depthwise"
    if method == "feature_group":
        return case.groups_name != "g1"
    if method == "per_group":  # where CPU picks it: grouped, not depthwise, k > 1
        return case.groups_name == "g2" and any(k > 1 for k in kernel)
    if method == "block_diagonal":  # grouped, not depthwise (where CPU picks it)
        return case.groups_name == "g2"
    return True


# (rank, data_format, filter_format, groups, geometry) x kernels, including 1x1.
CASES = []
for rank, df, ff in [(1, "NCX", "OIX"), (2, "NXC", "XIO"), (3, "NCX", "XIO"), (2, "NCX", "OIX")]:
    for gname in ("g1", "g2", "depthwise"):
        for geo in ("stride_dil_remainder", "same_upper", "valid"):
            for kernel in ({1: (3,), 2: (3, 2), 3: (2, 3, 2)}[rank], (1,) * rank):
                CASES.append((Case(rank, df, ff, gname, geo), kernel))


def _explicit_pads(case: Case, spatial, kernel):
    """The case's (pads_begin, pads_end), with auto_pad resolved independently of jaxconv."""
    attrs = case.attrs
    mode = attrs["auto_pad"].lower()
    if mode in ("none", "explicit"):
        return attrs["pads_begin"], attrs["pads_end"]
    if mode == "valid":
        return (0,) * case.rank, (0,) * case.rank
    return h.same_pads(spatial, kernel, attrs["strides"], attrs["dilations"],
                       upper=mode == "same_upper")


def _run(case: Case, kernel, method):
    g, ic, oc = {"g1": (1, 4, 3), "g2": (2, 4, 6), "depthwise": (4, 4, 8)}[case.groups_name]
    rng = np.random.default_rng(0)
    spatial = {1: (11,), 2: (9, 7), 3: (6, 5, 7)}[case.rank]
    x = h.random(rng, h.data_shape(case.data_format, 2, ic, spatial))
    w_shape = h.conv_filter_shape(case.filter_format, oc, ic // g, kernel)
    attrs = case.attrs
    pb, pe = _explicit_pads(case, spatial, kernel)
    y_ncx = oracles.conv_output_shape(
        h.data_to_ncx(np.zeros(x.shape), case.data_format).shape,
        h.conv_filter_to_oix(np.zeros(w_shape), case.filter_format).shape,
        strides=attrs["strides"], dilations=attrs["dilations"], pads_begin=pb, pads_end=pe,
        groups=g)
    dy = h.random(rng, h.data_from_ncx(np.zeros(y_ncx), case.data_format).shape)
    got = jaxconv.convolution_backprop_filters(x, dy, w_shape, **attrs, precision=HIGHEST,
                                               lowering=method)
    _, _, dw = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), case.data_format),
        h.conv_filter_to_oix(np.zeros(w_shape), case.filter_format),
        h.data_to_ncx(h.to_f64(dy), case.data_format), strides=attrs["strides"],
        dilations=attrs["dilations"], pads_begin=pb, pads_end=pe, groups=g)
    h.assert_close(got, h.conv_filter_from_oix(dw, case.filter_format), jnp.float32)


# The "dot" products are what XLA:GPU's Triton GEMM fusion once aborted on: isolated off CPU.
ISOLATED = pytest.mark.isolated


#: a forced "onednn" needs the extra built (tests/test_onednn.py says why not)
NEEDS_ONEDNN = pytest.mark.skipif(not library.status().available,
                                  reason="the onednn extra is not built")


def _marks(method):
    return [ISOLATED] if method == "dot" else [NEEDS_ONEDNN] if method == "onednn" else []


PARAMS = [pytest.param(c, k, m, id=f"{m}-{c.id}-k{'x'.join(map(str, k))}", marks=_marks(m))
          for c, k in CASES for m in ALL if _applies(m, c, k)]


@pytest.mark.parametrize("case,kernel,method", PARAMS)
def test_every_lowering_against_torch(case, kernel, method):
    _run(case, kernel, method)


# "conv" is what tests/test_convolution.py checks against torch on its own matrix
FORWARD = tuple(m for m in lowering.methods(Kernel.FORWARD) if m != "conv")
FORWARD_PARAMS = [
    pytest.param(c, k, m, id=f"{m}-{c.id}-k{'x'.join(map(str, k))}", marks=_marks(m))
    for c, k in CASES for m in FORWARD if m != "shifted" or c.groups_name == "depthwise"
    if m not in COMBINATORS or _applies(m, c, k)]


@pytest.mark.parametrize("case,kernel,method", FORWARD_PARAMS)
def test_every_forward_lowering_against_torch(case, kernel, method):
    g, ic, oc = {"g1": (1, 4, 3), "g2": (2, 4, 6), "depthwise": (4, 4, 8)}[case.groups_name]
    rng = np.random.default_rng(1)
    spatial = {1: (11,), 2: (9, 7), 3: (6, 5, 7)}[case.rank]
    x = h.random(rng, h.data_shape(case.data_format, 2, ic, spatial))
    w = h.random(rng, h.conv_filter_shape(case.filter_format, oc, ic // g, kernel))
    got = jaxconv.convolution(x, w, **case.attrs, precision=HIGHEST, lowering=method)
    attrs = case.attrs
    pb, pe = _explicit_pads(case, spatial, kernel)
    y, _, _ = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), case.data_format),
        h.conv_filter_to_oix(h.to_f64(w), case.filter_format), None,
        strides=attrs["strides"], dilations=attrs["dilations"], pads_begin=pb, pads_end=pe,
        groups=g)
    h.assert_close(got, h.data_from_ncx(y, case.data_format), jnp.float32)


@pytest.mark.parametrize("method", ["conv", pytest.param("dot", marks=ISOLATED), "shifted"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_forward_lowerings_low_precision_and_second_order(method, dtype):
    """bfloat16 accumulates in float32 (lax's value, rounded once); derivatives to order 2."""
    rng = np.random.default_rng(4)
    x = h.random(rng, (2, 7, 6, 4)).astype(dtype)
    w = h.random(rng, (3, 3, 1, 8)).astype(dtype)  # depthwise, channel multiplier 2
    kw = dict(strides=(2, 1), dilations=(1, 2), pads_begin=(1, 2), pads_end=(0, 1), groups=4)
    got = jaxconv.convolution(x, w, **kw, precision=HIGHEST, lowering=method)
    ref = lax.conv_general_dilated(  # lax itself, not a jaxconv kernel
        x, w, (2, 1), [(1, 0), (2, 1)], rhs_dilation=(1, 2), feature_group_count=4,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=HIGHEST,
        preferred_element_type=jnp.float32).astype(dtype)
    assert got.dtype == dtype
    h.assert_close(got.astype(jnp.float32), ref.astype(jnp.float32), dtype)
    if dtype == jnp.float32:
        h.check_grads(lambda x, w: jaxconv.convolution(x, w, **kw, precision=HIGHEST,
                                                       lowering=method), (x, w), order=2)


@pytest.fixture
def xla_cpu_rules(monkeypatch):
    """The CPU table without the onednn extra: the XLA:CPU rules the tests below pin down."""
    monkeypatch.setattr(backends, "_onednn_pays", lambda p, kernel=None, xla="": False)


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
    macs = backends.macs
    assert backends.ONEDNN_OVER_XLA_CONV_MIN_MACS <= macs(medium) < backends.ONEDNN_MIN_MACS
    assert macs(small) < backends.ONEDNN_OVER_XLA_CONV_MIN_MACS
    assert backends.ONEDNN_OVER_XLA_CONV_MIN_MACS <= macs(whole) < backends.ONEDNN_MIN_MACS
    built = library.status().available
    xla = {kernel: backends.METHOD[kernel](medium, "cpu", False) for kernel in Kernel}
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
    assert backends.macs(dense) < backends.ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS
    assert (lowering.choose(Kernel.WEIGHT, dense, "cpu") == "onednn") == onednn
    assert backends.macs(dense) < backends.ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS
    assert (lowering.choose(Kernel.FORWARD, dense, "cpu") == "onednn") == onednn
    assert lowering.choose(Kernel.DATA, dense, "cpu") == "onednn"
    half = geometry.convolution_problem(  # 4 -> 4 channels: XLA's AVX2 vectors half empty
        "t", geometry.Names(), x_shape=(16, 8, 12, 4), y_shape=None, w_shape=(3, 3, 4, 4),
        strides=None, pads_begin=1, pads_end=1, dilations=(1, 3), auto_pad="none", groups=1,
        data_format="NXC", filter_format="XIO")
    assert backends.ONEDNN_MIN_MACS <= backends.macs(half) < \
        backends.ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS
    assert lowering.choose(Kernel.FORWARD, half, "cpu") == "onednn"
    big = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(16, 16, 10, 8), y_shape=None, w_shape=(3, 3, 8, 8),
        strides=None, pads_begin=1, pads_end=1, dilations=None, auto_pad="none", groups=1,
        data_format="NXC", filter_format="XIO")
    assert backends.macs(big) >= backends.ONEDNN_AVX2_DENSE_WEIGHT_MIN_MACS
    assert backends.macs(big) >= backends.ONEDNN_AVX2_VECTOR_FORWARD_MIN_MACS
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
        return backends.forward_method(problem(*args, **kw), "cpu")

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
    assert backends.forward_method(whole_one, "cpu") == "conv"
    assert backends.data_grad_method(whole_one, "cpu") == "dot"
    for args in [(4, 4, (3, 3)), (2, 8, (3, 3)), (1, 8, (3, 3, 3))]:
        assert backends.forward_method(problem(*args), "gpu") == "conv"
        assert backends.forward_method(problem(*args), "default") == "conv"


def test_auto_choice(xla_cpu_rules):
    def problem(groups, ic, kernel, n=2, size=9):
        return geometry.convolution_problem(
            "t", geometry.Names(), x_shape=(n, *[size] * len(kernel), ic), y_shape=None,
            w_shape=(*kernel, ic // groups, max(8, ic)), strides=None, pads_begin=None, pads_end=None,
            dilations=None, auto_pad="valid", groups=groups, data_format="NXC",
            filter_format="XIO")

    def cpu(*args, **kw):
        return backends.weight_grad_method(problem(*args, **kw), "cpu")

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
    gpu = {args: backends.weight_grad_method(problem(*args), "gpu") for args in [
        (1, 4, (3, 3)), (2, 4, (3, 3)), (4, 4, (3, 3)), (2, 4, (1, 1)), (1, 4, (1, 1)),
        (1, 4, (3, 3, 3)), (2, 8, (3, 3, 3))]}
    assert gpu.pop((1, 4, (3, 3, 3))) == "dot"
    assert set(gpu.values()) == {"vjp"}
    # Backends without measurements: always jax.vjp's program.
    assert backends.weight_grad_method(problem(2, 4, (3, 3)), "default") == "vjp"
    with pytest.raises(ValueError, match="backend must be one of"):
        backends.weight_grad_method(problem(2, 4, (3, 3)), "tpu")


def test_kernels_reject_an_unknown_method():
    """The kernels' own dispatch is exhaustive: nothing falls through to a default form."""

    p = _problem_strided(2)
    dy, w = jnp.ones(p.y_shape), jnp.ones(p.filter_shape)
    with pytest.raises(ValueError, match=r"lowering: method must be 'auto' or one of \['grid', "
                                         r"'phases', 'dot', 'vjp', 'onednn', 'per_group', 'block_diagonal'\], "
                                         r"got 'fft'"):
        lowering.data_grad(dy, w, p, method="fft")
    with pytest.raises(ValueError, match="got 'grid'"):
        lowering.weight_grad(jnp.ones(p.x_shape), dy, p, method="grid")


def test_inapplicable_or_unknown_method():
    x, dy = jnp.ones((1, 6, 6, 4)), jnp.ones((1, 4, 4, 4))
    with pytest.raises(ValueError, match=r"^convolution_backprop_filters: lowering must be one of "
                                         r"\['auto', 'conv', 'feature_group', 'shifted', 'dot', "
                                         r"'vjp', 'onednn', 'per_group', 'block_diagonal'\], got 'fast'"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="fast")
    with pytest.raises(ValueError, match=r"lowering='shifted' does not apply to this problem: "
                                         r"'shifted' needs one input channel per group"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="shifted")
    with pytest.raises(ValueError, match=r"'feature_group' regroups a grouped problem, got "
                                         r"groups=1; use one of \['auto', 'conv', 'dot', 'vjp'\]"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="feature_group")
    with pytest.raises(ValueError, match=r"'per_group' splits a grouped problem, got groups=1"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering="per_group")
    with pytest.raises(ValueError, match=r"'per_group' splits a grouped problem, got groups=1"):
        jaxconv.convolution_backward_data(dy, jnp.ones((3, 3, 4, 4)), (6, 6), lowering="per_group")
    with pytest.raises(TypeError, match="convolution_backprop_filters: lowering must be a string"):
        jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4), lowering=None)
    with pytest.raises(ValueError, match="^convolution_backward_data: lowering must be one of "
                                         r"\['auto', 'grid', 'phases', 'dot', 'vjp', 'onednn', "
                                         r"'per_group', 'block_diagonal'\], got 'fft'"):
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


# ---- data gradient: grid and stride phases ---------------------------------------



DATA = [pytest.param(m, marks=_marks(m)) for m in DATA_LEAVES]


@pytest.mark.parametrize("case,method", [
    pytest.param(c, m, id=f"{m}-{c.id}", marks=_marks(m))
    for c in CONV_TRANSPOSE_MATRIX[::4] for m in DATA_LEAVES]
    + [pytest.param(c, m, id=f"{m}-{c.id}") for c in CONV_TRANSPOSE_MATRIX
       if c.attrs.get("groups", 1) > 1 for m in COMBINATORS][::3])
def test_data_gradient_lowerings_against_torch(case, method):
    """conv_transpose (the data-gradient kernel) and its backward data, both forced."""
    x, w, dy = case.make(seed=9)
    a = dict(case.attrs, precision=HIGHEST, filter_format=case.weights_format)
    y = jaxconv.conv_transpose(x, w, **a, lowering=method)
    y_t, _, _ = case.torch_reference(x, w, dy)
    h.assert_close(y, y_t, jnp.float32)


@pytest.mark.parametrize("kind", ["forward", "data", "weight"])
def test_block_diagonal_keeps_a_non_finite_value_in_its_group(kind, xla_cpu_rules):
    """The dense filter's off-diagonal blocks are selected zeros, not products with 0: an inf
    in one group's weights (or data) gives the grouped convolution's inf/NaN pattern exactly.
    Both sides' leaves are XLA's (oneDNN skips the taps that fall in the padding, where XLA's
    convolution multiplies the inf by a padded zero: NaN; docs/onednn.md). Off CPU the data
    gradient's reference is one convolution per group: XLA:GPU's convolutions of the stride
    phases place the NaNs of padded taps differently (seen on an H200)."""
    rng = np.random.default_rng(4)
    x = h.random(rng, (2, 5, 6, 4, 6))
    w = h.random(rng, (2, 3, 2, 2, 9))
    kw = dict(groups=3, strides=(2, 1, 1), pads_begin=1, precision=HIGHEST)
    y = jaxconv.convolution(x, w, **kw)
    dy = h.random(rng, y.shape)
    if kind == "forward":
        w = w.at[0, 0, 0, 0, 0].set(jnp.inf)
        run = lambda m: jaxconv.convolution(x, w, **kw, lowering=m)  # noqa: E731
    elif kind == "data":
        w = w.at[0, 0, 0, 0, 0].set(jnp.inf)
        run = lambda m: jaxconv.convolution_backward_data(dy, w, x.shape, **kw, lowering=m)  # noqa: E731
    else:
        x = x.at[0, 1, 1, 1, 0].set(jnp.inf)
        run = lambda m: jaxconv.convolution_backprop_filters(x, dy, w.shape, **kw, lowering=m)  # noqa: E731
    on_cpu = jax.default_backend() == "cpu"
    ref = run("per_group" if kind == "forward" or (kind == "data" and not on_cpu)
              else "phases" if kind == "data" else "conv")
    got = run("block_diagonal")
    assert bool(jnp.isinf(ref).any()) and not bool(jnp.isnan(ref).all())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(np.asarray(ref))
    h.assert_close(np.asarray(got)[finite], np.asarray(ref)[finite], jnp.float32)


@pytest.mark.parametrize("method", [*DATA, *COMBINATORS])
def test_data_gradient_lowerings_convolution_backward_data(method):
    rng = np.random.default_rng(2)
    x = h.random(rng, (2, 9, 8, 4))
    w = h.random(rng, (3, 2, 2, 6))
    kw = dict(strides=(3, 2), dilations=(2, 1), pads_begin=(4, 0), pads_end=(1, 1), groups=2,
              precision=HIGHEST)
    y = jaxconv.convolution(x, w, **kw)
    dy = h.random(rng, y.shape)
    got = jaxconv.convolution_backward_data(dy, w, x.shape, **kw, lowering=method)
    _, dx, _ = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), "NXC"), h.conv_filter_to_oix(h.to_f64(w), "XIO"),
        h.data_to_ncx(h.to_f64(dy), "NXC"), strides=(3, 2), dilations=(2, 1),
        pads_begin=(4, 0), pads_end=(1, 1), groups=2)
    h.assert_close(got, h.data_from_ncx(dx, "NXC"), jnp.float32)


def test_data_gradient_auto_choice_and_unknown(xla_cpu_rules):
    def cpu(p):
        return backends.data_grad_method(p, "cpu")

    assert cpu(_problem_strided(2)) == "phases"
    assert cpu(_problem_strided(1)) == "grid"
    assert cpu(_problem_strided(2, channels=3)) == "grid"  # image layer
    assert cpu(_problem_strided(2, groups=2)) == "block_diagonal"  # <= 64 channels
    assert cpu(_problem_strided(2, channels=128, groups=2)) == "per_group"
    assert cpu(_problem_strided(2, channels=256, groups=128)) == "dot"
    one_by_one = geometry.convolution_problem(  # 1x1x1 over 2 channels (vnet:conv4): the grid
        "t", geometry.Names(), x_shape=(1, 8, 8, 8, 2), y_shape=None, w_shape=(1, 1, 1, 2, 2),
        strides=1, pads_begin=None, pads_end=None, dilations=None, auto_pad="valid", groups=1,
        data_format="NXC", filter_format="XIO")
    assert cpu(one_by_one) == "grid"
    for p in (_problem_strided(2), _problem_strided(1), _problem_strided(2, groups=2)):
        assert backends.data_grad_method(p, "gpu") == "vjp"
        assert backends.data_grad_method(p, "default") == "vjp"
    # GPU: non-overlapping 3D windows of <= 32 result channels take per-tap products.
    assert backends.data_grad_method(_problem_3d(16), "gpu") == "dot"
    assert backends.data_grad_method(_problem_3d(64), "gpu") == "vjp"
    # OpenVINO's 3D example: "dot" would keep ~8x its 2.7 GiB result in temporaries
    big = geometry.conv_transpose_problem(
        "t", geometry.Names(), x_shape=(1, 20, 224, 224, 224), y_shape=None,
        w_shape=(20, 2, 3, 3, 3), strides=2, pads_begin=1, pads_end=1, dilations=None,
        auto_pad="explicit", output_padding=None, groups=4, data_format="NCX",
        filter_format="IOX")
    assert cpu(big) == "phases"


def _problem_3d(channels):
    return geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(1, 8, 8, 8, channels), y_shape=None,
        w_shape=(2, 2, 2, channels, 2 * channels), strides=2, pads_begin=None, pads_end=None,
        dilations=None, auto_pad="valid", groups=1, data_format="NXC", filter_format="XIO")


def _problem_strided(s, channels=8, groups=1):
    return geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(1, 9, 9, channels), y_shape=None,
        w_shape=(3, 3, channels // groups, 2 * groups),
        strides=s, pads_begin=None, pads_end=None, dilations=None, auto_pad="valid",
        groups=groups, data_format="NXC", filter_format="XIO")


@pytest.mark.parametrize("rank,df,ff,groups,dilation,pad,stride", [
    (1, "NCX", "OIX", 1, 1, 0, 1), (2, "NXC", "XIO", 2, 2, 1, 3), (3, "NCX", "XIO", 1, 1, 1, 1),
    (2, "NCX", "OIX", 4, 1, 0, 2)])
@pytest.mark.parametrize("oc", [8, 40], ids=["outer-sum", "dot_general"])
def test_dot_for_a_window_covering_the_input(rank, df, ff, groups, dilation, pad, stride, oc,
                                             monkeypatch):
    """Every output extent 1 (benchdnn's 3d_conv_large_shape): "dot" computes each kernel as
    one product over the window's axes, never a loop over its taps. The weight
    gradient is an outer product over the batch, summed element-wise (at most 8 output channels
    per group, from 4096 window elements per example: lowered here for these small windows)
    or by one dot_general; the forward and the data gradient one dot_general each."""
    if oc == 8:
        monkeypatch.setattr(taps, "_OUTER_SUM_MIN_WINDOW", 1)
    spatial = (5, 4, 3)[:rank]
    kernel = tuple((i + 2 * pad - 1) // dilation + 1 for i in spatial)
    pads_end = tuple((k - 1) * dilation + 1 - i - pad for k, i in zip(kernel, spatial))
    ic = 4
    assert (oc // groups <= taps._OUTER_SUM_MAX_OC) == (oc == 8)
    rng = np.random.default_rng(3)
    x = h.random(rng, h.data_shape(df, 2, ic, spatial))
    dy = h.random(rng, h.data_shape(df, 2, oc, (1,) * rank))
    w_shape = h.conv_filter_shape(ff, oc, ic // groups, kernel)
    w = h.random(rng, w_shape)
    kw = dict(strides=stride, dilations=dilation, pads_begin=pad, pads_end=pads_end,
              groups=groups, data_format=df, filter_format=ff, precision=HIGHEST)
    p = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=x.shape, y_shape=dy.shape, w_shape=w_shape,
        strides=stride, pads_begin=pad, pads_end=pads_end, dilations=dilation, auto_pad="none",
        groups=groups, data_format=df, filter_format=ff)
    # the CPU table picks "dot" for the gradients of any whole window, and for a 1D or 2D
    # forward from WHOLE_WINDOW_DOT_MIN_MACS (test_forward_auto_choice)
    assert lowering.choose(Kernel.WEIGHT, p, "cpu") == "dot"
    assert lowering.choose(Kernel.DATA, p, "cpu") == "dot"
    kw["lowering"] = "dot"

    def forward(x, w):
        return jaxconv.convolution(x, w, **kw)

    def data(dy, w):
        return jaxconv.convolution_backward_data(dy, w, x.shape, **kw)

    got = (forward(x, w), data(dy, w), jaxconv.convolution_backprop_filters(x, dy, w_shape, **kw))
    y, dx, dw = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), df), h.conv_filter_to_oix(h.to_f64(w), ff),
        h.data_to_ncx(h.to_f64(dy), df), strides=(stride,) * rank, dilations=(dilation,) * rank,
        pads_begin=(pad,) * rank, pads_end=pads_end, groups=groups)
    for g, want in zip(got, (h.data_from_ncx(y, df), h.data_from_ncx(dx, df),
                             h.conv_filter_from_oix(dw, ff))):
        h.assert_close(g, want, jnp.float32)
    for fn, args in ((forward, (x, w)), (data, (dy, w))):
        assert len(_dot_generals(fn, *args)) == 1, fn.__name__
    products = _dot_generals(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w_shape, **kw),
                             x, dy)
    assert len(products) == (0 if oc == 8 else 1)


@pytest.mark.parametrize("side,summed", [(16, True), (15, False)])
def test_whole_window_weight_gradient_sums_outer_products_from_a_large_window(side, summed):
    """The element-wise sum of outer products pays where each example's window is large
    (16x16x16 = 4096 elements); below, one dot_general over the batch."""
    x = jnp.zeros((16, side, side, 16), jnp.float32)
    dy = jnp.zeros((16, 1, 1, 8), jnp.float32)
    w_shape = (side, side, 16, 8)
    assert (side * side * 16 >= taps._OUTER_SUM_MIN_WINDOW) == summed
    products = _dot_generals(lambda x, dy: jaxconv.convolution_backprop_filters(
        x, dy, w_shape, lowering="dot"), x, dy)
    assert len(products) == (0 if summed else 1)


def test_whole_window_derivatives_to_order_2():
    """The one-product kernels of a whole window, under grad: their transposes are each
    other's (a strided, dilated, grouped 2D window)."""
    rng = np.random.default_rng(5)
    x = h.random(rng, (2, 6, 5, 4))
    w = h.random(rng, (3, 2, 2, 6))
    kw = dict(strides=3, dilations=(2, 3), pads_begin=(0, 1), pads_end=(1, 0), groups=2,
              data_format="NXC", filter_format="XIO", precision=HIGHEST)
    assert jaxconv.convolution(x, w, **kw).shape == (2, 1, 1, 6)
    h.check_grads(lambda x, w: jaxconv.convolution(x, w, **kw), (x, w), order=2)


@pytest.mark.parametrize("shape,summed,spatial,plan", [
    # NXC 12x10: rows into 12 blocks (the divisor nearest 32), columns into 5 (nearest 4)
    ((2, 12, 10, 3), (0, 1, 2), (1, 2), ((2, 12, 1, 5, 2, 3), (0, 2, 4), (0, 1))),
    # NCX 7x7: rows into 7 blocks, columns not cut (1 and 7 are as near 4: the smaller)
    ((1, 8, 7, 7), (0, 2, 3), (2, 3), ((1, 8, 7, 1, 7), (0, 3, 4), (1,))),
    # 3D: the third spatial axis is never cut; extents of 1 are not either
    ((2, 1, 8, 6, 4), (0, 1, 2, 3), (1, 2, 3), ((2, 1, 4, 2, 6, 4), (0, 1, 3, 4), (0,))),
])
def test_partial_sum_plan(shape, summed, spatial, plan):
    assert shifted._PARTIAL_BLOCKS == (32, 4)
    assert shifted._partial_sum_plan(shape, summed, spatial) == plan


@pytest.mark.parametrize("partial_blocks", [(32, 4), (3, 5), (1, 1)])
@pytest.mark.parametrize("kernel,multiplier", [((7, 7), 1), ((3, 3, 2), 2)])
def test_shifted_weight_gradient_over_batch_blocks_and_tap_runs(monkeypatch, kernel, multiplier,
                                                                partial_blocks):
    """The "shifted" weight gradient's loops: batch blocks (a lax.scan), runs of taps, partial sums.

    A small block size makes every example a block of its own; a 7x7 kernel (49
    taps) needs two variadic reduces; the positions are summed in blocks (the
    rows and columns cut as ``partial_blocks`` says, or not at all): the paths a
    small problem never takes.
    """
    rank, c = len(kernel), 3
    monkeypatch.setattr(shifted, "_BLOCK_BYTES", 1)
    monkeypatch.setattr(shifted, "_PARTIAL_BLOCKS", partial_blocks)
    assert shifted._TAPS_PER_REDUCE < math.prod(kernel) or multiplier > 1
    spatial = (9, 14, 5)[:rank]
    rng = np.random.default_rng(4)
    x = h.random(rng, h.data_shape("NXC", 3, c, spatial))
    w_shape = h.conv_filter_shape("XIO", c * multiplier, 1, kernel)
    kw = dict(strides=(2,) + (1,) * (rank - 1), dilations=(1,) * (rank - 1) + (2,),
              pads_begin=1, pads_end=(2,) * rank, groups=c)
    dy = h.random(rng, jaxconv.convolution(x, jnp.ones(w_shape), **kw).shape)
    got = jaxconv.convolution_backprop_filters(x, dy, w_shape, **kw, precision=HIGHEST,
                                               lowering="shifted")
    _, _, dw = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), "NXC"), h.conv_filter_to_oix(np.zeros(w_shape), "XIO"),
        h.data_to_ncx(h.to_f64(dy), "NXC"), strides=kw["strides"], dilations=kw["dilations"],
        pads_begin=(1,) * rank, pads_end=(2,) * rank, groups=c)
    h.assert_close(got, h.conv_filter_from_oix(dw, "XIO"), jnp.float32)
    spatial_axes = tuple(range(1, rank + 1))
    _, _, blocks = shifted._partial_sum_plan(dy.shape, (0, *spatial_axes), spatial_axes)
    assert bool(blocks) == (partial_blocks != (1, 1))  # the cut ones are cut
    # under vmap (per-example weight gradients) the reduce is batched, not unrolled
    per_example = jax.vmap(lambda x, dy: jaxconv.convolution_backprop_filters(
        x[None], dy[None], w_shape, **kw, precision=HIGHEST, lowering="shifted"))(x, dy)
    h.assert_close(jnp.sum(per_example, axis=0), got, jnp.float32)


# ---- the override is an argument; "vjp" is JAX's program; "auto" per platform ----------

import functools  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
from jax import export  # noqa: E402

_HLO_NOISE = re.compile(r"(, )?metadata=\{[^}]*\}|\.\d+\b")


def _compiled(jitted, *args, **kwargs) -> list[str]:
    """Optimized HLO instructions without names' numeric suffixes or metadata."""
    lines = jitted.lower(*args, **kwargs).compile().as_text().splitlines()
    return [_HLO_NOISE.sub("", ln.strip()) for ln in lines
            if ln.strip().startswith(("%", "ROOT", "ENTRY", "}"))]


def test_forced_lowering_after_jit_changes_the_compiled_program():
    """A function jitted and run once, then called with another lowering, gets a new program."""
    x, dy = jnp.ones((2, 9, 9, 8)), jnp.ones((2, 7, 7, 8))
    op = jax.jit(jaxconv.convolution_backprop_filters,
                 static_argnames=("filter_shape", "groups", "lowering"))
    ref = op(x, dy, (3, 3, 4, 8), groups=2)  # traced and compiled with "auto"
    programs = {}
    for method in ("auto", "conv", "feature_group", "dot", "vjp", "per_group"):
        got = op(x, dy, (3, 3, 4, 8), groups=2, lowering=method)
        h.assert_close(got, ref, jnp.float32)
        programs[method] = "\n".join(_compiled(op, x, dy, (3, 3, 4, 8), groups=2,
                                                lowering=method))
    # "conv" and "vjp" differ only in how padding beyond the windows is kept: none here
    assert programs["vjp"] == programs["conv"]
    assert len(set(programs.values())) == 4
    if jax.default_backend() != "cpu":  # the rest is XLA:CPU's compiled text
        assert programs["auto"] == programs["vjp"]  # the GPU (and TPU) rule for grouped 2D
        return
    assert programs["auto"] == programs["per_group"]  # the CPU rule for grouped 2D
    assert "feature_group_count=2" in programs["feature_group"]
    assert programs["per_group"].count("convolution(") == 2  # one dense one per group
    assert "group_count" not in programs["per_group"]
    # batch_group_count=2, which XLA:CPU expands into a base-dilated convolution
    assert "convolution-base-dilated" in programs["conv"]
    assert "feature_group_count" not in programs["conv"]
    assert "dot(" in programs["dot"] and "convolution(" not in programs["dot"]


VJP_CASES = [  # (data_format, filter_format, groups, strides, dilations, pads_begin, pads_end)
    ("NXC", "XIO", 1, (1, 1), (1, 1), (1, 1), (1, 1)),
    ("NXC", "XIO", 2, (2, 2), (1, 1), (1, 0), (0, 1)),
    ("NCX", "OIX", 2, (2, 1), (1, 1), (1, 0), (0, 1)),
    ("NCX", "OIX", 1, (1, 1), (2, 1), (2, 0), (0, 1)),
    ("NXC", "OIX", 4, (3, 2), (1, 1), (0, 2), (1, 0)),  # depthwise, strided remainder
]


@pytest.mark.parametrize("df,ff,g,s,d,pb,pe", VJP_CASES)
def test_vjp_lowering_compiles_to_the_program_of_jax_vjp(df, ff, g, s, d, pb, pe):
    """What the backends without measurements get: exactly jax.vjp's program (float32)."""
    rng = np.random.default_rng(0)
    x = h.random(rng, h.data_shape(df, 2, 4, (9, 8)))
    w = h.random(rng, h.conv_filter_shape(ff, 8, 4 // g, (3, 3)))
    dn = (df.replace("X", "HW"), ff.replace("X", "HW"), df.replace("X", "HW"))

    def plain(x, w):
        return lax.conv_general_dilated(x, w, s, list(zip(pb, pe)), rhs_dilation=d,
                                        dimension_numbers=dn, feature_group_count=g)

    dy = h.random(rng, plain(x, w).shape)
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=g, data_format=df,
                 filter_format=ff, lowering="vjp")
    ours_w = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs))
    base_w = jax.jit(lambda x, dy: jax.vjp(lambda w_: plain(x, w_), w)[1](dy)[0])
    ours_d = jax.jit(lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **attrs))
    base_d = jax.jit(lambda dy, w: jax.vjp(lambda x_: plain(x_, w), x)[1](dy)[0])
    assert _compiled(ours_w, x, dy) == _compiled(base_w, x, dy)
    assert _compiled(ours_d, dy, w) == _compiled(base_d, dy, w)
    h.assert_close(ours_w(x, dy), base_w(x, dy), jnp.float32)
    h.assert_close(ours_d(dy, w), base_d(dy, w), jnp.float32)


def _exported(fn, platform, *args) -> str:
    """The StableHLO of ``fn`` lowered for ``platform`` (no device of that kind needed),
    without source locations."""
    text = export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()
    return "\n".join(re.sub(r" loc\(.*\)$", "", ln) for ln in text.splitlines()
                     if not ln.startswith("#loc"))


def _convs(text: str) -> list[str]:
    return re.findall(r"stablehlo\.convolution.*", text)


def test_auto_lowering_reaches_the_program_of_each_platform(xla_cpu_rules):
    """One traced op, lowered for CPU, CUDA, ROCm and TPU, carries each backend's rule (on
    CPU the XLA:CPU rules: an exported program holds no oneDNN call)."""
    # Grouped 2D weight gradient: CPU one dense convolution per group ("per_group"); GPU and
    # TPU jax.vjp's batch_group conv.
    x, dy = jnp.ones((2, 9, 9, 8)), jnp.ones((2, 7, 7, 8))
    fn = functools.partial(jaxconv.convolution_backprop_filters, filter_shape=(3, 3, 4, 8),
                           groups=2)
    text = {plat: _exported(fn, plat, x, dy) for plat in ("cpu", "cuda", "rocm", "tpu")}
    assert len(_convs(text["cpu"])) == 2 and "group_count = 2" not in text["cpu"]
    for plat in ("cuda", "rocm", "tpu"):
        assert "batch_group_count = 2" in text[plat], plat
        assert "dot_general" not in text[plat] and len(_convs(text[plat])) == 1, plat
    # Dense 3D weight gradient (past the smallest, 8.8e5 multiply-adds): per-tap products on
    # CPU and GPU, jax.vjp's convolution on TPU.
    x3, dy3 = jnp.ones((2, 10, 10, 10, 4)), jnp.ones((2, 8, 8, 8, 8))
    fn3 = functools.partial(jaxconv.convolution_backprop_filters, filter_shape=(3, 3, 3, 4, 8))
    for plat, products in (("cpu", True), ("cuda", True), ("tpu", False)):
        t = _exported(fn3, plat, x3, dy3)
        assert ("dot_general" in t) is products and (not _convs(t)) is products, plat
    # Strided 2D data gradient: CPU stride phases (no input dilation), TPU jax.vjp's program
    # (the grid inside the convolution: lhs_dilate).
    dyd, w = jnp.ones((1, 4, 4, 8)), jnp.ones((3, 3, 8, 8))
    fnd = functools.partial(jaxconv.convolution_backward_data, input_shape=(9, 9), strides=2)
    cpu, tpu = _exported(fnd, "cpu", dyd, w), _exported(fnd, "tpu", dyd, w)
    assert len(_convs(cpu)) == 4 and not any("lhs_dilate" in c
                                             for c in _convs(cpu))
    assert len(_convs(tpu)) == 1 and "lhs_dilate = [2, 2]" in _convs(tpu)[0]


_DOT = re.compile(r"stablehlo\.dot_general .*?(?:batching_dims = \[([\d, ]*)\] x \[[\d, ]*\], )?"
                  r"contracting_dims.*?: \(tensor<([\dx]+)x\w+>")


def _dot_generals(fn, *args) -> list[tuple[list[int], tuple[int, ...]]]:
    """(lhs batching dims, lhs shape) of every dot_general in the lowered program of ``fn``."""
    text = jax.jit(fn).lower(*args).as_text()
    out = []
    for m in _DOT.finditer(text):
        dims = [int(d) for d in m.group(1).split(",")] if m.group(1) else []
        out.append((dims, tuple(int(n) for n in m.group(2).split("x"))))
    return out


def _size_one_batch_dims(fn, *args) -> list[str]:
    return [f"{shape} batch {dims}" for dims, shape in _dot_generals(fn, *args)
            if any(shape[a] == 1 for a in dims)]


@pytest.mark.parametrize("rank,df,kernel", [(2, "NXC", (1, 1)), (3, "NCX", (2, 2, 2)),
                                            (1, "NCX", (3,))])
def test_products_have_no_size_one_batch_dimension(rank, df, kernel):
    """The XLA:GPU Triton GEMM abort (docs/lowerings.md, "GPU (CUDA, ROCm)") came from dot_generals with a
    size-1 batch dimension (one group); no "dot" kernel, nor its first and second
    derivatives, may emit one."""
    rng = np.random.default_rng(0)
    spatial = {1: (9,), 2: (9, 7), 3: (5, 4, 5)}[rank]
    x = h.random(rng, h.data_shape(df, 2, 4, spatial))
    w_shape = h.conv_filter_shape("XIO", 3, 4, kernel)
    y = jaxconv.convolution(x, jnp.ones(w_shape), strides=2, data_format=df)
    dy = h.random(rng, y.shape)
    w = h.random(rng, w_shape)
    a = dict(strides=2, data_format=df, precision=HIGHEST, lowering="dot")

    def wgrad(x, dy):
        return jaxconv.convolution_backprop_filters(x, dy, w_shape, **a)

    def dgrad(dy, w):
        return jaxconv.convolution_backward_data(dy, w, x.shape, **a)

    for fn, args in ((wgrad, (x, dy)), (dgrad, (dy, w))):
        def loss(*args):
            return jnp.sum(fn(*args) ** 2)

        def grad_norm(*args):
            return jnp.sum(jnp.stack([jnp.sum(g ** 2) for g in jax.grad(loss, (0, 1))(*args)]))

        for f in (fn, jax.grad(loss, (0, 1)), jax.grad(grad_norm, (0, 1))):
            assert not _size_one_batch_dims(f, *args)
        assert _dot_generals(fn, *args)  # the check saw products


@pytest.mark.parametrize("kind", ["forward", "weight", "data"])
def test_dot_products_are_fenced_in_gpu_programs_only(kind):
    """The programs XLA:GPU's Triton GEMM fusion aborted on (2D 1x1 "dot", strides 3 x 1;
    docs/lowerings.md, "GPU (CUDA, ROCm)") compiled once the product's operands and result passed
    through an optimization barrier: a "dot" kernel of one product lowered for CUDA or ROCm
    is fenced (two barriers), none lowered for CPU is, nor a kernel of several taps (fencing
    those cost 2-4x on an H200, and none aborted)."""
    rng = np.random.default_rng(0)
    x, w = h.random(rng, (2, 4, 9, 7)), h.random(rng, (3, 4, 1, 1))
    a = dict(data_format="NCX", filter_format="OIX", strides=(3, 1), precision=HIGHEST,
             lowering="dot")
    dy = h.random(rng, jaxconv.convolution(x, w, **a).shape)
    fn, args = {
        "forward": (lambda x, w: jaxconv.convolution(x, w, **a), (x, w)),
        "weight": (lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **a),
                   (x, dy)),
        "data": (lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **a),
                 (dy, w))}[kind]
    for plat, fenced in (("cpu", False), ("cuda", True), ("rocm", True)):
        text = _exported(fn, plat, *args)
        assert text.count("stablehlo.dot_general") == 1, plat
        assert text.count("stablehlo.optimization_barrier") == (2 if fenced else 0), plat
    w3 = h.random(rng, (3, 4, 3, 2))  # six taps: six products, none fenced
    text = _exported(lambda x, w: jaxconv.convolution(x, w, **a), "cuda", x, w3)
    assert text.count("stablehlo.dot_general") == 6
    assert "optimization_barrier" not in text


GRAD_PROBLEMS = {  # small problems: (x shape NXC, groups, attributes)
    "g2-strided": ((2, 7, 6, 4), 2, dict(strides=2, pads_begin=(1, 0), pads_end=(0, 1))),
    "g1-dilated": ((2, 7, 6, 4), 1, dict(dilations=(2, 1), pads_begin=1, pads_end=1)),
    "g4-strided-dilated": ((2, 8, 7, 4), 4, dict(strides=2, dilations=2, pads_begin=1)),
}
#: the problem every lowering is checked on in the default run (a stride, a dilation and
#: groups: every method applies); the other two run with ``-m slow`` (about 6 s each)
DEFAULT_GRAD_PROBLEM = "g4-strided-dilated"


def _grad_marks(problem, method):
    return _marks(method) + ([] if problem == DEFAULT_GRAD_PROBLEM else [pytest.mark.slow])


@pytest.mark.parametrize("problem,method", [
    pytest.param(pid, m, marks=_grad_marks(pid, m)) for pid in sorted(GRAD_PROBLEMS) for m in ALL
    if not (m == "shifted" and GRAD_PROBLEMS[pid][1] != 4)  # needs depthwise
    and not (m in ("feature_group", "per_group", "block_diagonal")
             and GRAD_PROBLEMS[pid][1] == 1)])  # needs groups
def test_check_grads_order_2_of_each_weight_lowering(problem, method):
    x_shape, g, attrs = GRAD_PROBLEMS[problem]
    w_shape = (3, 2, 4 // g, 4)
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        x = h.random(rng, x_shape, jnp.float64)
        dy = h.random(rng, jaxconv.convolution(x, jnp.ones(w_shape, jnp.float64), groups=g,
                                               **attrs).shape, jnp.float64)
        a = dict(attrs, groups=g, lowering=method)
        h.check_grads(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w_shape, **a),
                      (x, dy), order=2)


@pytest.mark.parametrize("problem,method", [
    pytest.param(pid, m, marks=_grad_marks(pid, m)) for pid in sorted(GRAD_PROBLEMS)
    for m in lowering.methods(Kernel.DATA)
    if not (m in COMBINATORS and GRAD_PROBLEMS[pid][1] == 1)])
def test_check_grads_order_2_of_each_data_lowering(problem, method):
    x_shape, g, attrs = GRAD_PROBLEMS[problem]
    w_shape = (3, 2, 4 // g, 4)
    rng = np.random.default_rng(6)
    with jax.enable_x64(True):
        w = h.random(rng, w_shape, jnp.float64)
        dy = h.random(rng, jaxconv.convolution(jnp.ones(x_shape, jnp.float64), w, groups=g,
                                               **attrs).shape, jnp.float64)
        a = dict(attrs, groups=g, lowering=method)
        h.check_grads(lambda dy, w: jaxconv.convolution_backward_data(dy, w, x_shape, **a),
                      (dy, w), order=2)
