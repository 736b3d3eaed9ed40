"""Every lowering, forced, against PyTorch on a matrix of problems (float64), and
``check_grads`` to order 2 of each weight and data lowering. The per-backend choice is
``test_lowering_tables.py``, the formulations' own rules ``test_lowering_formulations.py``, the
compiled programs ``test_lowering_programs.py``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import lowering
from jaxconv._src.kernel import Kernel
from tests.support import helpers as h
from tests.support import oracles
from tests.support.lowering_matrix import (
    ALL,
    CASES,
    COMBINATORS,
    HIGHEST,
    ISOLATED,
    PARAMS,
    WINOGRAD,
    _applies,
    _explicit_pads,
    _marks,
    _run,
)


@pytest.mark.parametrize("case,kernel,method", PARAMS)
def test_every_lowering_against_torch(case, kernel, method):
    _run(case, kernel, method)


# "conv" is what tests/ops/test_convolution.py checks against torch on its own matrix, Winograd
# tests/lowering/test_winograd.py
FORWARD = tuple(m for m in lowering.methods(Kernel.FORWARD) if m != "conv" and m not in WINOGRAD)
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
    for m in lowering.methods(Kernel.DATA) if m not in WINOGRAD
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

