"""The CPU table's choice checked against XLA's own program by timing (lowering/measured.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
import jaxconv.testing
from jaxconv._src import geometry
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import chooser, measured
from jaxconv._src.native import library
from tests.support import helpers as h

DN = ("NHWC", "HWIO", "NHWC")


def _conv(x, w):
    return jaxconv.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=(2, 2),
                                        dimension_numbers=DN, precision=lax.Precision.HIGHEST)


def _operands():
    rng = np.random.default_rng(0)
    return h.random(rng, (2, 9, 9, 8)), h.random(rng, (3, 3, 8, 16))


def test_xla_program_is_taken_where_it_ran_faster(measuring, monkeypatch):
    timed = []

    def fake(c, seconds):  # (..., dtype, precision, type, run)
        kernel, methods = c.kernel, tuple(c.calls)
        timed.append((kernel, methods))
        return {methods[0]: [2.0] * 7, methods[1]: [1.0] * 7}  # XLA's own program faster

    monkeypatch.setattr(measured, "_sample_times", fake)
    x, w = _operands()
    want = lax.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=(2, 2),
                                    dimension_numbers=DN, precision=lax.Precision.HIGHEST)
    text = jax.jit(lambda x, w: _conv(x, w) + 0).lower(x, w).as_text()
    assert timed and timed[0][0] is Kernel.FORWARD and timed[0][1][1] == "conv"
    assert "jaxconv_onednn" not in text and "convolution" in text
    h.assert_close(jax.jit(_conv)(x, w), want, jnp.float32)
    assert {r["verdict"] for r in measured._disk()["methods"].values()} == {"conv"}
    assert measured._cache_file().exists()
    (d,) = measured.decisions()
    assert (d.verdict, d.source, d.lead) == ("conv", "measured", 0.5) and d.rule != "conv"


def test_the_tables_method_stays_where_it_ran_faster_and_verdicts_are_reused(measuring,
                                                                              monkeypatch):
    x, w = _operands()
    jax.jit(lambda x, w: _conv(x, w) + 1).lower(x, w)  # really timed, here (a new program)
    verdicts = dict(measured._VERDICTS)
    assert len(verdicts) == 1 and set(verdicts.values()) <= {"conv", "onednn", "dot", "grid"}

    def never(*args):
        raise AssertionError("timed again")

    monkeypatch.setattr(measured, "_sample_times", never)
    monkeypatch.setattr(measured, "_VERDICTS", {})  # a later process: the disk cache
    monkeypatch.setattr(measured, "_DECISIONS", {})
    measured._disk.cache_clear()
    jax.jit(lambda x, w: _conv(x, w) * 2).lower(x, w)
    assert measured._VERDICTS == verdicts
    assert [d.source for d in measured.decisions()] == ["cache"]


def test_large_problems_and_switched_off_keep_the_table(measuring, monkeypatch):
    monkeypatch.setattr(measured, "_sample_times", lambda *a: pytest.fail("timed"))
    monkeypatch.setattr(chooser, "MEASURE_MAX_MACS", 10)
    x, w = _operands()
    jax.jit(lambda x, w: _conv(x, w) + 3).lower(x, w)
    monkeypatch.setattr(chooser, "MEASURE_MAX_MACS", 2 ** 25)
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


def _problem(batch=8, size=10, channels=64):
    """A 3x3 stride-1 problem whose tile that multiplies least is 4x4."""
    return geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(batch, size, size, channels), y_shape=None,
        w_shape=(3, 3, channels, channels), strides=1, pads_begin=1, pads_end=1, dilations=1,
        auto_pad="explicit", groups=1, data_format="NXC", filter_format="XIO")


def _samples(times, spread=0.0):
    """Seven samples of each median in ``times``, spread +-``spread`` (a fraction) around it."""
    return {m: [t * (1 + spread * k / 3) for k in range(-3, 4)] for m, t in times.items()}


def _winograd(times, dtype="float32", spread=0.0):
    p = _problem()
    contest = measured.Contest(Kernel.FORWARD, p, "winograd", np.dtype(dtype), None, None,
                               rule=chooser.rule(Kernel.FORWARD, p, "winograd", np.dtype(dtype)),
                               calls={}, fewest="winograd_4x4")
    return measured._verdict(_samples(times, spread), contest)["verdict"]


@pytest.mark.parametrize("times, want", [
    # the 2x2 tile 10% faster than the 4x4 one (which multiplies least): within the margin
    ({"winograd_4x4": 1.0, "winograd_2x2": 0.9, "onednn": 2.0}, "winograd"),
    # 20% faster: taken
    ({"winograd_4x4": 1.0, "winograd_2x2": 0.8, "onednn": 2.0}, "winograd_2x2"),
    # oneDNN faster than the kept tile beyond the margin, though not than the other tile
    ({"winograd_4x4": 1.0, "winograd_2x2": 0.9, "onednn": 0.95}, "onednn"),
    # oneDNN 2% faster: within the margin, the rule's tile stands
    ({"winograd_4x4": 1.0, "winograd_2x2": 1.2, "onednn": 0.98}, "winograd"),
    # a tie with oneDNN: the rule's
    ({"winograd_4x4": 1.0, "winograd_2x2": 1.2, "onednn": 1.0}, "winograd"),
    # XLA's own program (a small problem) faster than the verdict beyond the margin: taken
    ({"winograd_4x4": 1.0, "winograd_2x2": 1.2, "onednn": 0.9, "conv": 0.5}, "conv"),
    ({"winograd_4x4": 1.0, "winograd_2x2": 1.2, "onednn": 2.0, "conv": 0.5}, "conv"),
    # within the margin of the verdict: the verdict
    ({"winograd_4x4": 1.0, "winograd_2x2": 1.2, "onednn": 0.8, "conv": 0.78}, "onednn"),
    ({"winograd_4x4": 1.0, "winograd_2x2": 1.2, "onednn": 2.0, "conv": 0.98}, "winograd"),
])
def test_a_winograd_tile_other_than_the_fewest_products_one_needs_a_clear_lead(times, want):
    assert _winograd(times) == want


def test_a_lead_within_both_candidates_noise_leaves_the_rule():
    """oneDNN's median 10% below the tile's: taken where both time steadily, not where each
    one's samples spread by +-15% (interquartile half-range ~5% each, plus the margin)."""
    times = {"winograd_4x4": 1.0, "winograd_2x2": 1.3, "onednn": 0.9}
    assert _winograd(times) == "onednn"
    assert _winograd(times, spread=0.15) == "winograd"
    lead, need = measured._beats([0.9] * 7, [1.0] * 7, measured.CHALLENGER_MARGIN)
    assert lead == pytest.approx(0.1) and need == pytest.approx(measured.CHALLENGER_MARGIN)
    assert measured._noise([1.0, 1.0, 1.0, 1.2, 0.8, 1.1, 0.9]) > 0.04


