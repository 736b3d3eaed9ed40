"""The Winograd lowerings (``"winograd"``, ``"winograd_2x2"``, ``"winograd_3x3"``,
``"winograd_4x4"``): their matrices against a direct 3x3 correlation, each kernel against
PyTorch in float64 over a matrix of shapes, pads, layouts and tiles, bfloat16 operands, every
vector ISA of the handler's passes, the staged passes in several chunks, where
``lowering="auto"`` takes them (and where it must not: ``Precision.HIGHEST``, other dtypes,
partitioned programs), and jit/vmap/grad through them."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import geometry
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import chooser, winograd
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support import oracles

pytestmark = pytest.mark.skipif(not library.status().available,
                                reason="the onednn extra is not built (its handler computes Winograd)")

TILES = {"winograd_2x2": 2, "winograd_3x3": 3, "winograd_4x4": 4}
NAMES = ("winograd", *TILES)


@pytest.mark.parametrize("m", winograd.TILES)
def test_matrices_compute_a_3x3_correlation(m):
    mats = winograd.matrices(m)
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    u = mats["G"] @ g @ mats["G"].T
    v = mats["BT"] @ d @ mats["BT"].T
    got = mats["AT"] @ (u * v) @ mats["AT"].T
    direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(got, direct, rtol=1e-12, atol=1e-12)


def _kernels(x, w, dy, attrs, method):
    return (jaxconv.convolution(x, w, lowering=method, **attrs),
            jaxconv.convolution_backward_data(dy, w, x.shape, lowering=method, **attrs),
            jaxconv.convolution_backprop_filters(x, dy, w.shape, lowering=method, **attrs))


def _case(rng, n, size, c, k, pads, data_format="NXC", filter_format="XIO"):
    """Random x, W, dy of a 3x3 stride-1 problem, its attributes and torch's float64 results."""
    (pt, pb), (pl, pr) = pads
    x = h.random(rng, h.data_shape(data_format, n, c, size))
    w = h.random(rng, h.conv_filter_shape(filter_format, k, c, (3, 3)))
    out = (size[0] + pt + pb - 2, size[1] + pl + pr - 2)
    dy = h.random(rng, h.data_shape(data_format, n, k, out))
    attrs = dict(strides=1, pads_begin=(pt, pl), pads_end=(pb, pr), data_format=data_format,
                 filter_format=filter_format)
    ref = oracles.conv_all(h.data_to_ncx(h.to_f64(x), data_format),
                           h.conv_filter_to_oix(h.to_f64(w), filter_format),
                           h.data_to_ncx(h.to_f64(dy), data_format), strides=(1, 1),
                           dilations=(1, 1), pads_begin=(pt, pl), pads_end=(pb, pr), groups=1)
    refs = (h.data_from_ncx(ref[0], data_format), h.data_from_ncx(ref[1], data_format),
            h.conv_filter_from_oix(ref[2], filter_format))
    return x, w, dy, attrs, refs


# (batch, spatial, in channels, out channels, ((pad top, bottom), (left, right)), formats):
# channels that fill no vector, tiles that do not divide the output, one-pixel inputs, every
# pad from 0 to 2, both layouts
PROBLEMS = {
    "tails": (2, (7, 9), 5, 3, ((1, 1), (1, 1)), "NXC", "XIO"),
    "wide": (3, (13, 11), 70, 130, ((1, 2), (2, 0)), "NXC", "XIO"),
    "ncx": (2, (10, 12), 17, 33, ((0, 0), (2, 1)), "NCX", "OIX"),
    "pixel": (1, (1, 1), 3, 4, ((1, 1), (1, 1)), "NXC", "XIO"),
    "valid": (2, (6, 5), 32, 32, ((0, 0), (0, 0)), "NCX", "XIO"),
    "full": (1, (4, 4), 8, 40, ((2, 2), (2, 2)), "NXC", "OIX"),
}


@pytest.mark.parametrize("method", ["winograd", *TILES])
@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_each_kernel_against_torch(problem, method):
    n, size, c, k, pads, df, ff = PROBLEMS[problem]
    x, w, dy, attrs, refs = _case(np.random.default_rng(0), n, size, c, k, pads, df, ff)
    for got, ref in zip(_kernels(x, w, dy, attrs, method), refs):
        h.assert_close(got, ref, jnp.float32)


