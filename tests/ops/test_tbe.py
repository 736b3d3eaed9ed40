"""Ascend TBE conv2d_backprop_filter and the 5HD / FRACTAL_Z layout helpers.

* the computed vector (numpy, following the DSL's index math);
* a matrix (strides, asymmetric pads, dilations, groups 1/2/4, channel counts
  that are not multiples of 16) against torch's weight gradient packed to
  FRACTAL_Z by an independent loop here, and against
  ``convolution_backprop_filters`` through ``jaxconv.tbe``'s helpers;
* float16 inputs with float32 and float16 results; garbage in padded channel
  slots never leaks; jit, vmap and grad; the helpers' round trips.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv import tbe
from tests.support import helpers as h
from tests.support import oracles
from tests.support.cases import pack_fractal_z_loop

VECTOR = h.load_vectors("computed_ascend_conv2d_backprop_filter.json")["cases"][0]




def to_5hd_loop(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    n, c, hh, ww = x.shape
    c1 = -(-c // 16)
    out = np.full((n, c1, hh, ww, 16), fill, x.dtype)
    for ch in range(c):
        out[:, ch // 16, :, :, ch % 16] = x[:, ch]
    return out


def test_computed_vector():
    call = VECTOR["dsl_call"]
    x5 = np.asarray(VECTOR["x_5hd_values"], np.float16).reshape(call["input_x_5hd_shape"])
    dy5 = np.asarray(VECTOR["out_backprop_5hd_values"], np.float16).reshape(
        call["out_backprop_5hd_shape"])
    got = jaxconv.conv2d_backprop_filter(x5, dy5, call["filter_sizes"], call["para_dict"])
    want = np.asarray(VECTOR["expected_dsl_result_fractal_z"]["values"], np.float32).reshape(
        VECTOR["expected_dsl_result_fractal_z"]["shape"])
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)
    dw = np.asarray(VECTOR["expected_dw_oihw"]["values"], np.float32).reshape(
        VECTOR["expected_dw_oihw"]["shape"])
    np.testing.assert_array_equal(tbe.from_fractal_z(got, call["filter_sizes"]), dw)
    # and the 5HD inputs are the NCHW ones, packed
    x = np.asarray(VECTOR["x_nchw"]["values"], np.float16).reshape(VECTOR["x_nchw"]["shape"])
    np.testing.assert_array_equal(tbe.to_5hd(x), x5)


# (id, N, Cin/g, Cout, groups, H, W, K, strides, padding [t, b, l, r], dilations [dH, dW])
MATRIX = [
    ("g1-c3-c20-pads", 2, 3, 20, 1, 6, 5, (2, 2), (1, 1), (1, 0, 0, 1), (1, 1)),
    ("g1-c17-c5-stride", 1, 17, 5, 1, 9, 8, (3, 3), (2, 3), (1, 1, 2, 0), (1, 1)),
    ("g1-c16-c16-dil", 2, 16, 16, 1, 8, 8, (3, 2), (1, 2), (2, 2, 1, 1), (2, 3)),
    ("g2-c3-c6", 2, 3, 6, 2, 7, 6, (3, 3), (2, 1), (1, 1, 1, 1), (1, 2)),
    ("g2-c8-c24-stride-dil", 1, 8, 24, 2, 9, 9, (2, 3), (3, 2), (0, 1, 1, 0), (2, 1)),
    ("g4-c5-c12", 2, 5, 12, 4, 6, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ("g4-c1-c4-depthwise", 2, 1, 4, 4, 8, 6, (3, 3), (2, 2), (1, 0, 1, 0), (1, 1)),
    ("g4-c20-c36", 1, 20, 36, 4, 5, 6, (1, 2), (1, 2), (0, 0, 1, 1), (1, 2)),
]


def _make(case, dtype=np.float16, seed=0):
    _, n, cin_g, cout, g, hh, ww, k, s, pad, d = case
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, (n, cin_g * g, hh, ww)).astype(dtype)
    ho = (hh + pad[0] + pad[1] - ((k[0] - 1) * d[0] + 1)) // s[0] + 1
    wo = (ww + pad[2] + pad[3] - ((k[1] - 1) * d[1] + 1)) // s[1] + 1
    dy = rng.integers(-3, 4, (n, cout, ho, wo)).astype(dtype)
    para = {"strides": list(s), "padding": list(pad), "dilations": [1, 1, *d], "groups": g,
            "res_dtype": "float32", "kernel_name": "k_" + case[0].replace("-", "_")}
    return x, dy, (cout, cin_g, *k), para


@pytest.mark.parametrize("case", MATRIX, ids=[c[0] for c in MATRIX])
def test_matrix_against_torch_and_convolution_backprop_filters(case):
    x, dy, sizes, para = _make(case)
    # garbage in the padded channel slots must not leak
    got = jaxconv.conv2d_backprop_filter(to_5hd_loop(x, fill=7.0), to_5hd_loop(dy, fill=-5.0),
                                         sizes, para)
    assert got.shape == tbe.fractal_z_shape(sizes, para["groups"]) and got.dtype == jnp.float32
    pad = para["padding"]
    _, _, dw_t = oracles.conv_all(
        x.astype(np.float64), np.zeros(sizes), dy.astype(np.float64),
        strides=para["strides"], dilations=para["dilations"][2:], pads_begin=(pad[0], pad[2]),
        pads_end=(pad[1], pad[3]), groups=para["groups"])
    np.testing.assert_array_equal(got, pack_fractal_z_loop(dw_t, para["groups"]))
    # the same through the layout helpers and the oneDNN op
    dw = jaxconv.convolution_backprop_filters(
        tbe.from_5hd(tbe.to_5hd(x.astype(np.float32)), x.shape[1]), dy.astype(np.float32), sizes,
        strides=para["strides"], pads_begin=(pad[0], pad[2]), pads_end=(pad[1], pad[3]),
        dilations=para["dilations"][2:], groups=para["groups"], data_format="NCX",
        filter_format="OIX", precision=lax.Precision.HIGHEST)
    np.testing.assert_array_equal(tbe.to_fractal_z(dw, para["groups"]), got)


def test_seed_example():
    rng = np.random.default_rng(1)
    fmap = jnp.asarray(rng.standard_normal((1, 1, 7, 7, 16)), jnp.float16)
    dy = jnp.asarray(rng.standard_normal((1, 1, 7, 7, 16)), jnp.float16)
    para = {"strides": [1, 1], "padding": [0, 0, 0, 0], "dilations": [1, 1, 1, 1], "groups": 1,
            "res_dtype": "float32",
            "kernel_name": "conv2d_backprop_filter_dx_1_1_7_7_16_dy_1_1_7_7_16_dw_16_16_1_1_s_1_1_p_SAME"}
    res = jaxconv.conv2d_backprop_filter(fmap, dy, (16, 16, 1, 1), para)
    assert res.shape == (1, 1, 16, 16) and res.dtype == jnp.float32
    # 1x1 kernel: dW[co, ci] = sum_{h,w} x[ci, h, w] dy[co, h, w], exactly in f32
    want = np.einsum("chw,ohw->oc", np.asarray(fmap[0, 0].transpose(2, 0, 1), np.float64),
                     np.asarray(dy[0, 0].transpose(2, 0, 1), np.float64))
    h.assert_close(res[0, 0], want, jnp.float32)


@pytest.mark.parametrize("res_dtype", ["float32", "float16"])
def test_float16_inputs_within_tolerance(res_dtype):
    """Random f16 inputs: the f32 result is within f32 accumulation error of float64
    (2e-5 relative); a float16 result is the f32 one rounded once (4e-3)."""
    case = MATRIX[4]
    _, n, cin_g, cout, g, hh, ww, k, s, pad, d = case
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, cin_g * g, hh, ww)).astype(np.float16)
    x5 = tbe.to_5hd(x)
    _, dy_int, sizes, para = _make(case)
    dy = rng.standard_normal(dy_int.shape).astype(np.float16)
    got = jaxconv.conv2d_backprop_filter(x5, tbe.to_5hd(dy), sizes,
                                         dict(para, res_dtype=res_dtype))
    assert got.dtype == np.dtype(res_dtype)
    _, _, dw_t = oracles.conv_all(
        x.astype(np.float64), np.zeros(sizes), dy.astype(np.float64), strides=s, dilations=d,
        pads_begin=(pad[0], pad[2]), pads_end=(pad[1], pad[3]), groups=g)
    h.assert_close(got, pack_fractal_z_loop(dw_t, g), res_dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_other_input_dtypes(dtype):
    x, dy, sizes, para = _make(MATRIX[3], dtype=np.float32)
    got = jaxconv.conv2d_backprop_filter(tbe.to_5hd(jnp.asarray(x, dtype)),
                                         tbe.to_5hd(jnp.asarray(dy, dtype)), sizes, para)
    ref = jaxconv.conv2d_backprop_filter(tbe.to_5hd(x.astype(np.float16)),
                                         tbe.to_5hd(dy.astype(np.float16)), sizes, para)
    np.testing.assert_array_equal(got, ref)  # small integers: exact in every dtype
    pad = para["padding"]
    _, _, dw_t = oracles.conv_all(
        x.astype(np.float64), np.zeros(sizes), dy.astype(np.float64), strides=para["strides"],
        dilations=para["dilations"][2:], pads_begin=(pad[0], pad[2]), pads_end=(pad[1], pad[3]),
        groups=para["groups"])
    np.testing.assert_array_equal(got, pack_fractal_z_loop(dw_t, para["groups"]))


def test_jit_vmap_grad():
    x, dy, sizes, para = _make(MATRIX[3], dtype=np.float32)
    x5, dy5 = tbe.to_5hd(x), tbe.to_5hd(dy)
    f = lambda a, b: jaxconv.conv2d_backprop_filter(a, b, sizes, para)  # noqa: E731
    np.testing.assert_array_equal(jax.jit(f)(x5, dy5), f(x5, dy5))
    stacked = jax.vmap(f)(jnp.stack([x5, 2 * x5]), jnp.stack([dy5, dy5]))
    np.testing.assert_array_equal(stacked[1], 2 * f(x5, dy5))
    # linear in input_x: the gradient of <f(x), c> w.r.t. x is f's transpose applied to c;
    # check it against the same gradient through the NCHW op and the layout helpers.
    c = jnp.asarray(np.random.default_rng(3).standard_normal(f(x5, dy5).shape), jnp.float32)
    gx = jax.grad(lambda a: jnp.sum(f(a, dy5) * c))(x5)

    def via_nchw(a):
        dw = jaxconv.convolution_backprop_filters(
            tbe.from_5hd(a, x.shape[1]), dy, sizes, strides=para["strides"],
            pads_begin=(1, 1), pads_end=(1, 1), dilations=para["dilations"][2:],
            groups=para["groups"], data_format="NCX", filter_format="OIX",
            precision=lax.Precision.HIGHEST)
        return jnp.sum(tbe.to_fractal_z(dw, para["groups"]) * c)

    h.assert_close(gx, jax.grad(via_nchw)(x5), jnp.float32)


# ---- layout helpers ------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3, 16, 17, 40])
def test_5hd_round_trip_and_loop(channels):
    x = np.random.default_rng(4).standard_normal((2, channels, 3, 4)).astype(np.float32)
    x5 = tbe.to_5hd(x)
    np.testing.assert_array_equal(x5, to_5hd_loop(x))
    np.testing.assert_array_equal(tbe.from_5hd(x5, channels), x)
    np.testing.assert_array_equal(jax.jit(tbe.to_5hd)(x), x5)
    np.testing.assert_array_equal(jax.vmap(tbe.to_5hd)(np.stack([x, x])), np.stack([x5, x5]))


@pytest.mark.parametrize("sizes,groups", [((20, 3, 2, 2), 1), ((6, 3, 3, 3), 2),
                                          ((12, 5, 1, 3), 4), ((4, 1, 3, 3), 4),
                                          ((36, 20, 2, 1), 4), ((32, 16, 1, 1), 2),
                                          ((48, 7, 2, 2), 3)])
def test_fractal_z_round_trip_and_loop(sizes, groups):
    w = np.random.default_rng(5).standard_normal(sizes).astype(np.float32)
    wz = tbe.to_fractal_z(w, groups)
    np.testing.assert_array_equal(wz, pack_fractal_z_loop(w, groups))
    np.testing.assert_array_equal(tbe.from_fractal_z(wz, sizes, groups), w)
    np.testing.assert_array_equal(jax.jit(tbe.to_fractal_z, static_argnums=1)(w, groups), wz)
    np.testing.assert_array_equal(
        jax.vmap(lambda a: tbe.from_fractal_z(a, sizes, groups))(np.stack([wz, 2 * wz])),
        np.stack([w, 2 * w]))