@pytest.mark.parametrize("onednn, want", [
    (1.05, "onednn"),        # the tile 5% faster: within the margin
    (1.0, "onednn"),         # a tie
    (1.2, "winograd_4x4"),   # 17% faster: taken
])
def test_winograd_needs_a_clear_lead_over_onednn_on_bfloat16(onednn, want):
    times = {"winograd_4x4": 1.0, "winograd_2x2": 1.3, "onednn": onednn}
    assert chooser.rule(Kernel.FORWARD, _problem(), "winograd", jnp.bfloat16) == "onednn"
    assert _winograd(times, "bfloat16") == want
    assert _winograd(times) == "winograd"


@pytest.mark.parametrize("dtype, want", [(jnp.float32, "jaxconv_winograd_forward"),
                                         (jnp.bfloat16, "jaxconv_onednn_forward")])
def test_auto_takes_onednn_over_a_small_winograd_lead_on_bfloat16(measuring, monkeypatch,
                                                                   dtype, want):
    from jaxconv._src.native import library
    if np.dtype(dtype).name not in library.status().dtypes:  # e.g. an AVX2-only CPU
        pytest.skip(f"this CPU's oneDNN does not compute {np.dtype(dtype).name}: the table "
                    f"takes neither Winograd nor oneDNN")

    def fake(c, seconds):  # the 4x4 tile 5% ahead of oneDNN
        kernel, methods = c.kernel, tuple(c.calls)
        return _samples({m: 1.0 if m == "winograd_4x4" else 1.05 for m in methods})

    monkeypatch.setattr(measured, "_sample_times", fake)
    x, w = jnp.ones((8, 14, 14, 64), dtype), jnp.ones((3, 3, 64, 64), dtype)
    text = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1)).lower(
        x, w).as_text()
    assert want in text


