"""Every validation error of jaxconv.conv_general_dilated (the lax-signature entry point).

Each bad call raises before any computation, with a message that starts with the op's name, and
the exception type lax.conv_general_dilated raises for the same call where lax raises a
TypeError or ValueError (lax's unknown padding string is a RuntimeError and a list operand an
AttributeError: there jaxconv raises ValueError and TypeError).
"""

from __future__ import annotations

import re
import warnings

import jax.numpy as jnp
import pytest

import jaxconv
from tests.support import helpers as h

X = jnp.ones((2, 8, 8, 4))  # NHWC
W = jnp.ones((3, 3, 4, 6))  # HWIO
DN = ("NHWC", "HWIO", "NHWC")
conv = jaxconv.conv_general_dilated

CASES = [
    # (id, thunk, exception, [substrings that must appear])
    ("channels", lambda: conv(X, jnp.ones((3, 3, 5, 6)), (1, 1), "SAME", dimension_numbers=DN),
     ValueError, ["conv_general_dilated: rhs [3, 3, 5, 6]"]),
    ("padding-unknown", lambda: conv(X, W, (1, 1), "FULL", dimension_numbers=DN), ValueError,
     ["conv_general_dilated: padding must be 'SAME', 'SAME_LOWER', 'VALID' or a sequence of "
      "(low, high) pairs, got 'FULL'"]),
    ("padding-length", lambda: conv(X, W, (1, 1), [(1, 1)], dimension_numbers=DN), TypeError,
     ["conv_general_dilated: padding must hold 2 (low, high) pairs"]),
    ("stride-zero", lambda: conv(X, W, (0, 1), "SAME", dimension_numbers=DN), ValueError,
     ["conv_general_dilated: window_strides must be positive, got [0, 1]"]),
    ("dimension-numbers-format", lambda: conv(X, W, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO")),
     TypeError, ["conv_general_dilated: dimension_numbers ('NHWC', 'HWIO') do not fit lhs"]),
    ("lhs-not-array", lambda: conv([[1.0]], W, (1, 1), "SAME"), TypeError,
     ["conv_general_dilated: lhs must be a jax.Array or numpy.ndarray"]),
    ("rank-mismatch", lambda: conv(X, jnp.ones((3, 4, 6)), (1, 1), "SAME"), TypeError,
     ["conv_general_dilated: lhs and rhs must have the same rank >= 2"]),
    ("dtype-mismatch", lambda: conv(X, W.astype(jnp.float16), (1, 1), "SAME", dimension_numbers=DN),
     TypeError, ["conv_general_dilated: lhs, rhs must have the same dtype"]),
    ("string-pad-lhs-dilation", lambda: conv(X, W, (1, 1), "SAME", lhs_dilation=(2, 2),
                                             dimension_numbers=DN), ValueError,
     ["conv_general_dilated: string padding 'SAME' is not defined with lhs_dilation [2, 2]"]),
    ("groups-zero", lambda: conv(X, W, (1, 1), "SAME", dimension_numbers=DN,
                                 feature_group_count=0), ValueError,
     ["conv_general_dilated: groups must be >= 1, got 0"]),
]
OPS = re.compile(r"^conv_general_dilated: ")
#: where lax raises another type than TypeError/ValueError, jaxconv's own
LAX_ACCIDENTS = {"padding-unknown": RuntimeError, "lhs-not-array": AttributeError}


@pytest.mark.parametrize("thunk,exc,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(no_compute, thunk, exc, parts):
    h.check_bad_input(thunk, exc, parts, OPS)


@pytest.mark.parametrize("name,thunk,exc", [c[:3] for c in CASES], ids=[c[0] for c in CASES])
def test_lax_raises_the_same_type(name, thunk, exc):
    """The same call to lax.conv_general_dilated raises the type we raise (or lax's accident)."""
    import jax
    from jax import lax

    with warnings.catch_warnings(), pytest.raises(LAX_ACCIDENTS.get(name, exc)):
        warnings.simplefilter("ignore", RuntimeWarning)  # lax's shape rule on a zero stride
        jax.block_until_ready(_with(lax.conv_general_dilated, thunk)())


def _with(fn, thunk):
    """``thunk`` with ``conv`` bound to ``fn`` (the cases call the module-level ``conv``)."""
    import types
    return types.FunctionType(thunk.__code__, dict(thunk.__globals__, conv=fn), thunk.__name__,
                              thunk.__defaults__, thunk.__closure__)


#: the cases lax refuses only when it compiles (its shape rule lets a zero stride through)
COMPILE_TIME = {"stride-zero"}
ABSTRACT = [c[:2] for c in CASES if c[0] not in LAX_ACCIDENTS and c[0] not in COMPILE_TIME]


@pytest.mark.parametrize("name,thunk", ABSTRACT, ids=[c[0] for c in ABSTRACT])
def test_lax_message_comes_along(name, thunk):
    """Where lax refuses the call before compiling (its shape and type rules) with a TypeError
    or ValueError, our message holds lax's own text after ours, so that code matching lax's
    messages keeps working."""
    import jax
    from jax import lax

    with pytest.raises((TypeError, ValueError)) as theirs:
        jax.eval_shape(_with(lax.conv_general_dilated, thunk))
    with pytest.raises((TypeError, ValueError)) as ours:
        thunk()
    assert OPS.match(str(ours.value)), str(ours.value)
    assert str(theirs.value) in str(ours.value), (str(ours.value), str(theirs.value))
