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
    if method == "dot":
        return all(k == 1 for k in kernel)
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
            "t", geometry.Names(), x_shape=(2, 9, 9, ic), y_shape=None,
            w_shape=(*kernel, ic // groups, 8), strides=None, pads_begin=None, pads_end=None,
            dilations=None, auto_pad="valid", groups=groups, data_format="NXC",
            filter_format="XIO")

    assert lowering.choose_weight_grad(problem(1, 4, (3, 3))) == "conv"
    assert lowering.choose_weight_grad(problem(2, 4, (3, 3))) == "feature_group"
    assert lowering.choose_weight_grad(problem(4, 4, (3, 3))) == "shifted"
    assert lowering.choose_weight_grad(problem(2, 4, (1, 1))) == "dot"


def test_inapplicable_or_unknown_method():
    x, dy = jnp.ones((1, 6, 6, 4)), jnp.ones((1, 4, 4, 4))
    with pytest.raises(ValueError, match="weight_grad_lowering: method must be one of"):
        with jaxconv.weight_grad_lowering("fast"):
            pass
    with jaxconv.weight_grad_lowering("dot"):
        with pytest.raises(ValueError, match=r"convolution_backprop_filters: weight_grad_lowering "
                                             r"'dot' needs a 1x1 kernel, got \[3, 3\]"):
            jaxconv.convolution_backprop_filters(x, dy, (3, 3, 4, 4))
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

    x5 = jaxconv.tbe.to_5hd(h.random(rng, (2, 6, 7, 7)))
    dy5 = jaxconv.tbe.to_5hd(h.random(rng, (2, 4, 7, 7)))
    para = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilations": [1, 1, 1, 1], "groups": 2}
    ref = jaxconv.conv2d_backprop_filter(x5, dy5, (4, 3, 3, 3), para)
    with jaxconv.weight_grad_lowering(method):
        got = jaxconv.conv2d_backprop_filter(x5, dy5, (4, 3, 3, 3), para)
    h.assert_close(got, ref, jnp.float32)