def test_auto_keeps_the_tile_that_multiplies_least_against_a_small_lead(measuring, monkeypatch):
    timed = []

    def fake(c, seconds):  # (..., dtype, precision, type, run, seconds)
        kernel, methods = c.kernel, tuple(c.calls)
        timed.append(methods)
        return _samples({m: 0.95 if m == "winograd_2x2" else 1.0 if m.startswith("winograd")
                         else 2.0 for m in methods})

    monkeypatch.setattr(measured, "_sample_times", fake)
    x, w = jnp.ones((8, 10, 10, 64)), jnp.ones((3, 3, 64, 64))
    text = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1)).lower(
        x, w).as_text()
    # XLA's own too: a problem of at most MEASURE_MAX_MACS
    assert timed == [("winograd_4x4", "winograd_2x2", "onednn", "conv")]
    assert "jaxconv_winograd_forward" in text and "m = 4" in text
    assert {r["verdict"] for r in measured._disk()["methods"].values()} == {"winograd"}


@pytest.mark.skipif(not library.status().available, reason="the oneDNN handler is not built")
def test_layout_verdicts_are_kept_for_later_processes_and_measure_off_keeps_the_callers(
        measuring, layout_trial):
    """A first call's layout trial (source "trial") is stored by ``save_layouts``; after the
    handler forgets its primitives (as a new process starts), the remembered verdict is
    taken without a trial (source "cache"); with the trial off (``JAXCONV_MEASURE=0``) the
    caller's layouts are kept untimed (source "rule")."""
    rng = np.random.default_rng(5)
    x, w = h.random(rng, (3, 13, 11, 24)), h.random(rng, (3, 3, 24, 40))  # this test's own

    def conv(x, w):
        return jaxconv.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)

    def found():
        (c,) = [c for c in library.choices() if c["kernel"] == "forward"
                and c["x"] in (x.shape, (x.shape[0] // 2, *x.shape[1:]), (1, *x.shape[1:]))
                and c["w"] == w.shape]
        return c

    want = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN,
                                    precision=lax.Precision.HIGHEST)
    run = jax.jit(lambda x, w: jaxconv.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=DN, lowering="onednn"))
    try:
        h.assert_close(run(x, w), want, jnp.float32)
        first = found()
        assert first["source"] == "trial" and len(first["candidates"]) > 1, first
        assert all(c["trial_ms"] is not None and c["noise"] >= 0 for c in first["candidates"])
        assert measured.save_layouts() >= 1
        kept = measured.cached()["layouts"][first["key"]]
        assert (kept["layout"], kept["impl"]) == (first["candidates"][0]["layout"],
                                                  first["candidates"][0]["impl"])
        library.forget()  # a later process: nothing remembered, no primitive cached
        assert measured.load_layouts.__wrapped__() >= 1
        h.assert_close(run(x, w), want, jnp.float32)
        again = found()
        assert again["source"] == "cache" and again["candidates"][0]["impl"] == kept["impl"]
        assert measured.save_layouts() == 0  # nothing new to store
        library.forget()
        library.set_trial(False)
        h.assert_close(run(x, w), want, jnp.float32)
        rule = found()
        assert rule["source"] == "rule" and rule["candidates"][0]["layout"] == "caller"
        assert all(c["trial_ms"] is None for c in rule["candidates"])
    finally:
        library.forget()