@pytest.mark.parametrize("method", ["winograd", "winograd_2x2"])
def test_bfloat16_operands_computed_in_float32(method):
    """Forced on bfloat16 operands it computes in float32 and rounds once: within bfloat16's
    bound of torch's float64 result on the same rounded inputs, in bfloat16."""
    rng = np.random.default_rng(4)
    x, w, dy, attrs, _ = _case(rng, 2, (11, 10), 40, 72, ((1, 1), (1, 1)))
    xb, wb, dyb = (a.astype(jnp.bfloat16) for a in (x, w, dy))
    ref = oracles.conv_all(h.data_to_ncx(h.to_f64(xb), "NXC"),
                           h.conv_filter_to_oix(h.to_f64(wb), "XIO"),
                           h.data_to_ncx(h.to_f64(dyb), "NXC"), strides=(1, 1), dilations=(1, 1),
                           pads_begin=(1, 1), pads_end=(1, 1), groups=1)
    refs = (h.data_from_ncx(ref[0], "NXC"), h.data_from_ncx(ref[1], "NXC"),
            h.conv_filter_from_oix(ref[2], "XIO"))
    text = jax.jit(lambda x, w: jaxconv.convolution(x, w, lowering=method, **attrs)).lower(
        xb, wb).as_text()
    assert "jaxconv_winograd_forward" in text
    for got, r in zip(_kernels(xb, wb, dyb, attrs, method), refs):
        assert got.dtype == jnp.bfloat16
        h.assert_close(got, r, jnp.bfloat16)


def test_other_dtypes_compute_directly():
    p = _problem()
    for dtype in (np.float64, np.float16):
        assert chooser.plan(Kernel.FORWARD, p, method="winograd", backend="cpu",
                           dtype=np.dtype(dtype)).method not in NAMES
    # operands of two dtypes (dtype None) and a float32 result of bfloat16 operands
    assert chooser.plan(Kernel.FORWARD, p, method="winograd", backend="cpu",
                       dtype=None).method != "winograd"
    assert chooser.plan(Kernel.FORWARD, p, method="winograd", backend="cpu",
                       dtype=np.dtype(jnp.bfloat16),
                       preferred_element_type=np.float32).method != "winograd"


_ISA_SCRIPT = """
import numpy as np, jax.numpy as jnp, jaxconv, torch
from jaxconv._src.native import library
print(library.winograd_isa())
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 9, 11, 21)).astype(np.float32)
w = rng.standard_normal((3, 3, 21, 35)).astype(np.float32)
dy = rng.standard_normal((2, 9, 11, 35)).astype(np.float32)
a = dict(strides=1, pads_begin=1, pads_end=1)
xt = torch.tensor(x.transpose(0, 3, 1, 2), dtype=torch.float64, requires_grad=True)
wt = torch.tensor(w.transpose(3, 2, 0, 1), dtype=torch.float64, requires_grad=True)
y = torch.nn.functional.conv2d(xt, wt, padding=1)
y.backward(torch.tensor(dy.transpose(0, 3, 1, 2), dtype=torch.float64))
refs = (y.detach().numpy().transpose(0, 2, 3, 1), xt.grad.numpy().transpose(0, 2, 3, 1),
        wt.grad.numpy().transpose(2, 3, 1, 0))
for m in ("winograd_2x2", "winograd_3x3", "winograd_4x4"):
    got = (jaxconv.convolution(x, w, lowering=m, **a),
           jaxconv.convolution_backward_data(dy, w, x.shape, lowering=m, **a),
           jaxconv.convolution_backprop_filters(x, dy, w.shape, lowering=m, **a))
    print(max(float(np.abs(np.asarray(g, np.float64) - r).max() / np.abs(r).max())
              for g, r in zip(got, refs)))
"""


@pytest.mark.parametrize("isa", ["avx2", "plain"])
def test_every_vector_isa_of_the_passes(isa):
    """The passes compiled for AVX2 and for no vector ISA, on this machine (JAXCONV_WINOGRAD_ISA
    narrows the widest), against torch in float64."""
    env = dict(os.environ, JAXCONV_WINOGRAD_ISA=isa, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _ISA_SCRIPT], env=env, capture_output=True,
                         text=True, check=True, timeout=300).stdout.split()
    assert out[0] == isa or (isa, out[0]) == ("avx2", "plain")  # plain: a CPU without AVX2
    for err in out[1:]:
        assert float(err) <= jaxconv.testing.TOLERANCE["float32"], out


