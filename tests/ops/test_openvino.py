"""The OpenVINO family against the OpenVINO runtime, jax.vjp and a numpy loop.

A declarative matrix: spatial rank 1/2/3 x groups (G=1, G=2, depthwise) x
geometries (explicit asymmetric pads with output_padding, strides and
dilations, output_padding past the stride, same_upper/same_lower with an
output_shape and odd totals, same_* without output_shape, valid with a
zero-filled tail, explicit pads as the crop offset). Each case compares

* ``group_convolution_backprop_data(..., openvino_runtime_padding=True)`` with
  the OpenVINO runtime (``tests/support/openvino_oracle.py``);
* the default (the seed's split) with the runtime-parity result wherever no
  same_* total is odd, and with ``jax.vjp`` of ``jaxconv.group_convolution``
  w.r.t. its data wherever the implied forward convolution exists.

The pads and sizes the references use are computed here, independently of
``jaxconv._src.geometry``.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h
from tests.support import openvino_oracle as ovo

HIGHEST = lax.Precision.HIGHEST
SPATIAL = {1: (5,), 2: (4, 3), 3: (3, 3, 2)}
KERNEL = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}
GROUPS = {"G1": (1, 3, 2), "G2": (2, 2, 3), "depthwise": (4, 1, 1)}  # G, C_IN, C_OUT


def _full(rank, s, d):
    return [si * (i - 1) + (k - 1) * di + 1
            for i, k, si, di in zip(SPATIAL[rank], KERNEL[rank], s, d)]


# name -> (attrs, output_shape as a function of (full sizes) or None)
GEOMETRIES = {
    "explicit_asym_outpad": (dict(strides=(2, 1, 2), pads_begin=(1, 0, 1), pads_end=(0, 1, 0),
                                  output_padding=(1, 0, 1)), None),
    "stride_dil": (dict(strides=(2, 3, 1), dilations=(2, 1, 2), pads_begin=(1, 1, 0),
                        pads_end=(1, 0, 1), auto_pad="EXPLICIT"), None),
    "outpad_past_stride": (dict(strides=(1, 2, 1), output_padding=(2, 3, 1)), None),
    "same_upper_oshape_odd": (dict(strides=(2, 2, 1), auto_pad="same_upper"),
                              lambda full: [f - 1 - (j % 2) for j, f in enumerate(full)]),
    "same_lower_oshape_dil": (dict(strides=(1, 2, 2), dilations=(2, 1, 1), auto_pad="SAME_LOWER",
                                   output_padding=(0, 1, 0)),
                              lambda full: [f - 2 + (j % 2) for j, f in enumerate(full)]),
    "same_upper_no_oshape": (dict(strides=(2, 1, 2), pads_begin=(9, 9, 9), pads_end=(9, 9, 9),
                                  auto_pad="same_upper"), None),
    "valid_oshape_tail": (dict(strides=(2, 1, 1), auto_pad="valid", pads_begin=(1, 1, 1)),
                          lambda full: [f + 2 for f in full]),
    "explicit_oshape_crop": (dict(strides=(2, 2, 1), pads_begin=(1, 2, 1), pads_end=(5, 5, 5)),
                             lambda full: [max(1, f - 3) for f in full]),
}


@dataclasses.dataclass(frozen=True)
class Case:
    rank: int
    groups_name: str
    geometry: str

    @property
    def id(self) -> str:
        return f"{self.rank}d-{self.groups_name}-{self.geometry}"

    @property
    def attrs(self) -> dict:
        attrs, _ = GEOMETRIES[self.geometry]
        return {k: (v[: self.rank] if isinstance(v, tuple) else v) for k, v in attrs.items()}

    def _sd(self):
        a = self.attrs
        return a.get("strides", (1,) * self.rank), a.get("dilations", (1,) * self.rank)

    @property
    def output_shape(self):
        _, fn = GEOMETRIES[self.geometry]
        return None if fn is None else tuple(fn(_full(self.rank, *self._sd())))

    def reference_geometry(self, runtime: bool):
        """(pads_begin, output size, odd same_* total?) of SEMANTICS.md section 3."""
        a, n = self.attrs, self.rank
        s, d = self._sd()
        mode = a.get("auto_pad", "explicit").lower()
        op = a.get("output_padding", (0,) * n)
        full = _full(n, s, d)
        if self.output_shape is None:
            pb = a.get("pads_begin", (0,) * n) if mode == "explicit" else (0,) * n
            pe = a.get("pads_end", (0,) * n) if mode == "explicit" else (0,) * n
            return list(pb), [f - b - e + o for f, b, e, o in zip(full, pb, pe, op)], False
        out = list(self.output_shape)
        if mode == "explicit":
            return list(a["pads_begin"]), out, False
        if mode == "valid":
            return [0] * n, out, False
        pb, odd = [], False
        for f, o, opd in zip(full, out, op):
            total = max(0, f - o + opd)
            odd |= total % 2 == 1
            small, big = total // 2, total - total // 2
            upper = mode == "same_upper"
            pb.append((big if runtime else small) if upper else (small if runtime else big))
        return pb, out, odd

    def make(self, seed=0, dtype=jnp.float32):
        g, ci, co = GROUPS[self.groups_name]
        rng = np.random.default_rng(seed)
        x = h.random(rng, (2, g * ci, *SPATIAL[self.rank]), dtype)
        w = h.random(rng, (g, ci, co, *KERNEL[self.rank]), dtype)
        return x, w


MATRIX = [Case(*c) for c in itertools.product((1, 2, 3), tuple(GROUPS), tuple(GEOMETRIES))]


def _gcbd(case: Case, x, w, **kw):
    return jaxconv.group_convolution_backprop_data(x, w, case.output_shape, **case.attrs, **kw)


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: c.id)
def test_matrix_against_openvino_and_vjp(case: Case):
    x, w = case.make()
    ours_rt = _gcbd(case, x, w, openvino_runtime_padding=True, precision=HIGHEST)
    ours = _gcbd(case, x, w, precision=HIGHEST)
    pb, out, odd = case.reference_geometry(runtime=False)
    assert list(ours.shape[2:]) == out and ours.shape == ours_rt.shape

    # 1. The OpenVINO runtime (its own split of odd totals).
    ref = ovo.group_convolution_backprop_data(np.asarray(x), np.asarray(w), case.attrs,
                                              case.output_shape)
    h.assert_close(ours_rt, ref, jnp.float32)

    # 2. The seed's split equals the runtime's unless a same_* total is odd.
    if not odd:
        np.testing.assert_array_equal(ours, ours_rt)

    # 3. An independent numpy loop with the seed's pads.
    s, d = case._sd()
    h.assert_close(ours, h.numpy_group_conv_transpose(h.to_f64(x), h.to_f64(w), s, d, pb, out),
                   jnp.float32)

    # 4. jax.vjp of group_convolution w.r.t. its data, where the forward exists: the
    #    same filters read as GroupConvolution [G, C_OUT, C_IN, *K] take the G*C_OUT-channel
    #    output back to G*C_IN channels with pads (pb, pe'), pe' = full - pb - O.
    full = _full(case.rank, s, d)
    pe = [f - b - o for f, b, o in zip(full, pb, out)]
    if min(pe) >= 0:
        z = jnp.zeros(ours.shape, jnp.float32)
        _, vjp = jax.vjp(lambda z: jaxconv.group_convolution(
            z, w, strides=s, dilations=d, pads_begin=pb, pads_end=pe, precision=HIGHEST), z)
        h.assert_close(ours, vjp(x)[0], jnp.float32)


@pytest.mark.parametrize("case", MATRIX[::3], ids=lambda c: c.id)
def test_convolution_backprop_data_is_the_one_group_case(case: Case):
    g, ci, co = GROUPS[case.groups_name]
    rng = np.random.default_rng(3)
    x = h.random(rng, (2, ci, *SPATIAL[case.rank]))
    w = h.random(rng, (ci, co, *KERNEL[case.rank]))
    got = jaxconv.convolution_backprop_data(x, w, case.output_shape, **case.attrs,
                                            openvino_runtime_padding=True, precision=HIGHEST)
    ref = ovo.convolution_backprop_data(np.asarray(x), np.asarray(w), case.attrs,
                                        case.output_shape)
    h.assert_close(got, ref, jnp.float32)
    np.testing.assert_array_equal(
        got, jaxconv.group_convolution_backprop_data(
            x, w[None], case.output_shape, **case.attrs, openvino_runtime_padding=True,
            precision=HIGHEST))


FORWARD_CASES = [
    (1, dict(strides=2, pads_begin=1, pads_end=0)),
    (2, dict(strides=(2, 1), dilations=(1, 2), auto_pad="same_upper")),
    (3, dict(auto_pad="SAME_LOWER", strides=(1, 2, 2))),
    (2, dict(auto_pad="valid", strides=3)),
]


@pytest.mark.parametrize("rank,attrs", FORWARD_CASES)
@pytest.mark.parametrize("groups_name", tuple(GROUPS))
def test_group_convolution_against_openvino(rank, attrs, groups_name):
    g, ci, co = GROUPS[groups_name]
    rng = np.random.default_rng(5)
    x = h.random(rng, (2, g * ci, *(s + 3 for s in SPATIAL[rank])))
    w = h.random(rng, (g, co, ci, *KERNEL[rank]))
    got = jaxconv.group_convolution(x, w, **attrs, precision=HIGHEST)
    h.assert_close(got, ovo.group_convolution(np.asarray(x), np.asarray(w), attrs), jnp.float32)


# ---- dtypes ------------------------------------------------------------------

DTYPE_CASES = [Case(2, "G2", "same_upper_oshape_odd"), Case(1, "depthwise", "stride_dil"),
               Case(3, "G1", "valid_oshape_tail")]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", DTYPE_CASES, ids=lambda c: c.id)
def test_float_dtypes(case: Case, dtype):
    with jax.enable_x64(dtype == "float64"):
        x, w = case.make(seed=4, dtype=jnp.dtype(dtype))
        got = _gcbd(case, x, w, precision=HIGHEST)
        assert got.dtype == jnp.dtype(dtype)
        pb, out, _ = case.reference_geometry(runtime=False)
        s, d = case._sd()
        h.assert_close(got, h.numpy_group_conv_transpose(h.to_f64(x), h.to_f64(w), s, d, pb, out),
                       dtype)


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "int16"])
@pytest.mark.parametrize("case", DTYPE_CASES, ids=lambda c: c.id)
def test_integer_dtypes_are_exact(case: Case, dtype):
    g, ci, co = GROUPS[case.groups_name]
    rng = np.random.default_rng(6)
    low = 0 if dtype.startswith("u") else -3
    x = rng.integers(low, 4, (2, g * ci, *SPATIAL[case.rank])).astype(dtype)
    w = rng.integers(low, 4, (g, ci, co, *KERNEL[case.rank])).astype(dtype)
    got = _gcbd(case, x, w)
    assert got.dtype == np.dtype(dtype)
    pb, out, _ = case.reference_geometry(runtime=False)
    s, d = case._sd()
    want = h.numpy_group_conv_transpose(x, w, s, d, pb, out)
    np.testing.assert_array_equal(got, want.astype(dtype))  # small values: no wrap
    wide = _gcbd(case, x, w, preferred_element_type=jnp.int32)
    assert wide.dtype == jnp.int32
    np.testing.assert_array_equal(wide, want)


def test_narrow_integers_accumulate_wide():
    """int8 products summed past 127 are exact in the int32 accumulator."""
    x = np.full((1, 1, 8), 100, np.int8)
    w = np.full((1, 1, 1, 3), 100, np.int8)
    wide = jaxconv.group_convolution_backprop_data(x, w, preferred_element_type=jnp.int32)
    np.testing.assert_array_equal(wide[0, 0], [10000, 20000] + [30000] * 6 + [20000, 10000])
