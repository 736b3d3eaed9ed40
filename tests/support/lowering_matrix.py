"""The lowering matrix the lowering tests share: problems, which methods apply to each, the
forced run of one, small problems, and the parsing of products in a compiled program. (The
CPU table without the oneDNN extra is the ``xla_cpu_rules`` fixture of ``tests/conftest.py``.)"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import geometry, lowering
from jaxconv._src.kernel import Kernel
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support import oracles
from tests.support.cases import ConvCase as Case

HIGHEST = lax.Precision.HIGHEST
#: the Winograd methods: 3x3 stride-1 problems only, with a matrix of their own
#: (tests/lowering/test_winograd.py)
WINOGRAD = tuple(m for m in lowering.METHODS if m.startswith("winograd"))
#: every other weight-gradient method of the registry (what the matrix below runs, where it
#: applies)
ALL = tuple(m for m in lowering.methods(Kernel.WEIGHT) if m not in WINOGRAD)
#: the combinators (grouped problems only) and, per kernel, the leaf formulations
COMBINATORS = tuple(m for m, rec in lowering.METHODS.items() if rec.combinator)
DATA_LEAVES = tuple(m for m in lowering.methods(Kernel.DATA)
                    if m not in COMBINATORS and not m.startswith("winograd"))


def _applies(method, case: Case, kernel) -> bool:
    if method == "onednn":  # with the onednn extra built (tests/native/test_onednn.py says why not)
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


#: a forced "onednn" needs the extra built (tests/native/test_onednn.py says why not)
NEEDS_ONEDNN = pytest.mark.skipif(not library.status().available,
                                  reason="the onednn extra is not built")


def _marks(method):
    return [ISOLATED] if method == "dot" else [NEEDS_ONEDNN] if method == "onednn" else []


PARAMS = [pytest.param(c, k, m, id=f"{m}-{c.id}-k{'x'.join(map(str, k))}", marks=_marks(m))
          for c, k in CASES for m in ALL if _applies(m, c, k)]


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