@pytest.fixture
def small_chunks():
    library.set_winograd_chunk_bytes(200_000)
    yield
    library.set_winograd_chunk_bytes(0)


# Staged passes (a transformed filter U over the fused limit, 4 MiB): (method, chunked,
# batch, spatial, in and out channels, filter format). Chunked (200 kB), each chunk has a few
# tiles, and the forward transforms U block by block from the filter, read in runs of output
# channels (XIO), of input channels (the data gradient's swapped view of XIO), or through a
# dense copy (OIX); 200 x 184 channels leave partial blocks (and 3x3 tiles partial ones of an
# 11 x 10 output). Unchunked with more than 96 tiles, U is transformed whole. The 2x2 weight
# gradient's chunks accumulate. Unchunked, the weight gradient computes dU block by block
# (partial blocks of input and output channels at 200 x 184; blocks of fewer input channels
# where 128 x 64 would leave the threads too few).
STAGED = {
    "blocks-xio": ("winograd_4x4", True, 2, (10, 9), 192, 192, "XIO"),
    "blocks-oix-tails": ("winograd_4x4", True, 2, (9, 10), 200, 184, "OIX"),
    "blocks-2x2": ("winograd_2x2", True, 2, (10, 9), 300, 296, "XIO"),
    "blocks-3x3-oix": ("winograd_3x3", True, 2, (11, 10), 200, 184, "OIX"),
    "whole-u": ("winograd_4x4", False, 2, (34, 35), 192, 192, "XIO"),
    "weight-blocks-oix": ("winograd_3x3", False, 2, (11, 10), 200, 184, "OIX"),
    "weight-rows": ("winograd_4x4", False, 2, (9, 9), 128, 64, "XIO"),
    # a 3-row output: every tile is short of rows, so no tile uses the last row of positions
    # (the weight gradient's dU is zero there, chunked or not)
    "short-rows": ("winograd_4x4", True, 2, (3, 9), 192, 192, "XIO"),
    "short-rows-whole": ("winograd_4x4", False, 2, (3, 9), 192, 192, "XIO"),
}


@pytest.mark.parametrize("case", sorted(STAGED))
def test_staged_passes(case):
    method, chunked, n, size, c, k, ff = STAGED[case]
    library.set_winograd_chunk_bytes(200_000 if chunked else 0)
    try:
        # first NaN everywhere in the kept buffers, from a map whose tiles use every position
        px, pw, pdy, pattrs, _ = _case(np.random.default_rng(1), n, (8, 8), c, k,
                                       ((1, 1), (1, 1)), filter_format=ff)
        jax.block_until_ready(_kernels(jnp.full_like(px, jnp.nan), pw,
                                       jnp.full_like(pdy, jnp.nan), pattrs, method))
        x, w, dy, attrs, refs = _case(np.random.default_rng(1), n, size, c, k,
                                      ((1, 1), (1, 1)), filter_format=ff)
        for got, ref in zip(_kernels(x, w, dy, attrs, method), refs):
            h.assert_close(got, ref, jnp.float32)
    finally:
        library.set_winograd_chunk_bytes(0)


def test_staged_bfloat16_blocks(small_chunks):
    """U's blocks from a bfloat16 filter, in both views (forward and data gradient)."""
    x, w, dy, attrs, _ = _case(np.random.default_rng(5), 2, (9, 9), 192, 192, ((1, 1), (1, 1)))
    xb, wb, dyb = (a.astype(jnp.bfloat16) for a in (x, w, dy))
    ref = oracles.conv_all(h.data_to_ncx(h.to_f64(xb), "NXC"),
                           h.conv_filter_to_oix(h.to_f64(wb), "XIO"),
                           h.data_to_ncx(h.to_f64(dyb), "NXC"), strides=(1, 1), dilations=(1, 1),
                           pads_begin=(1, 1), pads_end=(1, 1), groups=1)
    refs = (h.data_from_ncx(ref[0], "NXC"), h.data_from_ncx(ref[1], "NXC"))
    for got, r in zip(_kernels(xb, wb, dyb, attrs, "winograd_4x4")[:2], refs):
        h.assert_close(got, r, jnp.bfloat16)


