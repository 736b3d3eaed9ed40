"""The DSL's checks of conv2d_backprop_filter, and the layout helpers' errors."""

from __future__ import annotations

import re

import jax.numpy as jnp
import pytest

import jaxconv
from jaxconv import tbe
from tests.support import helpers as h

X5 = jnp.ones((1, 1, 7, 7, 16), jnp.float16)
DY5 = jnp.ones((1, 1, 7, 7, 16), jnp.float16)
FS = (16, 16, 1, 1)
PARA = {"strides": [1, 1], "padding": [0, 0, 0, 0], "dilations": [1, 1, 1, 1]}
op = jaxconv.conv2d_backprop_filter


def para(**kw):
    return dict(PARA, **kw)


CASES = [
    ("c0", lambda: op(jnp.ones((1, 2, 7, 7, 8), jnp.float16), DY5, FS, PARA), ValueError,
     ["conv2d_backprop_filter: input_x must have C0 = 16 (its last axis), got C0 = 8"]),
    ("c0-dy", lambda: op(X5, jnp.ones((1, 1, 7, 7, 32), jnp.float16), FS, PARA), ValueError,
     ["out_backprop must have C0 = 16"]),
    ("rank", lambda: op(jnp.ones((1, 16, 7, 7), jnp.float16), DY5, FS, PARA), ValueError,
     ["input_x must be 5HD (N, C1, H, W, C0), got rank 4"]),
    ("c1-input", lambda: op(X5, DY5, (16, 17, 1, 1), PARA), ValueError,
     ["input_x C1 must be ceil(groups * Cin/groups = 1 * 17 = 17 / 16) = 2, got C1 = 1"]),
    ("c1-groups", lambda: op(X5, DY5, (16, 16, 1, 1), para(groups=2)), ValueError,
     ["input_x C1 must be ceil(groups * Cin/groups = 2 * 16 = 32 / 16) = 2"]),
    ("c1-out", lambda: op(X5, DY5, (20, 16, 1, 1), PARA), ValueError,
     ["out_backprop C1 must be ceil(Cout = 20 / 16) = 2, got C1 = 1"]),
    ("cout-groups", lambda: op(X5, DY5, (15, 16, 1, 1), para(groups=2)), ValueError,
     ["Cout = filter_sizes[0] = 15 must be divisible by groups (2)"]),
    ("ho", lambda: op(X5, DY5, (16, 16, 3, 3), PARA), ValueError,
     ["out_backprop spatial shape must equal the forward output size [5, 5]", "got [7, 7]"]),
    ("ho-stride", lambda: op(X5, DY5, FS, para(strides=[2, 1])), ValueError,
     ["forward output size [4, 7]", "got [7, 7]"]),
    ("dilations-form", lambda: op(X5, DY5, FS, para(dilations=[2, 1, 1, 1])), ValueError,
     ["para_dict['dilations'] must be [1, 1, dH, dW] (N and C entries 1), got [2, 1, 1, 1]"]),
    ("dilations-length", lambda: op(X5, DY5, FS, para(dilations=[1, 1])), ValueError,
     ["para_dict['dilations'] must have 4 value(s)"]),
    ("strides-length", lambda: op(X5, DY5, FS, para(strides=[1, 1, 1, 1])), ValueError,
     ["para_dict['strides'] must have 2 value(s)"]),
    ("strides-zero", lambda: op(X5, DY5, FS, para(strides=[0, 1])), ValueError,
     ["para_dict['strides'] must be positive, got [0, 1]"]),
    ("padding-length", lambda: op(X5, DY5, FS, para(padding=[0, 0])), ValueError,
     ["para_dict['padding'] must have 4 value(s)"]),
    ("padding-negative", lambda: op(X5, DY5, FS, para(padding=[0, -1, 0, 0])), ValueError,
     ["para_dict['padding'] must be >= 0"]),
    ("res-dtype", lambda: op(X5, DY5, FS, para(res_dtype="int8")), ValueError,
     ["para_dict['res_dtype'] must be 'float32' or 'float16', got 'int8'"]),
    ("missing-key", lambda: op(X5, DY5, FS, {"strides": [1, 1], "padding": [0, 0, 0, 0]}),
     ValueError, ["para_dict is missing the key(s) ['dilations']"]),
    ("unknown-key", lambda: op(X5, DY5, FS, para(pads=[0, 0])), ValueError,
     ["para_dict has an unknown key 'pads'"]),
    ("para-kind", lambda: op(X5, DY5, FS, [1, 1]), TypeError, ["para_dict must be a dict, got list"]),
    ("kernel-name", lambda: op(X5, DY5, FS, para(kernel_name=3)), TypeError,
     ["para_dict['kernel_name'] must be a string, got 3"]),
    ("groups-zero", lambda: op(X5, DY5, FS, para(groups=0)), ValueError, ["groups must be >= 1"]),
    ("filter-sizes-length", lambda: op(X5, DY5, (16, 16, 1), PARA), ValueError,
     ["filter_sizes must be 4 positive ints (Cout, Cin/groups, KH, KW), got [16, 16, 1]"]),
    ("dtype-mismatch", lambda: op(X5, DY5.astype(jnp.float32), FS, PARA), TypeError,
     ["input_x, out_backprop must have the same dtype"]),
    ("dtype-int", lambda: op(X5.astype(jnp.int8), DY5.astype(jnp.int8), FS, PARA), TypeError,
     ["input_x must have a floating dtype"]),
    ("batch", lambda: op(X5, jnp.ones((2, 1, 7, 7, 16), jnp.float16), FS, PARA), ValueError,
     ["input_x and out_backprop must have the same batch size, got 1 and 2"]),
    # layout helpers
    ("to5hd-rank", lambda: tbe.to_5hd(jnp.ones((2, 3, 4))), ValueError,
     ["to_5hd: x_nchw must have rank 4"]),
    ("to5hd-c0", lambda: tbe.to_5hd(jnp.ones((1, 2, 3, 3)), c0=0), ValueError,
     ["to_5hd: c0 must be a positive int"]),
    ("from5hd-channels", lambda: tbe.from_5hd(X5, 17), ValueError,
     ["from_5hd: channels must satisfy (C1 - 1) * C0 < channels <= C1 * C0 = 16"]),
    ("fz-groups", lambda: tbe.to_fractal_z(jnp.ones((6, 3, 1, 1)), 4), ValueError,
     ["to_fractal_z: Cout = filter_sizes[0] = 6 must be divisible by groups (4)"]),
    ("fz-shape", lambda: tbe.from_fractal_z(jnp.ones((1, 1, 16, 16)), (16, 32, 1, 1)), ValueError,
     ["from_fractal_z: wz must have the FRACTAL_Z shape [1, 2, 16, 16]"]),
    ("fz-kind", lambda: tbe.from_fractal_z([[1.0]], (16, 16, 1, 1)), TypeError,
     ["from_fractal_z: wz must be a jax.Array"]),
    ("lowering-inapplicable", lambda: op(X5, DY5, FS, PARA, lowering="feature_group"), ValueError,
     ["conv2d_backprop_filter: lowering='feature_group' does not apply to this problem: "
      "'feature_group' regroups a grouped problem, got groups=1"]),
]
OPS = re.compile(r"^(conv2d_backprop_filter|to_5hd|from_5hd|to_fractal_z|from_fractal_z): ")


@pytest.mark.parametrize("thunk,exc,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(no_compute, thunk, exc, parts):
    h.check_bad_input(thunk, exc, parts, OPS)
