"""The formulations' own rules: the data gradient's grid and stride phases, the grouped
combinators with non-finite values, the product over a whole window, the depthwise partial
sums."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src import geometry, lowering
from jaxconv._src.lowering import tables
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import shifted, taps
from tests.support import helpers as h
from tests.support import oracles
from tests.support.cases import CONV_TRANSPOSE_MATRIX
from tests.support.lowering_matrix import (
    COMBINATORS,
    DATA_LEAVES,
    HIGHEST,
    _dot_generals,
    _marks,
    _problem_3d,
    _problem_strided,
)

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
    convolution multiplies the inf by a padded zero: NaN; docs/onednn.md). The data gradient's
    reference is one dense problem per group, by the same rule as the block-diagonal one's
    (here "dot" of few input channels, which multiplies no padded zero either; XLA:GPU's
    convolutions of the stride phases place the NaNs of padded taps differently, seen on an
    H200)."""
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
    ref = run("per_group" if kind in ("forward", "data") else "conv")
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
        return lowering.choose(Kernel.DATA, p, "cpu")

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
        assert lowering.choose(Kernel.DATA, p, "gpu") == "vjp"
        assert lowering.choose(Kernel.DATA, p, "default") == "vjp"
    # GPU: non-overlapping 3D windows of <= 32 result channels take per-tap products.
    assert lowering.choose(Kernel.DATA, _problem_3d(16), "gpu") == "dot"
    assert lowering.choose(Kernel.DATA, _problem_3d(64), "gpu") == "vjp"
    # OpenVINO's 3D example: "dot" would keep ~8x its 2.7 GiB result in temporaries
    big = geometry.conv_transpose_problem(
        "t", geometry.Names(), x_shape=(1, 20, 224, 224, 224), y_shape=None,
        w_shape=(20, 2, 3, 3, 3), strides=2, pads_begin=1, pads_end=1, dilations=None,
        auto_pad="explicit", output_padding=None, groups=4, data_format="NCX",
        filter_format="IOX")
    assert cpu(big) == "phases"


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




# ---- "dot": one product for a generator's first and last layers ---------------------