# Where the passes run (decisions.h, WinogradOnPool): each forward plan, fused (a small
# filter) and staged (chunked, blocked U; whole U), as the forward and as the data gradient
# (the forward of the flipped filter), on one example and on several.
WHERE = {"fused": ("winograd_4x4", False, 3, (13, 11), 70, 130),
         "fused-one-example": ("winograd_2x2", False, 1, (14, 14), 32, 64),
         "blocks": STAGED["blocks-oix-tails"][:2] + (2, (9, 10), 200, 184),
         "whole-u": STAGED["whole-u"][:2] + (2, (34, 35), 192, 192)}


@pytest.mark.parametrize("case", sorted(WHERE))
def test_the_forward_runs_on_xlas_pool_as_on_the_team_bit_for_bit(case):
    """A Winograd forward (and data gradient) runs its passes as parts on XLA's pool, split for
    this machine's pool and for 4 threads on it, and computes bit for bit what it computes on
    the OpenMP team (``library.winograd_on_pool(False)``); a weight gradient stays on the
    team."""
    method, chunked, n, size, c, k = WHERE[case]
    x, w, dy, attrs, refs = _case(np.random.default_rng(3), n, size, c, k, ((1, 1), (1, 1)))
    fwd = jax.jit(lambda x, w: jaxconv.convolution(x, w, lowering=method, **attrs))
    data = jax.jit(lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape,
                                                                   lowering=method, **attrs))
    weight = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(
        x, dy, w.shape, lowering=method, **attrs))
    library.set_winograd_chunk_bytes(200_000 if chunked else 0)
    try:
        def run():
            return np.asarray(fwd(x, w)), np.asarray(data(dy, w))
        before = library.cache_stats()["winograd_pool_calls"]
        on_pool = run()
        assert library.cache_stats()["winograd_pool_calls"] == before + 2
        for got, ref in zip(on_pool, refs):
            h.assert_close(got, ref, jnp.float32)
        with library.planned_pool_threads(4):
            four = run()
        with library.winograd_on_pool(False):
            before = library.cache_stats()["winograd_pool_calls"]
            on_team = run()
            assert library.cache_stats()["winograd_pool_calls"] == before
        for a, b, c_ in zip(on_pool, four, on_team):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c_)
        before = library.cache_stats()["winograd_pool_calls"]
        h.assert_close(weight(x, dy), refs[2], jnp.float32)
        assert library.cache_stats()["winograd_pool_calls"] == before
    finally:
        library.set_winograd_chunk_bytes(0)


def _problem(channels=64, size=28, batch=8, dtype_format="NXC"):
    return geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(batch, size, size, channels), y_shape=None,
        w_shape=(3, 3, channels, channels), strides=1, pads_begin=1, pads_end=1, dilations=1,
        auto_pad="explicit", groups=1, data_format=dtype_format, filter_format="XIO")


# output side: the tiles lowering="auto" times, widest first (the 3x3 tile where its tiles
# multiply less than the 4x4 ones: 5x5 in 81 products against 121, 6x6 in 100 against 121,
# 9x9 in 225 against 289)
TIMED = {5: (4, 3, 2), 6: (4, 3, 2), 7: (4, 2), 9: (4, 3, 2), 10: (4, 2), 12: (4, 2),
         14: (4, 2), 28: (4, 2)}


@pytest.mark.parametrize("m, size, want", [
    (3, 5, (5 + 4) ** 2),    # one whole tile and one short one per side
    (3, 6, 10 ** 2),         # two whole tiles
    (4, 7, (6 + 5) ** 2),
    (4, 10, (6 + 6 + 5) ** 2),
    (4, 3, 5 ** 2),          # only a short tile
    (2, 5, (4 + 4 + 3) ** 2),
])
def test_products_count_a_short_tile_without_its_point_at_infinity(m, size, want):
    assert winograd.products(m, _problem(size=size)) == want


@pytest.mark.parametrize("method, size", [("winograd_3x3", (5, 5)), ("winograd_4x4", (7, 6)),
                                          ("winograd_2x2", (3, 5))])