def test_tune_makes_every_timed_choice_and_the_cli_shows_and_clears_them(
        measuring, monkeypatch, tmp_path, capsys):
    from jaxconv._src import cli
    from jaxconv._src.native import library as lib

    def fake(c, seconds):
        kernel, methods = c.kernel, tuple(c.calls)
        return {methods[0]: [1.0] * 7, methods[1]: [2.0] * 7}  # the table's method faster

    monkeypatch.setattr(measured, "_sample_times", fake)
    x, w = _operands()
    state = jnp.ones(4)
    step = jax.jit(lambda x, w, s: (_conv(x, w), s + 1), donate_argnums=2)
    tuned = jaxconv.tune(step, x, w, state)
    assert not state.is_deleted()  # tune ran on copies: a donated argument stays the caller's
    (d,) = tuned.decisions
    assert d.source == "measured" and d.verdict == d.rule != "conv"
    assert d.lead == pytest.approx(-1.0) and "measured" in str(tuned)
    assert tuned.path == measured.cache_path() and tuned.path.exists()
    assert cli.main(["tune", "-v"]) == 0
    out = capsys.readouterr().out
    assert "1 method verdicts (0 not the rule's)" in out and f"rule {d.rule}" in out
    monkeypatch.setattr(lib, "cache_dir", lambda: tmp_path)
    assert cli.main(["tune", "--clear"]) == 0
    assert "removed 1 cache file" in capsys.readouterr().out
    assert not tuned.path.exists() and measured.decisions() == []
    with pytest.raises(TypeError, match="tune: fn must be callable"):
        jaxconv.tune(3)


def test_explain_shows_where_each_choice_came_from(measuring, monkeypatch):
    def fake(c, seconds):  # XLA's program 40% faster, steadily
        kernel, methods = c.kernel, tuple(c.calls)
        return {methods[0]: [1.0] * 7, methods[1]: [0.6] * 7}

    monkeypatch.setattr(measured, "_sample_times", fake)
    x, w = _operands()
    rows = jaxconv.explain(jax.jit(_conv), x, w).rows
    assert [(r.lowering, r.chosen) for r in rows] == [("conv", "measured: +40% vs 3% needed")]
    monkeypatch.setattr(measured, "_VERDICTS", {})  # a later process: the disk cache
    monkeypatch.setattr(measured, "_DECISIONS", {})
    measured._disk.cache_clear()
    rows = jaxconv.explain(jax.jit(_conv), x, w).rows
    assert [r.chosen for r in rows] == ["cache: +40% vs 3% needed"]
    monkeypatch.setattr(measured, "enabled", lambda: False)
    monkeypatch.setattr(measured, "_DECISIONS", {})
    assert [r.chosen for r in jaxconv.explain(jax.jit(_conv), x, w).rows] == ["rule"]


