"""Every validation error of jaxconv.max_pool: each bad call raises before any computation,
with a message that starts with the op's name, names the argument and states expected vs got."""

from __future__ import annotations

import re

import numpy as np
import pytest

import jaxconv
from tests.support import helpers as h

X = np.ones((2, 4, 4, 1), np.float32)  # NHWC
pool = jaxconv.max_pool

CASES = [
    # (id, thunk, exception, [substrings that must appear])
    ("inputs-not-array", lambda: pool([1.0], 2), TypeError,
     ["max_pool: inputs must be a jax.Array or numpy.ndarray, got list"]),
    ("inputs-int-dtype", lambda: pool(np.ones((2, 4, 4, 1), np.int32), 2), TypeError,
     ["max_pool: inputs must have a floating dtype", "got int32"]),
    ("inputs-rank", lambda: pool(np.ones((4, 4), np.float32), 2), ValueError,
     ["max_pool: inputs must have rank >= 3", "got rank 2"]),
    ("window-none", lambda: pool(X, None), TypeError,
     ["max_pool: window_shape must be an int or a sequence of ints, got None"]),
    ("window-length", lambda: pool(X, (2, 2, 2)), ValueError,
     ["max_pool: window_shape must have 2 value(s), one per spatial axis, got 3"]),
    ("window-zero", lambda: pool(X, 0), ValueError,
     ["max_pool: window_shape must be positive, got [0, 0]"]),
    ("stride-zero", lambda: pool(X, 2, (1, 0)), ValueError,
     ["max_pool: strides must be positive, got [1, 0]"]),
    ("padding-unknown", lambda: pool(X, 2, padding="FULL"), ValueError,
     ["max_pool: padding must be 'VALID', 'SAME' or a sequence of (low, high) pairs, "
      "got 'FULL'"]),
    ("padding-length", lambda: pool(X, 2, padding=((1, 1),)), ValueError,
     ["max_pool: padding must have 2 (low, high) pair(s), one per spatial axis, got 1"]),
    ("padding-negative", lambda: pool(X, 2, padding=((1, -1), (0, 0))), ValueError,
     ["max_pool: padding must be >= 0, got [(1, -1), (0, 0)]"]),
    ("padding-pair-kind", lambda: pool(X, 2, padding=((1, 1.5), (0, 0))), TypeError,
     ["max_pool: padding must hold (low, high) pairs of ints, got (1, 1.5)"]),
    ("padding-kind", lambda: pool(X, 2, padding=3), TypeError,
     ["max_pool: padding must be a string or a sequence of (low, high) pairs, got int"]),
    ("spatial-window-past-input", lambda: pool(X, (5, 5)), ValueError,
     ["max_pool: the padded input must hold at least one window on every spatial axis: "
      "input [4, 4]"]),
    ("format-unknown", lambda: pool(X, 2, data_format="NHWC"), ValueError,
     ["max_pool: data_format must be one of 'NXC', 'NCX', got 'NHWC'"]),
]
OPS = re.compile(r"^max_pool: ")


@pytest.mark.parametrize("thunk,exc,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(no_compute, thunk, exc, parts):
    h.check_bad_input(thunk, exc, parts, OPS)
