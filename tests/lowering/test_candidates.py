"""What ``lowering="auto"`` may run on one CPU device, per problem class, is right for the class.

``measured.timed`` lists the candidates ``auto`` times for a call (docs/lowerings.md, "What auto
may run": the table's method, XLA's own program, Winograd's tiles and oneDNN). Each candidate
of each class runs here, forced, against PyTorch (float64) on problems of the class: pads past
the kernel (whose data gradient ``jax.vjp`` writes with a negative pad), strided remainders,
dilations, groups, 1 to 3 spatial axes, in float32 and 16-bit. Every class of the table is
reached (the Winograd class where the oneDNN extra is built).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import geometry
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import chooser
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support import oracles

HIGHEST = lax.Precision.HIGHEST
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the candidates are the CPU's (other backends time none)")

# (input size, kernel, strides, dilations, pads_begin, pads_end, in channels, out channels,
# groups), NCX data, OIX filters, batch 2
CASES = {
    "1d-pads-past-kernel": ((20,), (2,), (1,), (1,), (3,), (0,), 3, 4, 1),
    "1d-strided-past-kernel": ((7,), (3,), (2,), (1,), (4,), (3,), 2, 3, 1),
    "2d-grouped-dilated-past-kernel": ((6, 5), (2, 3), (1, 2), (2, 1), (3, 4), (1, 0), 4, 6, 2),
    "2d-strided-remainder": ((9, 8), (3, 3), (2, 2), (1, 1), (1, 0), (0, 1), 4, 8, 1),
    "3d-past-kernel": ((4, 3, 4), (2, 2, 2), (1, 1, 2), (1, 1, 1), (2, 3, 1), (0, 1, 2), 2, 3, 1),
    "2d-depthwise": ((8, 8), (3, 3), (1, 1), (1, 1), (2, 2), (2, 2), 8, 8, 8),
    "2d-winograd": ((10, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 32, 32, 1),
    # oneDNN's in 16-bit too, where oneDNN's float32 kernel widened challenges it
    "2d-strided-onednn": ((12, 12), (4, 4), (2, 2), (1, 1), (1, 2), (2, 1), 16, 32, 1),
    # "dot" as one product challenges oneDNN (float32): the forward of one input position,
    # pads past the kernel; the data gradient of few input channels, strided remainders
    "2d-one-input-position": ((1, 1), (4, 4), (1, 1), (1, 1), (3, 2), (3, 1), 16, 64, 1),
    "2d-few-input-channels": ((12, 10), (4, 4), (2, 2), (1, 1), (1, 2), (2, 1), 3, 48, 1),
}
#: the cases and kernels where "dot", as one product, challenges the table's method (float32):
#: a forward of one input position; data gradients of fewer than 16 input channels (one group,
#: their products at most 8x dx: not 3D's, nor the grouped ones)
PRODUCTS = {("2d-one-input-position", Kernel.FORWARD), ("2d-few-input-channels", Kernel.DATA),
            ("1d-pads-past-kernel", Kernel.DATA), ("1d-strided-past-kernel", Kernel.DATA),
            ("2d-strided-remainder", Kernel.DATA)}
DTYPES = [(jnp.float32, None), (jnp.float16, jnp.float32), (jnp.bfloat16, None)]


def _precision(name):
    """HIGHEST, but where the case is Winograd's: ``auto`` leaves HIGHEST to direct kernels."""
    return None if "winograd" in name else HIGHEST
_OPS = {Kernel.FORWARD: "forward", Kernel.DATA: "data", Kernel.WEIGHT: "weight"}


def _problem(case):
    size, k, s, d, pb, pe, ci, co, g = case
    return geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(2, ci, *size), y_shape=None, w_shape=(co, ci // g, *k),
        strides=s, pads_begin=pb, pads_end=pe, dilations=d, auto_pad="explicit", groups=g,
        data_format="NCX", filter_format="OIX")


def _run(kernel, method, x, w, dy, case, pet, precision):
    size, k, s, d, pb, pe, ci, co, g = case
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=g, data_format="NCX",
                 filter_format="OIX", precision=precision, preferred_element_type=pet,
                 lowering=method)
    if kernel is Kernel.FORWARD:
        return jaxconv.convolution(x, w, **attrs)
    if kernel is Kernel.DATA:
        return jaxconv.convolution_backward_data(dy, w, x.shape, **attrs)
    return jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs)


def _candidates(kernel, case, dtype, pet, precision):
    p = _problem(case)
    method = chooser.cpu_table_method(kernel, p, dtype, precision, pet)
    xla = chooser.xla_own_applies(kernel, p)
    return (chooser.candidate_class(kernel, p, method, xla_applies=xla),
            chooser.candidates(kernel, p, method, dtype, xla_applies=xla))


@pytest.mark.parametrize("dtype,pet", DTYPES, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("kernel", list(_OPS), ids=lambda k: _OPS[k])
@pytest.mark.parametrize("name", list(CASES))
def test_every_candidate_of_auto_is_right_for_its_class(name, kernel, dtype, pet):
    case, precision = CASES[name], _precision(name)
    klass, candidates = _candidates(kernel, case, dtype, pet, precision)
    assert klass in chooser.CANDIDATE_CLASSES
    own = [m for m in candidates if m != "onednn_f32"]  # a class's own, before widening
    assert (len(own) == 1) == (klass == "table"), (klass, candidates)
    assert ("onednn_f32" in candidates) == (
        own[0] == "onednn" and np.dtype(dtype) != np.float32
        and "float32" in library.status().dtypes), candidates
    assert ("dot" in candidates[1:]) == (  # a challenger (not the table's own "dot")
        (name, kernel) in PRODUCTS and np.dtype(dtype) == np.float32 and pet is None
        and klass == "small"), candidates
    size, k, s, d, pb, pe, ci, co, g = case
    rng = np.random.default_rng(0)
    x = h.random(rng, (2, ci, *size), dtype)
    w = h.random(rng, (co, ci // g, *k), dtype)
    y_shape = oracles.conv_output_shape(x.shape, w.shape, strides=s, dilations=d, pads_begin=pb,
                                        pads_end=pe, groups=g)
    dy = h.random(rng, y_shape, dtype)
    ref = oracles.conv_all(h.to_f64(x), h.to_f64(w), h.to_f64(dy), strides=s, dilations=d,
                           pads_begin=pb, pads_end=pe, groups=g)[list(_OPS).index(kernel)]
    for method in candidates:
        got = _run(kernel, method, x, w, dy, case, pet, precision)
        assert h.negative_widths(lambda x, w, dy, m=method: _run(kernel, m, x, w, dy, case, pet,
                                                                 precision), x, w, dy) == [], method
        h.assert_close(got, ref, pet or dtype)


def test_every_candidate_class_is_reached():
    """The matrix above reaches every class of the table."""
    seen = {_candidates(kernel, case, dtype, pet, _precision(name))[0]
            for name, case in CASES.items() for kernel in _OPS for dtype, pet in DTYPES}
    expected = set(chooser.CANDIDATE_CLASSES)
    if not library.status().available:  # the table picks Winograd only where oneDNN applies
        expected.discard("winograd")
    assert expected <= seen
    widened = {name for name, case in CASES.items() for kernel in _OPS
               for dtype, pet in DTYPES
               if "onednn_f32" in _candidates(kernel, case, dtype, pet, _precision(name))[1]}
    if "bfloat16" in library.status().dtypes:  # oneDNN's bfloat16 kernel, challenged
        assert "2d-strided-onednn" in widened