def test_tune_runs_a_script_with_its_choices_timed(measuring, monkeypatch, tmp_path, capsys):
    """``jaxconv tune SCRIPT ARGS``: the script runs as ``python SCRIPT ARGS`` would (its
    ``sys.argv``, as ``__main__``), its programs' choices are timed and listed."""
    from jaxconv._src import cli

    monkeypatch.setattr(measured, "_sample_times",
                        lambda c, seconds: {m: [1.0 + i] * 7 for i, m in enumerate(c.calls)})
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "import jax, jax.numpy as jnp, jaxconv\n"
        "assert __name__ == '__main__' and sys.argv[1:] == ['--epochs', '1'], sys.argv\n"
        "x, w = jnp.ones((2, 9, 9, 8)), jnp.ones((3, 3, 8, 16))\n"
        "jax.jit(lambda x, w: jaxconv.conv_general_dilated(\n"
        "    x, w, (1, 1), 'SAME', rhs_dilation=(2, 2),\n"
        "    dimension_numbers=('NHWC', 'HWIO', 'NHWC')) - 1)(x, w).block_until_ready()\n")
    assert cli.main(["tune", str(script), "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "(measured; rule" in out and "1 method verdicts" in out, out
    monkeypatch.setattr(measured, "enabled", lambda: False)
    assert cli.main(["tune", str(script)]) == 2  # JAXCONV_MEASURE=0: nothing to tune
    assert "JAXCONV_MEASURE=0" in capsys.readouterr().err


def _bfloat16_transposed(x, w):
    """DCGAN's 4x4 stride-2 transposed convolution (a data gradient whose table method is
    oneDNN's where it computes bfloat16)."""
    return jaxconv.conv_transpose(x, w, strides=2, pads_begin=1, pads_end=1,
                                  data_format="NXC", filter_format="XOI")


@pytest.mark.parametrize("widened_faster", [True, False])
def test_onednn_f32_challenges_bfloat16_onednn_on_float32_operands(measuring, monkeypatch,
                                                                   widened_faster):
    """On bfloat16 operands oneDNN's float32 kernel (``onednn_f32``) challenges oneDNN's
    bfloat16 one, timed on float32 operands (its casts fuse into the program's neighbours:
    ``chooser._contest``); taken only where it leads, its result rounded once to bfloat16."""
    if "bfloat16" not in library.status().dtypes:
        pytest.skip("this CPU's oneDNN does not compute bfloat16: the table does not take it")
    seen = {}

    def fake(c, seconds):
        seen.update(c.operand_dtypes)
        assert "onednn_f32" in c.calls and c.rule == "onednn", c.calls
        fast, slow = ("onednn_f32", "onednn") if widened_faster else ("onednn", "onednn_f32")
        return _samples({m: 1.0 if m == fast else 2.0 if m == slow else 3.0 for m in c.calls})

    monkeypatch.setattr(measured, "_sample_times", fake)
    rng = np.random.default_rng(0)
    x = h.random(rng, (1, 8, 8, 64), jnp.bfloat16)
    w = h.random(rng, (4, 4, 32, 64), jnp.bfloat16)
    f = jax.jit(lambda x, w: _bfloat16_transposed(x, w))  # traced anew: timed anew
    text = f.lower(x, w).as_text()
    assert seen == {"onednn_f32": np.dtype(np.float32)}
    f32 = "tensor<4x4x32x64xf32>"
    assert (f32 in text) == widened_faster and "jaxconv_onednn_data" in text
    got = f(x, w)
    assert got.dtype == jnp.bfloat16
    # the float32 result of the same operands by XLA's formulation, rounded once
    want = jaxconv.conv_transpose(x.astype(jnp.float32), w.astype(jnp.float32), strides=2,
                                  pads_begin=1, pads_end=1, data_format="NXC",
                                  filter_format="XOI", precision=lax.Precision.HIGHEST,
                                  lowering="grid").astype(jnp.bfloat16)
    h.assert_close(got, want, jnp.bfloat16)
    if widened_faster:  # summed in float32 as the oracle: one bfloat16 rounding apart, plus
        # the float32 sums' own bound (their orders differ by CPU), from the tolerance table
        want32 = np.asarray(want, np.float32)
        gap = np.abs(np.asarray(got, np.float32) - want32)
        bound = (np.abs(want32) * 2.0 ** -7
                 + jaxconv.testing.tolerance(jnp.float32) * np.max(np.abs(want32)))
        assert np.all(gap <= bound)


@pytest.mark.skipif(not library.status().available, reason="needs jaxconv's oneDNN handler")
def test_a_constant_filters_contest_times_onednn_on_it_packed(measuring, monkeypatch):
    """A served chain's forward (its filter a constant of the program) has a contest of its
    own, in which oneDNN's candidates are timed on the filter packed (``chooser._contest``:
    ``prepare`` packs the drawn filter once, the calls read the bytes); its verdict runs the
    program, the variables-as-arguments program keeping the other one."""
    seen = []

    def fake(c, seconds):
        seen.append((c.packed, tuple(c.prepare)))
        fast = "onednn" if c.packed else "conv"
        return _samples({m: 1.0 if m == fast else 2.0 for m in c.calls})

    monkeypatch.setattr(measured, "_sample_times", fake)
    # XLA's convolution the rule, oneDNN its challenger
    monkeypatch.setattr(chooser, "cpu_table_method", lambda *a, **k: "conv")
    monkeypatch.setattr(chooser, "candidates", lambda *a, **k: ("conv", "onednn"))
    rng = np.random.default_rng(0)
    x, w = h.random(rng, (1, 6, 6, 8)), h.random(rng, (3, 3, 8, 16))

    def chain(x, w):
        return jax.nn.relu(lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=DN))
    served = jax.jit(jaxconv.accelerate(lambda x: chain(x, w))).lower(x).compile().as_text()
    args = jax.jit(jaxconv.accelerate(chain)).lower(x, w).compile().as_text()
    assert (True, ("onednn",)) in seen and (False, ()) in seen, seen
    assert "jaxconv_onednn_fused" in served and "jaxconv_onednn" not in args
    assert any("filter packed" in d.problem for d in measured.decisions())
    h.assert_close(jax.jit(jaxconv.accelerate(lambda x: chain(x, w)))(x), chain(x, w),
                   jnp.float32)


@pytest.mark.skipif(not library.status().available, reason="needs jaxconv's oneDNN handler")
def test_a_packed_candidate_is_timed_on_the_bytes_its_call_reads(measuring, monkeypatch):
    """The real timing of a packed contest: each call of oneDNN's candidate gets the packed
    bytes (uint8), the other candidates the filter; all of them arrays on the device, as a
    program's are (a host array is copied in at every timed call)."""
    p = geometry.convolution_problem(
        "t", geometry.Names(x="x", y="y", w_shape="w", w_format="f", layout_arguments=False),
        x_shape=(1, 6, 6, 8), y_shape=None, w_shape=(1, 1, 8, 16), strides=(1, 1),
        pads_begin=(0, 0), pads_end=(0, 0), dilations=(1, 1), auto_pad="explicit", groups=1,
        data_format="NXC", filter_format="XIO")
    contest = chooser._contest(Kernel.FORWARD, p, "onednn", np.float32, None, None,
                               packed=True)
    got = {}
    calls = dict(contest.calls)
    for m, call in calls.items():
        def spy(a, b, m=m, call=call):
            got[m] = np.dtype(b.dtype)
            return call(a, b)
        contest.calls[m] = spy
    timed = {}
    interleaved = measured._interleaved

    def spy_operands(calls, operands, seconds):
        timed.update(operands)
        return interleaved(calls, operands, seconds)
    monkeypatch.setattr(measured, "_interleaved", spy_operands)
    measured._sample_times(contest, 0.0)
    assert got.get("onednn") == np.uint8
    assert all(dt == np.float32 for m, dt in got.items() if m != "onednn"), got
    assert set(timed) == set(calls)
    kinds = {m: [type(o).__name__ for o in ops] for m, ops in timed.items()}
    assert all(isinstance(o, jax.Array) for ops in timed.values() for o in ops), kinds


def _program(x, w):
    """A small CNN's forward: two convolutions and a ReLU between."""
    y = jax.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN))
    return lax.conv_general_dilated(y, jnp.swapaxes(w, 2, 3)[:, :, :16, :8], (1, 1), "SAME",
                                    dimension_numbers=DN)