def test_the_products_a_short_tile_skips_are_never_read(method, size):
    """A short tile neither computes nor reads its products at the point at infinity: after a
    call whose every product was NaN (left in the handler's kept buffers), each kernel matches
    torch."""
    x, w, dy, attrs, refs = _case(np.random.default_rng(6), 2, size, 64, 48, ((1, 1), (1, 1)))
    jax.block_until_ready(_kernels(jnp.full_like(x, jnp.nan), w, jnp.full_like(dy, jnp.nan),
                                   attrs, method))
    for got, ref in zip(_kernels(x, w, dy, attrs, method), refs):
        h.assert_close(got, ref, jnp.float32)


@pytest.mark.parametrize("size", sorted(TIMED))
def test_the_3x3_tile_is_timed_where_it_multiplies_less(size):
    p = _problem(size=size)
    assert winograd.timed_tiles(Kernel.FORWARD, p) == TIMED[size]
    assert (winograd.products(3, p) < winograd.products(4, p)) == (3 in TIMED[size])
    assert winograd.fewest_products_tile(Kernel.FORWARD, p) == (3 if 3 in TIMED[size] else 4)
    # more than 512 summed float32 channels: only the 2x2 tile, whose error stays lowest
    assert winograd.timed_tiles(Kernel.FORWARD, _problem(channels=1024, size=size)) == (2,)


@pytest.mark.parametrize("kernel", list(Kernel))
def test_auto_takes_winograd_where_it_pays_and_never_with_highest(kernel):
    f32 = np.dtype("float32")
    p = _problem()
    assert chooser.plan(kernel, p, method="auto", backend="cpu", dtype=f32).method == "winograd"
    highest = chooser.plan(kernel, p, method="auto", backend="cpu", dtype=f32,
                          precision=lax.Precision.HIGHEST)
    assert highest.method == "onednn"
    forced = chooser.plan(kernel, p, method="winograd_4x4", backend="cpu", dtype=f32,
                         precision=(lax.Precision.DEFAULT, lax.Precision.HIGHEST))
    assert forced.method == "onednn"
    # bfloat16: the rule is oneDNN's direct kernel, which Winograd challenges where timed
    # (measured.WINOGRAD_BFLOAT16_MARGIN); the suite times nothing (JAXCONV_MEASURE=0)
    assert chooser.cpu_table_method(kernel, p, np.dtype(jnp.bfloat16)) == "winograd"
    assert chooser.plan(kernel, p, method="auto", backend="cpu",
                       dtype=np.dtype(jnp.bfloat16)).method == "onednn"
    assert chooser.plan(kernel, p, method="auto", backend="cpu",
                       dtype=np.dtype(jnp.float16)).method != "winograd"
    # below its channels or positions, oneDNN's direct kernel; no custom call off CPU or when
    # exported, and none that runs per device's blocks
    assert chooser.plan(kernel, _problem(channels=16), method="auto", backend="cpu",
                       dtype=f32).method == "onednn"
    assert chooser.plan(kernel, _problem(size=4), method="auto", backend="cpu",
                       dtype=f32).method == "onednn"
    assert chooser.plan(kernel, _problem(size=5), method="auto", backend="cpu",
                       dtype=f32).method == "winograd"
    assert chooser.plan(kernel, _problem(size=7), method="auto", backend="cpu",
                       dtype=f32).method == "winograd"
    sharded = chooser.plan(kernel, p, method="auto", backend="cpu", dtype=f32, partitioned=True)
    assert (sharded.method, sharded.per_shard) == ("onednn", True)  # oneDNN's, per shard
    assert chooser.plan(kernel, p, method="auto", backend="cpu", dtype=f32,
                       portable=True).method not in NAMES
    assert chooser.plan(kernel, p, method="winograd", backend="gpu",
                       dtype=f32).method not in NAMES


def test_the_tile_keeps_the_measured_error_within_half_the_bound():
    assert winograd.tile(Kernel.FORWARD, _problem(channels=512)) == 4
    assert winograd.tile(Kernel.FORWARD, _problem(channels=1024)) == 2
    assert winograd.tile(Kernel.DATA, _problem(channels=1024)) == 2
    assert winograd.tile(Kernel.WEIGHT, _problem(channels=1024)) == 4


def test_highest_compiles_no_winograd_call():
    x, w = jnp.ones((2, 16, 16, 32)), jnp.ones((3, 3, 32, 32))

    def program(precision):
        return jax.jit(lambda x, w: jaxconv.convolution(
            x, w, pads_begin=1, pads_end=1, precision=precision)).lower(x, w).as_text()
    assert "jaxconv_winograd_forward" in program(None)
    assert "jaxconv_winograd" not in program(lax.Precision.HIGHEST)