# (rank, data_format, filter_format, groups, kernel, strides, dilations, pads_begin, pads_end)
ONE_INPUT_POSITION = [
    # every tap reached once, in reverse (a reversed slice); strided and dilated
    (1, "NCX", "OIX", 1, (5,), (2,), (2,), (8,), (4,)),
    # an axis whose odd positions no tap reaches (zeros: a gather), grouped
    (2, "NXC", "XIO", 2, (4, 3), (1, 1), (1, 2), (3, 5), (3, 1)),
    # pads past the kernel: positions beyond every tap
    (3, "NCX", "XIO", 1, (2, 3, 2), (1, 1, 1), (1, 1, 1), (1, 2, 3), (1, 0, 0)),
    # DCGAN's first layer (100 -> 4x4)
    (2, "NXC", "XIO", 1, (4, 4), (1, 1), (1, 1), (3, 3), (3, 3)),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rank,df,ff,groups,kernel,strides,dil,pb,pe", ONE_INPUT_POSITION)
def test_dot_forward_of_one_input_position(rank, df, ff, groups, kernel, strides, dil, pb, pe,
                                           dtype):
    """Every input extent 1: "dot" computes the forward as one product batched over the taps
    (each output position reads one tap at most), then the taps picked per axis: against
    PyTorch, one dot_general, no negative pad, derivatives to order 2 (float32)."""
    rng = np.random.default_rng(11)
    ic, oc = 6, 4 * groups
    x = h.random(rng, h.data_shape(df, 2, ic, (1,) * rank), dtype)
    w_shape = h.conv_filter_shape(ff, oc, ic // groups, kernel)
    w = h.random(rng, w_shape, dtype)
    kw = dict(strides=strides, dilations=dil, pads_begin=pb, pads_end=pe, groups=groups,
              data_format=df, filter_format=ff, precision=HIGHEST, lowering="dot")
    p = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=x.shape, y_shape=None, w_shape=w_shape, strides=strides,
        pads_begin=pb, pads_end=pe, dilations=dil, auto_pad="none", groups=groups,
        data_format=df, filter_format=ff)
    assert p.one_input_position and taps.one_product(Kernel.FORWARD, p)

    def forward(x, w):
        return jaxconv.convolution(x, w, **kw)
    y = oracles.conv_all(h.data_to_ncx(h.to_f64(x), df), h.conv_filter_to_oix(h.to_f64(w), ff),
                         np.zeros(oracles.conv_output_shape(
                             h.data_to_ncx(np.zeros(x.shape), df).shape,
                             h.conv_filter_to_oix(np.zeros(w_shape), ff).shape,
                             strides=strides, dilations=dil, pads_begin=pb, pads_end=pe,
                             groups=groups)),
                         strides=strides, dilations=dil, pads_begin=pb, pads_end=pe,
                         groups=groups)[0]
    h.assert_close(forward(x, w), h.data_from_ncx(y, df), dtype)
    assert len(_dot_generals(forward, x, w)) == 1
    assert h.negative_widths(forward, x, w) == []
    if dtype == jnp.float32:
        h.check_grads(forward, (x, w), order=2)


# (rank, data_format, filter_format, input size, kernel, strides, dilations, pads_begin,
# pads_end, in channels, out channels)
FEW_INPUT_CHANNELS = [
    (1, "NCX", "OIX", (13,), (3,), (3,), (2,), (2,), (4,), 2, 5),
    # DCGAN's last layer, with strided remainders
    (2, "NXC", "XIO", (12, 10), (4, 4), (2, 2), (1, 1), (1, 2), (2, 1), 3, 8),
    (3, "NCX", "XIO", (6, 5, 7), (2, 3, 2), (2, 1, 2), (1, 1, 1), (0, 1, 1), (1, 1, 0), 1, 4),
    # pads past the kernel: taps that land before dx's first element (cropped)
    (2, "NCX", "OIX", (9, 8), (3, 3), (2, 2), (1, 1), (4, 1), (0, 3), 4, 6),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rank,df,ff,size,kernel,strides,dil,pb,pe,ic,oc", FEW_INPUT_CHANNELS)
def test_dot_data_gradient_of_few_input_channels(rank, df, ff, size, kernel, strides, dil, pb,
                                                 pe, ic, oc, dtype):
    """Fewer than SPREAD_MAX_CHANNELS input channels (one group): "dot" computes the data
    gradient as one product (every tap's share of dx), each share moved into its stride phase
    and summed: against PyTorch, in the program one dot_general, no negative pad, derivatives
    to order 2 (float32); the conv_transpose it is the forward of too."""
    rng = np.random.default_rng(12)
    x_shape = h.data_shape(df, 2, ic, size)
    w_shape = h.conv_filter_shape(ff, oc, ic, kernel)
    w = h.random(rng, w_shape, dtype)
    y_ncx = oracles.conv_output_shape(h.data_to_ncx(np.zeros(x_shape), df).shape,
                                      h.conv_filter_to_oix(np.zeros(w_shape), ff).shape,
                                      strides=strides, dilations=dil, pads_begin=pb,
                                      pads_end=pe, groups=1)
    dy = h.random(rng, h.data_shape(df, 2, oc, y_ncx[2:]), dtype)
    kw = dict(strides=strides, dilations=dil, pads_begin=pb, pads_end=pe, data_format=df,
              filter_format=ff, precision=HIGHEST, lowering="dot")
    p = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=x_shape, y_shape=dy.shape, w_shape=w_shape,
        strides=strides, pads_begin=pb, pads_end=pe, dilations=dil, auto_pad="none", groups=1,
        data_format=df, filter_format=ff)
    assert taps.spreads(p) and taps.one_product(Kernel.DATA, p)

    def data(dy, w):
        return jaxconv.convolution_backward_data(dy, w, x_shape, **kw)
    dx = oracles.conv_all(np.zeros(h.data_to_ncx(np.zeros(x_shape), df).shape),
                          h.conv_filter_to_oix(h.to_f64(w), ff), h.data_to_ncx(h.to_f64(dy), df),
                          strides=strides, dilations=dil, pads_begin=pb, pads_end=pe,
                          groups=1)[1]
    h.assert_close(data(dy, w), h.data_from_ncx(dx, df), dtype)
    assert len(_dot_generals(data, dy, w)) == 1
    assert h.negative_widths(data, dy, w) == []
    if dtype == jnp.float32:
        h.check_grads(data, (dy, w), order=2)


def test_spread_and_one_position_rules():
    """Where "dot" takes the one-product forms: a data gradient of fewer than 16 input
    channels, one group, more than one tap, its products at most 8x dx; a forward of one input
    position (and more than one output position)."""
    def problem(x_shape, w_shape, groups=1, strides=2, pads=1):
        return geometry.convolution_problem(
            "t", geometry.Names(), x_shape=x_shape, y_shape=None, w_shape=w_shape,
            strides=strides, pads_begin=pads, pads_end=pads, dilations=1, auto_pad="none",
            groups=groups, data_format="NXC", filter_format="XIO")
    assert taps.SPREAD_MAX_CHANNELS == 16 and taps.SPREAD_MAX_RATIO == 8
    assert taps.spreads(problem((1, 64, 64, 3), (4, 4, 3, 64)))  # DCGAN's last
    assert not taps.spreads(problem((1, 64, 64, 16), (4, 4, 16, 64)))  # a vector's lanes
    assert not taps.spreads(problem((1, 64, 64, 4), (4, 4, 2, 64), groups=2))
    assert not taps.spreads(problem((1, 64, 64, 3), (1, 1, 3, 64), pads=0))  # one tap
    assert not taps.spreads(problem((1, 64, 64, 3), (3, 3, 3, 1)))  # one output channel
    # 3x3 at stride 1: 9 taps' products for each of dx's elements, past 8
    assert not taps.spreads(problem((1, 64, 64, 3), (3, 3, 3, 64), strides=1))
    one = problem((8, 1, 1, 100), (4, 4, 100, 512), strides=1, pads=3)
    assert one.one_input_position and one.output_size == (4, 4)
    assert not problem((8, 1, 1, 100), (1, 1, 100, 512), strides=1, pads=0).one_input_position