def _whole(monkeypatch, winner):
    """Whole programs timed (fakes: the ``winner`` steadily faster), each kernel's choice
    the rule's; the programs' calls timed, in a list."""
    timed = []

    def fake(calls, operands, seconds, max_rounds):
        timed.append(tuple(calls))
        assert all(len(v) == 2 for v in operands.values())  # (x, w): the program's operands
        return {m: [0.5 if m == winner else 1.0] * 7 for m in calls}
    monkeypatch.setattr(chooser, "PROGRAM_MEASURE_MAX_MACS", 2 ** 27)
    monkeypatch.setattr(measured, "_interleaved", fake)
    monkeypatch.setattr(measured, "_sample_times", lambda c, s: {m: [1.0] * 7 for m in c.calls})
    return timed


def test_a_small_program_runs_as_written_where_it_timed_faster_whole(measuring, monkeypatch):
    """XLA may fuse a small CNN whole, faster than its kernels chosen one by one: the program
    as written runs (no jaxconv kernel in it), explain says why, and the verdict is reused."""
    timed = _whole(monkeypatch, "lax")
    x, w = _operands()
    prims = [e.primitive.name for e in h.equations(jaxconv.accelerate(_program), x, w)]
    assert timed == [("jaxconv", "lax")]
    assert not any(p.startswith("jaxconv") for p in prims) and "conv_general_dilated" in prims
    h.assert_close(jax.jit(jaxconv.accelerate(_program))(x, w), _program(x, w), jnp.float32)
    (d,) = [d for d in measured.decisions() if d.kernel == "program"]
    assert (d.rule, d.verdict, d.source, d.lead) == ("jaxconv", "lax", "measured", 0.5)
    notes = jaxconv.explain(jaxconv.accelerate(_program), x, w).notes
    assert any("whole program timed, lax kept" in n for n in notes), notes
    assert not any("have a jaxconv kernel" in n for n in notes), notes
    monkeypatch.setattr(measured, "_VERDICTS", {})  # a later process: the disk cache
    monkeypatch.setattr(measured, "_DECISIONS", {})
    measured._disk.cache_clear()
    monkeypatch.setattr(measured, "_interleaved", lambda *a: pytest.fail("timed again"))
    prims = [e.primitive.name for e in h.equations(jaxconv.accelerate(_program), x, w)]
    assert not any(p.startswith("jaxconv") for p in prims)


