"""The geometry module: auto_pad rules, output sizes, layouts, static shapes.

Includes oneDNN's own shape-inference unit tests (``onednn_graph_vectors.json``,
from ``tests/gtests/graph/unit/interface/test_op_schema_cpu.cpp``).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import geometry as geo
from tests.support import helpers as h

ONEDNN = h.load_vectors("onednn_graph_vectors.json")
SHAPES = ONEDNN["shape_inference_cases"]


def _cases(op):
    out = []
    for c in SHAPES:
        if c["op"] != op:
            continue
        if "results" in c:
            out += [(c, mode, r) for mode, r in c["results"].items()]
        else:
            out.append((c, c.get("auto_pad", "none"), {"dst": c.get("dst")}))
    return out


def _id(v):
    c, mode, _ = v
    return f"{c['test']}-{mode}"


@pytest.mark.parametrize("case_mode_result", _cases("Convolution"), ids=_id)
def test_onednn_convolution_shape_inference(case_mode_result):
    case, mode, result = case_mode_result
    for groups in ((1, 2, 4) if "groups" in case["test"] else (1,)):
        w = h.onednn_weights_shape(case, groups)
        p = geo.convolution_problem(
            "t", geo.Names(), x_shape=tuple(case["src"]), y_shape=None, w_shape=w,
            strides=case["strides"], pads_begin=case["pads_begin"], pads_end=case["pads_end"],
            dilations=case["dilations"], auto_pad=mode, groups=groups,
            data_format=case["data_format"], filter_format=case["weights_format"])
        assert list(p.y_shape) == result["dst"]
        if "pads_begin" in result:
            assert list(p.pads_begin) == result["pads_begin"]
            assert list(p.pads_end) == result["pads_end"]
        # and through the public op, without computing
        out = jax.eval_shape(
            lambda x, w: jaxconv.convolution(
                x, w, strides=case["strides"], pads_begin=case["pads_begin"],
                pads_end=case["pads_end"], dilations=case["dilations"], auto_pad=mode,
                groups=groups, data_format=case["data_format"],
                filter_format=case["weights_format"]),
            jax.ShapeDtypeStruct(case["src"], jnp.float32), jax.ShapeDtypeStruct(w, jnp.float32))
        assert list(out.shape) == result["dst"]


@pytest.mark.parametrize("case_mode_result", _cases("ConvTranspose"), ids=_id)
def test_onednn_conv_transpose_shape_rules(case_mode_result):
    """The deconv-style auto_pad rule and the transposed output size (OIX = (OC/g, IC, X))."""
    case, mode, result = case_mode_result
    n = len(case["src"]) - 2
    k = h.onednn_weights_shape(case)[2:] if case["weights_format"] == "OIX" else h.onednn_weights_shape(case)[:n]
    spatial = case["src"][2:] if case["data_format"] == "NCX" else case["src"][1:-1]
    m = geo.canonical_auto_pad("t", mode)
    pb, pe = geo.auto_pads(m, geo.PadRule.DECONV, spatial, k, case["strides"],
                           case["dilations"], case["pads_begin"] or (0,) * n,
                           case["pads_end"] or (0,) * n)
    op = case.get("output_padding") or (0,) * n
    out = [geo.conv_transpose_output_size(i, kk, s, d, b, e, o)
           for i, kk, s, d, b, e, o in zip(spatial, k, case["strides"], case["dilations"], pb, pe, op)]
    dst = result["dst"]
    assert out == (dst[2:] if case["data_format"] == "NCX" else dst[1:-1])
    if "pads_begin" in result:
        assert list(pb) == result["pads_begin"] and list(pe) == result["pads_end"]
    if "expected_pads_begin" in case:
        assert list(pb) == case["expected_pads_begin"] and list(pe) == case["expected_pads_end"]


@pytest.mark.parametrize("case", [c for c in SHAPES if c["op"] == "ConvolutionBackwardWeights"],
                         ids=lambda c: c["test"])
def test_onednn_backward_weights_shape(case):
    """oneDNN copies weights_shape through unchecked; jaxconv checks it.

    One upstream case labels an XIO shape (4, 4, 1, 1) as OIX: jaxconv gives the
    shape for XIO and a clear error for OIX (O=4 does not match diff_dst's 1 channel).
    """
    kw = dict(strides=case["strides"], pads_begin=case.get("pads_begin"),
              pads_end=case.get("pads_end"), dilations=case["dilations"],
              auto_pad=case["auto_pad"], data_format=case["data_format"])
    src = jax.ShapeDtypeStruct(case["src"], jnp.float32)
    dy = jax.ShapeDtypeStruct(case["diff_dst"], jnp.float32)
    shape = case["weights_shape_attr"]

    def run(fmt):
        return jax.eval_shape(lambda x, d: jaxconv.convolution_backward_weights(
            x, d, shape, weights_format=fmt, **kw), src, dy)

    n_in = case["src"][1]
    consistent = "XIO" if shape[-2] == n_in else "OIX"
    assert list(run(consistent).shape) == case["diff_weights"]
    if consistent != case["weights_format"]:
        with pytest.raises(ValueError, match=r"convolution_backward_weights: weights_shape"):
            run(case["weights_format"])


# ---- auto_pad, exhaustively on small sizes ---------------------------------


@pytest.mark.parametrize("mode", ["same_upper", "same_lower"])
def test_conv_same_gives_ceil_and_split(mode):
    for i, k, s, d in itertools.product(range(1, 12), range(1, 5), range(1, 5), range(1, 4)):
        (pb,), (pe,) = geo.auto_pads(mode, geo.PadRule.CONV, (i,), (k,), (s,), (d,), (0,), (0,))
        assert geo.conv_output_size(i, k, s, d, pb, pe) == math.ceil(i / s), (i, k, s, d)
        # the same pads as TF's SAME formula, written independently in tests/support/helpers.py
        ref_b, ref_e = h.same_pads((i,), (k,), (s,), (d,), upper=mode == "same_upper")
        assert (pb, pe) == (ref_b[0], ref_e[0])


@pytest.mark.parametrize("mode", ["same_upper", "same_lower"])
def test_deconv_same_rule(mode):
    for i, k, s, d in itertools.product(range(1, 8), range(1, 5), range(1, 4), range(1, 3)):
        (pb,), (pe,) = geo.auto_pads(mode, geo.PadRule.DECONV, (i,), (k,), (s,), (d,), (0,), (0,))
        dk = geo.dilated_kernel_size(k, d)
        assert pb + pe == max(0, dk - s)
        out = geo.conv_transpose_output_size(i, k, s, d, pb, pe)
        assert out == (i * s if dk >= s else s * (i - 1) + dk)


def test_valid_and_explicit():
    args = ((7, 7), (3, 3), (2, 1), (1, 2), (4, 1), (0, 3))
    assert geo.auto_pads("valid", geo.PadRule.CONV, *args) == ((0, 0), (0, 0))
    assert geo.auto_pads("explicit", geo.PadRule.CONV, *args) == ((4, 1), (0, 3))


# ---- layouts -----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_layouts_to_dimension_numbers(n):
    nxc = geo.data_layout("t", "data_format", "nxc", n)
    assert nxc.spec == (0, n + 1, *range(1, n + 1))
    ncx = geo.data_layout("t", "data_format", "NCX", n)
    assert ncx.spec == (0, 1, *range(2, n + 2))
    xio = geo.filter_layout("t", "f", "XIO", n, ("XIO", "OIX"))
    assert xio.spec() == (n + 1, n, *range(n))
    oix = geo.filter_layout("t", "f", "OIX", n, ("XIO", "OIX"))
    assert oix.spec() == (0, 1, *range(2, n + 2))
    allowed = ("IOX", "XOI", "OIX", "XIO")
    iox = geo.filter_layout("t", "f", "IOX", n, allowed)
    assert (iox.i_axis, iox.o_axis, iox.spatial_axes) == (0, 1, tuple(range(2, n + 2)))
    xoi = geo.filter_layout("t", "f", "XOI", n, allowed)
    assert (xoi.o_axis, xoi.i_axis, xoi.spatial_axes) == (n, n + 1, tuple(range(n)))
    # swap: the I letter becomes the convolution's output feature
    assert iox.spec(swap=True) == (0, 1, *range(2, n + 2))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_dimension_numbers_agree_with_lax_strings(n):
    """Our letter-by-letter dimension numbers equal lax's string form for the same layout."""
    sp = "DHW"[3 - n:]
    p = geo.convolution_problem(
        "t", geo.Names(), x_shape=(2, *(5,) * n, 4), y_shape=None, w_shape=(*(2,) * n, 4, 3),
        strides=None, pads_begin=None, pads_end=None, dilations=None, auto_pad="none",
        groups=1, data_format="NXC", filter_format="XIO")
    ref = lax.conv_dimension_numbers(p.x_shape, p.filter_shape,
                                     (f"N{sp}C", f"{sp}IO", f"N{sp}C"))
    assert p.dimension_numbers() == ref


# ---- static shapes and int tuples -------------------------------------------


@pytest.mark.parametrize("value", [(3, 3, 4, 6), [3, 3, 4, 6], np.array([3, 3, 4, 6]),
                                   np.array([3, 3, 4, 6], np.int32), jnp.array([3, 3, 4, 6])])
def test_static_shape_accepts(value):
    assert geo.static_shape("t", "filter_shape", value) == (3, 3, 4, 6)


def test_static_shape_rejects_traced():
    def f(s):
        return geo.static_shape("op", "filter_shape", s)

    with pytest.raises(TypeError, match="op: filter_shape must be a static value"):
        jax.jit(f)(jnp.array([1, 2]))


def test_int_tuple_broadcasts_and_defaults():
    assert geo.int_tuple("t", "strides", 2, 3, default=1, minimum=1) == (2, 2, 2)
    assert geo.int_tuple("t", "strides", None, 2, default=1, minimum=1) == (1, 1)
    assert geo.int_tuple("t", "pads_end", np.array([0, 2]), 2, default=0, minimum=0) == (0, 2)


@pytest.mark.parametrize("value,mode", [
    ("SAME", "same_upper"), ("same", "same_upper"), ("SAME_UPPER", "same_upper"),
    ("Same_Lower", "same_lower"), ("VALID", "valid"), ("none", "explicit"), ("None", "explicit"),
    ("explicit", "explicit"), ("NOTSET", "explicit"), (None, "explicit")])
def test_auto_pad_aliases(value, mode):
    """lax's and TensorFlow's spellings are accepted; every family's word for explicit pads."""
    from jaxconv._src.geometry.padding import canonical_auto_pad
    assert canonical_auto_pad("op", value) == mode
    assert canonical_auto_pad("op", value, "explicit") == mode


@pytest.mark.parametrize("value,explicit,suggestion", [
    ("same_uper", "none", "'same_upper'"), ("samelower", "none", "'same_lower'"),
    ("nnone", "none", "'none'"), ("explicitt", "explicit", "'explicit'"),
    ("explict", "none", "'none'"), ("valdi", "explicit", "'valid'")])
def test_auto_pad_typos_get_the_closest_value_in_the_family_vocabulary(value, explicit, suggestion):
    from jaxconv._src.geometry.padding import canonical_auto_pad
    with pytest.raises(ValueError, match=f"^op: auto_pad must be one of '{explicit}', .*got "
                                         f"'{value}'; did you mean {suggestion}\\?$"):
        canonical_auto_pad("op", value, explicit)
    with pytest.raises(ValueError) as e:
        canonical_auto_pad("op", "zzz", explicit)
    assert "did you mean" not in str(e.value)


# ---- output positions whose windows read only padding --------------------------------


def _padding_only_problem(i, k, s, d, pb, pe):
    return geo.convolution_problem(
        "t", geo.Names(), x_shape=(1, 1, i), y_shape=None, w_shape=(1, 1, k), strides=(s,),
        dilations=(d,),
        pads_begin=(pb,), pads_end=(pe,), auto_pad="explicit", groups=1, data_format="NCX",
        filter_format="OIX")


def test_padding_only_outputs_against_every_window():
    """Per output position, whether any tap lands on x (enumerated), against the leading and
    trailing counts; and the problem without them keeps every other window where it was."""
    checked = 0
    for i, k, s, d, pb, pe in itertools.product(range(1, 6), (1, 2, 3), (1, 2, 3), (1, 2),
                                                range(0, 7), range(0, 7)):
        if geo.conv_output_size(i, k, s, d, pb, pe) <= 0:
            continue
        p = _padding_only_problem(i, k, s, d, pb, pe)
        (o,) = p.output_size
        # by the window's span (a dilated window straddling x with no tap on it counts)
        reads = [j * s - pb + (k - 1) * d >= 0 and j * s - pb < i for j in range(o)]
        taps = [any(0 <= j * s - pb + t * d < i for t in range(k)) for j in range(o)]
        assert all(r for r, t in zip(reads, taps) if t)  # nothing left out reads x
        lead = next((j for j, r in enumerate(reads) if r), o)
        trail = 0 if lead == o else next(j for j, r in enumerate(reversed(reads)) if r)
        assert sum(reads) == o - lead - trail  # the positions that read x are contiguous
        if lead < o:
            assert p.padding_only_outputs == ((lead, trail),), (i, k, s, d, pb, pe)
        else:  # no window reads x: split between the two ends any way, all o of them
            assert sum(p.padding_only_outputs[0]) == o, (i, k, s, d, pb, pe)
        live = p.without_padding_only_outputs()
        (o2,) = live.output_size
        assert o2 == sum(reads)
        if o2:
            assert geo.conv_output_size(i, k, s, d, live.pads_begin[0], live.pads_end[0]) == o2
            for j in range(o2):  # window j of the new problem starts where window lead + j did
                assert j * s - live.pads_begin[0] == (lead + j) * s - pb
        checked += 1
    assert checked > 2000