# The switches of docs/precision.md, "Winograd": lowering="direct" per op call, per accelerated
# function, and JAXCONV_WINOGRAD=0 per process. Each leaves no Winograd call in the program, in
# the derivatives too, and computes what oneDNN's direct kernel computes, bit for bit.

def _loss(lowering):
    def loss(x, w):
        return (jaxconv.convolution(x, w, pads_begin=1, pads_end=1, lowering=lowering) ** 2).sum()
    return loss


def test_lowering_direct_runs_no_winograd_in_the_call_and_its_derivatives():
    rng = np.random.default_rng(5)
    x, w = h.random(rng, (2, 16, 16, 32)), h.random(rng, (3, 3, 32, 32))

    def program(lowering):
        return jax.jit(jax.value_and_grad(_loss(lowering), argnums=(0, 1))).lower(x, w).as_text()
    assert "jaxconv_winograd" in program("auto")
    direct = program("direct")
    assert "jaxconv_winograd" not in direct and "jaxconv_onednn" in direct
    got = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1,
                                                   lowering="direct"))(x, w)
    want = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1,
                                                    lowering="onednn"))(x, w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_accelerate_lowering_direct_runs_no_winograd():
    x, w = jnp.ones((2, 16, 16, 32)), jnp.ones((3, 3, 32, 32)) / 288

    def loss(x, w):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y ** 2).sum()

    def program(**kw):
        return jax.jit(jaxconv.accelerate(jax.grad(loss, argnums=(0, 1)), **kw)).lower(
            x, w).as_text()
    assert "jaxconv_winograd" in program()
    direct = program(lowering="direct")
    assert "jaxconv_winograd" not in direct and "jaxconv_onednn" in direct
    with pytest.raises(ValueError, match="accelerate: lowering must be 'auto' or 'direct', "
                                         "got 'winograd'"):
        jaxconv.accelerate(loss, lowering="winograd")


def test_jaxconv_winograd_0_switches_it_off_for_the_process():
    code = ("import jax, jax.numpy as jnp, jaxconv\n"
            "x, w = jnp.ones((2, 16, 16, 32)), jnp.ones((3, 3, 32, 32))\n"
            "f = lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1)\n"
            "text = jax.jit(jax.grad(lambda x, w: f(x, w).sum(), argnums=(0, 1))).lower(x, w)"
            ".as_text()\n"
            "forced = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1, "
            "lowering='winograd')).lower(x, w).as_text()\n"
            "print('winograd' in text, 'onednn' in text, 'winograd' in forced)\n")
    env = {**os.environ, "JAXCONV_WINOGRAD": "0", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["False", "True", "True"]  # a forced Winograd method still runs it


def test_jit_vmap_and_grad_through_winograd():
    rng = np.random.default_rng(2)
    x, w, dy, attrs, refs = _case(rng, 2, (9, 8), 32, 48, ((1, 1), (1, 1)))

    def loss(x, w):
        return jnp.sum(jaxconv.convolution(x, w, lowering="winograd", **attrs) * dy)
    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    h.assert_close(gx, refs[1], jnp.float32)
    h.assert_close(gw, refs[2], jnp.float32)
    # vmap over x folds into the batch; over W into groups, where Winograd does not apply and
    # the direct convolution computes it
    ys = jax.vmap(lambda x: jaxconv.convolution(x[None], w, lowering="winograd", **attrs)[0])(x)
    h.assert_close(ys, refs[0], jnp.float32)
    ws = jnp.stack([w, 2 * w])
    yw = jax.vmap(lambda w: jaxconv.convolution(x, w, lowering="winograd", **attrs))(ws)
    h.assert_close(yw[1], 2 * refs[0], jnp.float32)


def test_check_grads_to_order_2():
    rng = np.random.default_rng(3)
    x, w = h.random(rng, (1, 6, 5, 8)), h.random(rng, (3, 3, 8, 8))
    jaxconv.testing.check_grads(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1,
                                                               lowering="winograd"),
                                (x, w), order=2)