def test_the_accelerated_program_stays_where_it_timed_faster_whole(measuring, monkeypatch):
    timed = _whole(monkeypatch, "jaxconv")
    x, w = _operands()
    prims = [e.primitive.name for e in h.equations(jaxconv.accelerate(_program), x, w)]
    assert timed == [("jaxconv", "lax")] and "jaxconv_conv" in prims
    notes = jaxconv.explain(jaxconv.accelerate(_program), x, w).notes
    assert any("whole program timed, jaxconv kept (accelerated)" in n for n in notes), notes


def _winograd_program(x, w):
    """A small CNN's forward whose 3x3 32 -> 32 convolution the CPU table runs on Winograd."""
    y = jax.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN))
    return lax.conv_general_dilated(y, w, (1, 1), "SAME", dimension_numbers=DN)


@pytest.mark.skipif(not library.status().available, reason="needs jaxconv's oneDNN handler")
@pytest.mark.parametrize("winner", ["direct", "jaxconv", "lax"])
def test_a_program_with_winograd_is_also_timed_whole_without_it(measuring, monkeypatch, winner):
    """Where a convolution's table method is Winograd, the accelerated program without
    Winograd (``lowering="direct"``'s) challenges the accelerated one, then the program as
    written the one that held; the winner runs, and explain says which. Without a Winograd
    convolution, or under ``lowering="direct"``, two programs are timed."""
    timed = _whole(monkeypatch, winner)
    rng = np.random.default_rng(0)
    x, w = h.random(rng, (1, 14, 14, 32)), h.random(rng, (3, 3, 32, 32))
    p = geometry.convolution_problem(
        "t", geometry.Names(x="x", y="y", w_shape="w", w_format="f", layout_arguments=False),
        x_shape=x.shape, y_shape=None, w_shape=w.shape, strides=(1, 1), pads_begin=(1, 1),
        pads_end=(1, 1), dilations=(1, 1), auto_pad="explicit", groups=1, data_format="NXC",
        filter_format="XIO")
    assert chooser.cpu_table_method(Kernel.FORWARD, p, np.float32) == "winograd"
    eqns = h.equations(jaxconv.accelerate(_winograd_program), x, w)
    assert timed == [("jaxconv", "direct", "lax")]
    methods = {e.params["method"] for e in eqns if e.primitive.name.startswith("jaxconv")}
    assert methods == {"jaxconv": {"auto"}, "direct": {"direct"}, "lax": set()}[winner]
    h.assert_close(jax.jit(jaxconv.accelerate(_winograd_program))(x, w),
                   _winograd_program(x, w), jnp.float32)
    (d,) = [d for d in measured.decisions() if d.kernel == "program"]
    assert (d.rule, d.verdict) == ("jaxconv", winner)
    kept = {"jaxconv": "accelerated", "direct": "accelerated without Winograd",
            "lax": "the program as written"}[winner]
    notes = jaxconv.explain(jaxconv.accelerate(_winograd_program), x, w).notes
    assert any(f"whole program timed, {winner} kept ({kept})" in n for n in notes), notes
    timed.clear()
    jax.make_jaxpr(jaxconv.accelerate(_winograd_program, lowering="direct"))(x, w)
    jax.make_jaxpr(jaxconv.accelerate(_program))(*_operands())
    assert timed == [("jaxconv", "lax"), ("jaxconv", "lax")]


