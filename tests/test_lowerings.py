"""Every weight-gradient lowering, forced, against PyTorch on a matrix of problems.

``weight_grad_lowering`` forces a formulation; each applicable one must agree
with torch autograd (float64) in every layout, rank, group kind and geometry
here, and the automatic choice must be the documented one.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import geometry, lowering
from tests import helpers as h
from tests import oracles
from tests.test_convolution import Case

HIGHEST = lax.Precision.HIGHEST
ALL = ("conv", "feature_group", "shifted", "dot")


def _applies(method, case: Case, kernel) -> bool:
    if method == "shifted":
        return case.groups_name == "depthwise"
    return True


# (rank, data_format, filter_format, groups, geometry) x kernels, including 1x1.
CASES = []
for rank, df, ff in [(1, "NCX", "OIX"), (2, "NXC", "XIO"), (3, "NCX", "XIO"), (2, "NCX", "OIX")]:
    for gname in ("g1", "g2", "depthwise"):
        for geo in ("stride_dil_remainder", "same_upper", "valid"):
            for kernel in ({1: (3,), 2: (3, 2), 3: (2, 3, 2)}[rank], (1,) * rank):
                CASES.append((Case(rank, df, ff, gname, geo), kernel))


def _run(case: Case, kernel, method):
    g, ic, oc = {"g1": (1, 4, 3), "g2": (2, 4, 6), "depthwise": (4, 4, 8)}[case.groups_name]
    rng = np.random.default_rng(0)
    spatial = {1: (11,), 2: (9, 7), 3: (6, 5, 7)}[case.rank]
    x = h.random(rng, h.data_shape(case.data_format, 2, ic, spatial))
    w_shape = h.conv_filter_shape(case.filter_format, oc, ic // g, kernel)
    attrs = case.attrs
    mode = attrs["auto_pad"].lower()
    if mode in ("none", "explicit"):
        pb, pe = attrs["pads_begin"], attrs["pads_end"]
    elif mode == "valid":
        pb = pe = (0,) * case.rank
    else:
        pb, pe = h.same_pads(spatial, kernel, attrs["strides"], attrs["dilations"],
                             upper=mode == "same_upper")
    y_ncx = oracles.conv_output_shape(
        h.data_to_ncx(np.zeros(x.shape), case.data_format).shape,
        h.conv_filter_to_oix(np.zeros(w_shape), case.filter_format).shape,
        strides=attrs["strides"], dilations=attrs["dilations"], pads_begin=pb, pads_end=pe,
        groups=g)
    dy = h.random(rng, h.data_from_ncx(np.zeros(y_ncx), case.data_format).shape)
    with jaxconv.weight_grad_lowering(method):
        got = jaxconv.convolution_backprop_filters(x, dy, w_shape, **attrs, precision=HIGHEST)
    _, _, dw = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), case.data_format),
        h.conv_filter_to_oix(np.zeros(w_shape), case.filter_format),
        h.data_to_ncx(h.to_f64(dy), case.data_format), strides=attrs["strides"],
        dilations=attrs["dilations"], pads_begin=pb, pads_end=pe, groups=g)
    h.assert_close(got, h.conv_filter_from_oix(dw, case.filter_format), jnp.float32)


PARAMS = [pytest.param(c, k, m, id=f"{m}-{c.id}-k{'x'.join(map(str, k))}")
          for c, k in CASES for m in ALL if _applies(m, c, k)]


@pytest.mark.parametrize("case,kernel,method", PARAMS)
def test_every_lowering_against_torch(case, kernel, method):
    _run(case, kernel, method)


def test_auto_choice():
    def problem(groups, ic, kernel):
        return geometry.convolution_problem(
            "t", geometry.Names(), x_shape=(2, *[9] * len(kernel), ic), y_shape=None,
            w_shape=(*kernel, ic // groups, 8), strides=None, pads_begin=None, pads_end=None,
            dilations=None, auto_pad="valid", groups=groups, data_format="NXC",
            filter_format="XIO")

    assert lowering.choose_weight_grad(problem(1, 4, (3, 3))) == "conv"
    assert lowering.choose_weight_grad(problem(2, 4, (3, 3))) == "feature_group"
    assert lowering.choose_weight_grad(problem(4, 4, (3, 3))) == "shifted"
    assert lowering.choose_weight_grad(problem(2, 4, (1, 1))) == "dot"
    # 3D: per-tap products, except with fewer than 4 channels per group.
    assert lowering.choose_weight_grad(problem(1, 4, (3, 3, 3))) == "dot"
    assert lowering.choose_weight_grad(problem(2, 8, (3, 3, 3))) == "dot"
    assert lowering.choose_weight_grad(problem(4, 8, (3, 3, 3))) == "conv"
    assert lowering.choose_weight_grad(problem(4, 4, (3, 3, 3))) == "shifted"


def test_inapplicable_or_unknown_method():
    x, dy = jnp.ones((1, 6, 6, 4)), jnp.ones((1, 4, 4, 4))
    with pytest.raises(ValueError, match="weight_grad_lowering: method must be one of"):
        with jaxconv.weight_grad_lowering("fast"):
            pass
    with jaxconv.weight_grad_lowering("shifted"):
        with pytest.raises(ValueError, match="'shifted' needs one input channel per group"):
            jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4))


@pytest.mark.parametrize("method", ["conv", "feature_group"])
def test_conv_transpose_and_tbe_follow_the_override(method):
    """The ConvTranspose and TBE weight gradients use the same kernels."""
    rng = np.random.default_rng(1)
    x = h.random(rng, (2, 4, 5, 5))
    dy = h.random(rng, (2, 6, 11, 11))  # 2*(5-1) + 3 - 1 - 0 + 1
    kw = dict(strides=2, pads_begin=1, pads_end=0, output_padding=1, groups=2,
              data_format="NCX", weights_format="IOX", precision=HIGHEST)
    ref = jaxconv.conv_transpose_backward_weights(x, dy, (4, 3, 3, 3), **kw)
    with jaxconv.weight_grad_lowering(method):
        got = jaxconv.conv_transpose_backward_weights(x, dy, (4, 3, 3, 3), **kw)
    h.assert_close(got, ref, jnp.float32)
    _, _, dw_t = oracles.conv_transpose_all(h.to_f64(x), np.zeros((4, 3, 3, 3)), h.to_f64(dy),
                                            strides=(2, 2), dilations=(1, 1), pads_begin=(1, 1),
                                            out_size=(11, 11), groups=2)
    h.assert_close(got, dw_t, jnp.float32)

    x5 = jaxconv.tbe.to_5hd(h.random(rng, (2, 6, 7, 7)))
    dy5 = jaxconv.tbe.to_5hd(h.random(rng, (2, 4, 7, 7)))
    para = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilations": [1, 1, 1, 1], "groups": 2}
    ref = jaxconv.conv2d_backprop_filter(x5, dy5, (4, 3, 3, 3), para)
    with jaxconv.weight_grad_lowering(method):
        got = jaxconv.conv2d_backprop_filter(x5, dy5, (4, 3, 3, 3), para)
    h.assert_close(got, ref, jnp.float32)
    from tests.test_tbe import pack_fractal_z_loop
    _, _, dw_t = oracles.conv_all(
        h.to_f64(jaxconv.tbe.from_5hd(x5, 6)), np.zeros((4, 3, 3, 3)),
        h.to_f64(jaxconv.tbe.from_5hd(dy5, 4)), strides=(1, 1), dilations=(1, 1),
        pads_begin=(1, 1), pads_end=(1, 1), groups=2)
    h.assert_close(got, pack_fractal_z_loop(dw_t, 2), jnp.float32)


# ---- data gradient: grid and stride phases ---------------------------------------

from tests import test_conv_transpose as tct  # noqa: E402


@pytest.mark.parametrize("method", ["grid", "phases", "dot"])
@pytest.mark.parametrize("case", tct.MATRIX[::4], ids=lambda c: c.id)
def test_data_gradient_lowerings_against_torch(case, method):
    """conv_transpose (the data-gradient kernel) and its backward data, both forced."""
    x, w, dy = case.make(seed=9)
    a = dict(case.attrs, precision=HIGHEST, filter_format=case.weights_format)
    with jaxconv.data_grad_lowering(method):
        y = jaxconv.conv_transpose(x, w, **a)
    y_t, _, _ = case.torch_reference(x, w, dy)
    h.assert_close(y, y_t, jnp.float32)


@pytest.mark.parametrize("method", ["grid", "phases", "dot"])
def test_data_gradient_lowerings_convolution_backward_data(method):
    rng = np.random.default_rng(2)
    x = h.random(rng, (2, 9, 8, 4))
    w = h.random(rng, (3, 2, 2, 6))
    kw = dict(strides=(3, 2), dilations=(2, 1), pads_begin=(4, 0), pads_end=(1, 1), groups=2,
              precision=HIGHEST)
    y = jaxconv.convolution(x, w, **kw)
    dy = h.random(rng, y.shape)
    with jaxconv.data_grad_lowering(method):
        got = jaxconv.convolution_backward_data(dy, w, x.shape, **kw)
    _, dx, _ = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), "NXC"), h.conv_filter_to_oix(h.to_f64(w), "XIO"),
        h.data_to_ncx(h.to_f64(dy), "NXC"), strides=(3, 2), dilations=(2, 1),
        pads_begin=(4, 0), pads_end=(1, 1), groups=2)
    h.assert_close(got, h.data_from_ncx(dx, "NXC"), jnp.float32)


def test_data_gradient_auto_choice_and_unknown():
    assert lowering.choose_data_grad(_problem_strided(2)) == "phases"
    assert lowering.choose_data_grad(_problem_strided(1)) == "grid"
    assert lowering.choose_data_grad(_problem_strided(2, channels=3)) == "grid"  # image layer
    assert lowering.choose_data_grad(_problem_strided(2, groups=2)) == "dot"
    # the seed's 3D example: "dot" would keep ~8x its 2.7 GiB result in temporaries
    big = geometry.conv_transpose_problem(
        "t", geometry.Names(), x_shape=(1, 20, 224, 224, 224), y_shape=None,
        w_shape=(20, 2, 3, 3, 3), strides=2, pads_begin=1, pads_end=1, dilations=None,
        auto_pad="explicit", output_padding=None, groups=4, data_format="NCX",
        filter_format="IOX")
    assert lowering.choose_data_grad(big) == "phases"
    with pytest.raises(ValueError, match="data_grad_lowering: method must be one of"):
        with jaxconv.data_grad_lowering("fft"):
            pass


def _problem_strided(s, channels=8, groups=1):
    return geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(1, 9, 9, channels), y_shape=None,
        w_shape=(3, 3, channels // groups, 2 * groups),
        strides=s, pads_begin=None, pads_end=None, dilations=None, auto_pad="valid",
        groups=groups, data_format="NXC", filter_format="XIO")


@pytest.mark.parametrize("rank,df,ff,groups,dilation,pad", [
    (1, "NCX", "OIX", 1, 1, 0), (2, "NXC", "XIO", 2, 2, 1), (3, "NCX", "XIO", 1, 1, 1),
    (2, "NCX", "OIX", 4, 1, 0)])
def test_dot_for_a_window_covering_the_input(rank, df, ff, groups, dilation, pad):
    """Every output extent 1 (benchdnn's 3d_conv_large_shape): an outer product over the batch."""
    spatial = (5, 4, 3)[:rank]
    kernel = tuple((i + 2 * pad - 1) // dilation + 1 for i in spatial)
    pads_end = tuple((k - 1) * dilation + 1 - i - pad for k, i in zip(kernel, spatial))
    ic, oc = 4, 8
    rng = np.random.default_rng(3)
    x = h.random(rng, h.data_shape(df, 2, ic, spatial))
    dy = h.random(rng, h.data_shape(df, 2, oc, (1,) * rank))
    w_shape = h.conv_filter_shape(ff, oc, ic // groups, kernel)
    kw = dict(dilations=dilation, pads_begin=pad, pads_end=pads_end, groups=groups,
              data_format=df, filter_format=ff, precision=HIGHEST)
    from jaxconv._src import geometry as geo
    p = geo.convolution_problem("t", geo.Names(), x_shape=x.shape, y_shape=dy.shape,
                                w_shape=w_shape, strides=None, pads_begin=pad, pads_end=pads_end,
                                dilations=dilation, auto_pad="none", groups=groups,
                                data_format=df, filter_format=ff)
    assert lowering.choose_weight_grad(p) == "dot"
    got = jaxconv.convolution_backprop_filters(x, dy, w_shape, **kw)
    _, _, dw = oracles.conv_all(
        h.data_to_ncx(h.to_f64(x), df), h.conv_filter_to_oix(np.zeros(w_shape), ff),
        h.data_to_ncx(h.to_f64(dy), df), strides=(1,) * rank, dilations=(dilation,) * rank,
        pads_begin=(pad,) * rank, pads_end=pads_end, groups=groups)
    h.assert_close(got, h.conv_filter_from_oix(dw, ff), jnp.float32)