@pytest.mark.parametrize("faster", ["winograd_4x4", "winograd_2x2", "onednn"])
def test_auto_times_each_tile_against_onednn_on_this_machine(measuring, monkeypatch, faster):
    timed = []

    def fake(c, seconds):
        kernel, methods = c.kernel, tuple(c.calls)
        timed.append(methods)
        return {m: [1.0 if m == faster else 2.0] * 7 for m in methods}

    monkeypatch.setattr(measuring, "_sample_times", fake)
    x, w = jnp.ones((2, 16, 16, 32)), jnp.ones((3, 3, 32, 32))
    text = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1)).lower(
        x, w).as_text()
    # (XLA's own too, a small problem: it timed slower here)
    assert timed == [("winograd_4x4", "winograd_2x2", "onednn", "conv")]
    tiles = {"winograd_4x4": "m = 4", "winograd_2x2": "m = 2"}
    assert ("jaxconv_winograd_forward" in text) == (faster in tiles)
    if faster in tiles:
        assert tiles[faster] in text
    # where the accuracy rule allows only 2x2 (more than 512 summed channels), 4x4 is not timed
    timed.clear()
    wide = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(1, 10, 10, 1024), y_shape=None, w_shape=(3, 3, 1024, 32),
        strides=1, pads_begin=1, pads_end=1, dilations=1, auto_pad="explicit", groups=1,
        data_format="NXC", filter_format="XIO")
    chooser.one_device_method(Kernel.FORWARD, wide, "cpu", np.dtype("float32"))
    assert timed == [("winograd_2x2", "onednn", "conv")]
    # past the cap, Winograd without timing
    monkeypatch.setattr(chooser, "WINOGRAD_MEASURE_MAX_MACS", 10)
    monkeypatch.setattr(measuring, "_VERDICTS", {})
    measuring._disk.cache_clear()
    monkeypatch.setattr(measuring, "_cache_file", lambda: pytest.fail("no verdict to read"))
    text = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1) + 1).lower(
        x, w).as_text()
    assert "jaxconv_winograd_forward" in text and len(timed) == 1


@pytest.mark.parametrize("pads", [(0, 0), (1, 1), (2, 1)])
def test_conv_transpose_is_the_data_gradient(pads):
    """A stride-1 3x3 ConvTranspose is the data gradient of the convolution it transposes:
    against torch's ``conv_transpose2d`` in float64 (NCX, IOX weights)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x, w = h.random(rng, (2, 40, 9, 11)), h.random(rng, (40, 36, 3, 3))
    got = jaxconv.conv_transpose(x, w, strides=1, pads_begin=pads[0], pads_end=pads[1],
                                 data_format="NCX", filter_format="IOX", lowering="winograd")
    ref = torch.nn.functional.conv_transpose2d(
        torch.tensor(h.to_f64(x)), torch.tensor(h.to_f64(w)))
    (b, e) = pads
    ref = ref[:, :, b:ref.shape[2] - e, b:ref.shape[3] - e].numpy()
    text = jax.jit(lambda x, w: jaxconv.conv_transpose(
        x, w, strides=1, pads_begin=pads[0], pads_end=pads[1], data_format="NCX",
        filter_format="IOX", lowering="winograd")).lower(x, w).as_text()
    assert "jaxconv_winograd_forward" in text
    h.assert_close(got, ref, jnp.float32)


@pytest.mark.parametrize("empty", ["batch", "channels", "output"])
def test_empty_problems_are_zeros(empty):
    """Forced on a zero-size problem (no example, no input channel, no output position: a 2x2
    input unpadded), the dispatch returns zeros before any method runs."""
    n, c, size, pad = {"batch": (0, 8, (6, 6), 1), "channels": (2, 0, (6, 6), 1),
                       "output": (2, 8, (2, 2), 0)}[empty]
    x, w = jnp.ones((n, *size, c)), jnp.ones((3, 3, c, 4))
    attrs = dict(strides=1, pads_begin=pad, pads_end=pad)
    y = jaxconv.convolution(x, w, lowering="winograd", **attrs)
    dy = jnp.ones(y.shape)
    dx = jaxconv.convolution_backward_data(dy, w, x.shape, lowering="winograd", **attrs)
    dw = jaxconv.convolution_backprop_filters(x, dy, w.shape, lowering="winograd", **attrs)
    assert (y.shape, dx.shape, dw.shape) == ((n, size[0] + 2 * pad - 2, size[1] + 2 * pad - 2, 4),
                                             x.shape, w.shape)
    assert not np.any(y) and not np.any(dx) and not np.any(dw)