def test_no_whole_program_is_timed_with_a_loop_or_branch_large_or_measuring_off(measuring,
                                                                             monkeypatch):
    _whole(monkeypatch, "lax")
    monkeypatch.setattr(measured, "_interleaved", lambda *a: pytest.fail("timed"))
    x, w = _operands()

    def looped(x, w):  # a trip count read from the operands
        return lax.while_loop(lambda c: c[1] < jnp.sum(x) % 3, lambda c: (_program(c[0], w),
                                                                           c[1] + 1),
                              (x[..., :8], 0.0))[0]
    for fn in (looped, lambda x, w: lax.cond(x[0, 0, 0, 0] > 0, _program, _program, x, w)):
        assert chooser._program_macs(jax.make_jaxpr(fn)(x, w).jaxpr) is None
        assert "jaxconv_conv" in [e.primitive.name for e in h.equations(
            jaxconv.accelerate(fn), x, w)]
    assert chooser._program_macs(jax.make_jaxpr(_program)(x, w).jaxpr) == (
        2 * 9 * 9 * 16 * 9 * 8 + 2 * 9 * 9 * 8 * 9 * 16)
    monkeypatch.setattr(chooser, "PROGRAM_MEASURE_MAX_MACS", 10)
    assert "jaxconv_conv" in [e.primitive.name for e in h.equations(
        jaxconv.accelerate(_program), x, w)]
    monkeypatch.setattr(chooser, "PROGRAM_MEASURE_MAX_MACS", 2 ** 27)
    monkeypatch.setattr(measured, "enabled", lambda: False)
    assert "jaxconv_conv" in [e.primitive.name for e in h.equations(
        jaxconv.accelerate(_program), x, w)]


def test_a_whole_programs_lead_is_paired_round_by_round():
    """Two programs timed in the same rounds: a drift of the machine moves both, so the lead is
    the rounds' median ratio, and it must exceed the margin by twice that median's standard
    error (where their unpaired noises would have kept the rule)."""
    rng = np.random.default_rng(0)
    drift = 1 + 0.3 * np.sin(np.arange(200) / 7)  # the VM's speed over the rounds
    rule = list(1e-3 * drift * rng.uniform(0.98, 1.02, 200))
    faster = [t * 0.9 * u for t, u in zip(rule, rng.uniform(0.98, 1.02, 200))]
    lead, need = measured._beats_paired(faster, rule, measured.CHALLENGER_MARGIN)
    assert lead == pytest.approx(0.1, abs=0.01) and lead > need
    unpaired_lead, unpaired_need = measured._beats(faster, rule, measured.CHALLENGER_MARGIN)
    assert unpaired_lead < unpaired_need  # the drift, counted as noise, hid the lead
    scattered = [t * u for t, u in zip(rule[:12], rng.uniform(0.7, 1.25, 12))]
    lead, need = measured._beats_paired(scattered, rule[:12], measured.CHALLENGER_MARGIN)
    assert lead < need  # a dozen rounds this scattered measure no lead
    level = [t * 0.98 for t in rule]  # steadily 2% ahead: within the margin
    assert measured._beats_paired(level, rule, measured.CHALLENGER_MARGIN)[0] < 0.03


def test_a_whole_program_is_timed_on_its_operands_integers_in_range(measuring, monkeypatch):
    """Timed for real: an integer operand is drawn as zeros (an index in range); the values
    are the program's whichever runs."""
    monkeypatch.setattr(chooser, "PROGRAM_MEASURE_MAX_MACS", 2 ** 27)
    x, w = _operands()

    def picked(x, w, i):
        return _program(x, w)[i]
    i = jnp.asarray(1)
    got = jax.jit(jaxconv.accelerate(picked))(x, w, i)
    h.assert_close(got, picked(x, w, i), jnp.float32)
    (d,) = [d for d in measured.decisions() if d.kernel == "program"]
    assert d.source == "measured" and set(d.times_ms) == {"jaxconv", "lax"}
    assert all(t > 0 for t in d.times_ms.values())
