"""The CPU table's choice checked against XLA's own program by timing (lowering/measured.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import measured
from tests import helpers as h

DN = ("NHWC", "HWIO", "NHWC")


def _conv(x, w):
    return jaxconv.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=(2, 2),
                                        dimension_numbers=DN, precision=lax.Precision.HIGHEST)


def _operands():
    rng = np.random.default_rng(0)
    return h.random(rng, (2, 9, 9, 8)), h.random(rng, (3, 3, 8, 16))


def test_xla_program_is_taken_where_it_ran_faster(measuring, monkeypatch):
    timed = []

    def fake(kernel, p, methods, *args):  # (..., dtype, precision, type, run)
        timed.append((kernel, methods))
        return {methods[0]: 2.0, methods[1]: 1.0}  # XLA's own program faster

    monkeypatch.setattr(measured, "_median_times", fake)
    x, w = _operands()
    want = lax.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=(2, 2),
                                    dimension_numbers=DN, precision=lax.Precision.HIGHEST)
    text = jax.jit(lambda x, w: _conv(x, w) + 0).lower(x, w).as_text()
    assert timed and timed[0][0] is Kernel.FORWARD and timed[0][1][1] == "conv"
    assert "jaxconv_onednn" not in text and "convolution" in text
    h.assert_close(jax.jit(_conv)(x, w), want, jnp.float32)
    assert set(measured._disk().values()) == {"conv"} and measured._cache_file().exists()


def test_the_tables_method_stays_where_it_ran_faster_and_verdicts_are_reused(measuring,
                                                                              monkeypatch):
    x, w = _operands()
    jax.jit(lambda x, w: _conv(x, w) + 1).lower(x, w)  # really timed, here (a new program)
    verdicts = dict(measured._VERDICTS)
    assert len(verdicts) == 1 and set(verdicts.values()) <= {"conv", "onednn", "dot", "grid"}

    def never(*args):
        raise AssertionError("timed again")

    monkeypatch.setattr(measured, "_median_times", never)
    monkeypatch.setattr(measured, "_VERDICTS", {})  # a later process: the disk cache
    measured._disk.cache_clear()
    jax.jit(lambda x, w: _conv(x, w) * 2).lower(x, w)
    assert measured._VERDICTS == verdicts


def test_large_problems_and_switched_off_keep_the_table(measuring, monkeypatch):
    monkeypatch.setattr(measured, "_median_times", lambda *a: pytest.fail("timed"))
    monkeypatch.setattr(measured, "MEASURE_MAX_MACS", 10)
    x, w = _operands()
    jax.jit(lambda x, w: _conv(x, w) + 3).lower(x, w)
    monkeypatch.setattr(measured, "MEASURE_MAX_MACS", 2 ** 25)
    monkeypatch.setattr(measured, "enabled", lambda: False)
    jax.jit(lambda x, w: _conv(x, w) + 4).lower(x, w)
    assert measured._VERDICTS == {}


def test_each_timed_call_follows_an_untimed_call_of_its_own_method():
    # timed call by call in turn, oneDNN's batch chunks ran in the wake of Winograd's OpenMP
    # team at half speed (measured._TIMING)
    methods = ("winograd_4x4", "winograd_2x2", "onednn")
    for r in range(4):
        calls = measured._round(methods, r)
        assert [m for m, timed in calls if timed] == list(methods if r % 2 == 0 else methods[::-1])
        for i, (m, timed) in enumerate(calls):
            assert timed == (i > 0 and calls[i - 1] == (m, False))


@pytest.mark.parametrize("times, want", [
    # the 2x2 tile 10% faster than the 4x4 one (which multiplies least): within the margin
    ({"winograd_4x4": 1.0, "winograd_2x2": 0.9, "onednn": 2.0}, "winograd_4x4"),
    # 20% faster: taken
    ({"winograd_4x4": 1.0, "winograd_2x2": 0.8, "onednn": 2.0}, "winograd_2x2"),
    # oneDNN faster than the kept tile, though not than the other tile
    ({"winograd_4x4": 1.0, "winograd_2x2": 0.9, "onednn": 0.95}, "onednn"),
    # a tie with oneDNN: the tile
    ({"winograd_4x4": 1.0, "winograd_2x2": 1.2, "onednn": 1.0}, "winograd_4x4"),
])
def test_a_winograd_tile_other_than_the_fewest_products_one_needs_a_clear_lead(times, want):
    assert measured._winograd_verdict(times, "winograd_4x4") == want


@pytest.mark.parametrize("onednn, want", [
    (1.05, "onednn"),        # the tile 5% faster: within the margin
    (1.0, "onednn"),         # a tie
    (1.2, "winograd_4x4"),   # 17% faster: taken
])
def test_winograd_needs_a_clear_lead_over_onednn_on_bfloat16(onednn, want):
    times = {"winograd_4x4": 1.0, "winograd_2x2": 1.3, "onednn": onednn}
    assert measured._winograd_verdict(times, "winograd_4x4",
                                      measured.WINOGRAD_BFLOAT16_MARGIN) == want
    assert measured._winograd_verdict(times, "winograd_4x4") == "winograd_4x4"


@pytest.mark.parametrize("dtype, want", [(jnp.float32, "jaxconv_winograd_forward"),
                                         (jnp.bfloat16, "jaxconv_onednn_forward")])
def test_auto_takes_onednn_over_a_small_winograd_lead_on_bfloat16(measuring, monkeypatch,
                                                                   dtype, want):
    from jaxconv._src.onednn import library
    if np.dtype(dtype).name not in library.status().dtypes:  # e.g. an AVX2-only CPU
        pytest.skip(f"this CPU's oneDNN does not compute {np.dtype(dtype).name}: the table "
                    f"takes neither Winograd nor oneDNN")

    def fake(kernel, p, methods, *args):  # the 4x4 tile 5% ahead of oneDNN
        return {m: 1.0 if m == "winograd_4x4" else 1.05 for m in methods}

    monkeypatch.setattr(measured, "_median_times", fake)
    x, w = jnp.ones((8, 14, 14, 64), dtype), jnp.ones((3, 3, 64, 64), dtype)
    text = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1)).lower(
        x, w).as_text()
    assert want in text


def test_auto_keeps_the_tile_that_multiplies_least_against_a_small_lead(measuring, monkeypatch):
    timed = []

    def fake(kernel, p, methods, *args):  # (..., dtype, precision, type, run, seconds)
        timed.append(methods)
        return {m: 0.95 if m == "winograd_2x2" else 1.0 if m.startswith("winograd") else 2.0
                for m in methods}

    monkeypatch.setattr(measured, "_median_times", fake)
    x, w = jnp.ones((8, 10, 10, 64)), jnp.ones((3, 3, 64, 64))
    text = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1)).lower(
        x, w).as_text()
    assert timed == [("winograd_4x4", "winograd_2x2", "onednn")]
    assert "jaxconv_winograd_forward" in text and "m = 4" in text
    assert set(measured._disk().values()) == {"winograd_4x4"}
