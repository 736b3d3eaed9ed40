"""The benchmark runner's parser and one tiny measurement (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from jaxconv._src.bench import benchdnn, run
from tests.support import helpers as h


def test_parse_lines():
    p = benchdnn.parse_line('g1mb50ic3ih224iw224oc64oh112ow112kh7kw7sh2sw2ph3pw3n"resnet_50:conv1"',
                            "conv_shapes_resnet_50")
    assert (p.batch, p.in_channels, p.out_channels) == (16, 3, 64)
    assert p.input_size == (224, 224) and p.output_size == (112, 112)
    # p_end = (o-1)*s - i + DK - p = 222 - 224 + 7 - 3 = 2
    assert p.pads_begin == (3, 3) and p.pads_end == (2, 2)
    d = benchdnn.parse_line('mb20ic4ih8oc6oh3kh3sh2ph1dh1n"dilated_conv:1"', "conv_shapes_dilated")
    assert d.dilations == (2, 2) and d.input_size == (8, 8) and d.batch == 16  # dh1 = dilation 2
    t = benchdnn.parse_line("ic16oc16_ih13kh3ph1_iw50kw3pw1_id10kd3pd1_n\"3d\"", "conv_shapes_3d")
    assert t.rank == 3 and t.input_size == (10, 13, 50) and t.batch == 2
    dc = benchdnn.parse_line('g2mb256oc96oh27ic256ih27kh5ph2n"alexnet:deconv2"', "deconv_shapes_2d")
    assert dc.transposed and dc.groups == 2 and (dc.in_channels, dc.out_channels) == (96, 256)
    assert benchdnn.parse_line("# comment", "x") is None


@pytest.mark.parametrize("name", sorted(p.stem for p in benchdnn.SHAPES.glob("*.txt")))
def test_every_list_parses(name):
    probs = benchdnn.load(name)
    assert probs and all(min(p.input_size) > 0 and min(p.output_size) > 0 for p in probs)


def test_runner_end_to_end(tmp_path):
    out = tmp_path / "r.json"
    assert run.main(["--backend", h.bench_backend(), "--lists", "conv_shapes_dilated",
                     "--per-list", "1", "--reps", "1", "--kinds", "wgrad", "fwd", "--no-torch",
                     "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["kind"], r["baseline"]) for r in rows] == [
        ("wgrad", "jax.vjp"), ("fwd", "lax.conv_general_dilated")]
    for row in rows:
        assert set(row["median_ms"]) >= {"jaxconv", "jax.vjp"} and row["speedup_vs_vjp"] > 0
    assert {"conv_shapes_dilated (weight gradients)", "conv_shapes_dilated (forward)"} <= set(
        result["summary"])
    # a deconv line's forward is its data gradient row: no 'fwd' task for it
    (deconv,) = benchdnn.load("deconv_shapes_2d")[:1]
    assert [k for _, k in run.tasks_for(["deconv_shapes_2d"], 1, 16)] == ["wgrad", "dgrad"]
    assert deconv.transposed


def test_runner_backend_option(tmp_path, capsys):
    """--backend runs on the platform JAX has; one that JAX has no backend for is a usage
    error, not a crash."""
    import jax

    out = tmp_path / "c.json"
    assert run.main(["--backend", h.bench_backend(), "--lists", "conv_shapes_mobilenet_dw",
                     "--per-list", "1", "--reps", "1", "--no-torch", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["meta"]["backend"] == jax.devices()[0].platform
    missing = "gpu" if h.bench_backend() == "cpu" else "cpu"
    try:
        jax.devices(missing)
    except RuntimeError:
        with pytest.raises(SystemExit) as e:
            run.main(["--backend", missing, "--per-list", "1", "--no-torch"])
        assert e.value.code == 2
        assert f"--backend {missing}: JAX has no {missing} backend here" in capsys.readouterr().err


def test_torch_gpu_contender():
    """On a GPU the cuDNN contender computes the same weight gradient as jaxconv; elsewhere it
    is absent (the row then has no torch column)."""
    import jax
    import numpy as np

    prob = benchdnn.load("conv_shapes_mobilenet_dw", batch_cap=2)[0]
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or jax.default_backend() == "cpu":
        assert run._torch_impl(prob, "wgrad", None, None, None, gpu=True) is None
        return
    impls = run.build(prob, "wgrad", gpu=True)
    got = impls["torch"]().block_until_ready().value.cpu().numpy()  # OIX
    ours = np.asarray(impls["jaxconv"]())  # XIO
    h.assert_close(np.transpose(ours, (3, 2, 0, 1)), got, np.float32)


@pytest.mark.parametrize("kind,mask", [("wgrad", [False, True, False]),
                                       ("dgrad", [True, False, False])])
@pytest.mark.parametrize("list_name", ["conv_shapes_mobilenet_dw", "deconv_shapes_2d"])
def test_torch_contender_is_the_gradient_alone(monkeypatch, kind, mask, list_name):
    """The CPU torch contender times exactly jaxconv's work: ``convolution_backward`` with the
    gradient's output mask (no forward, no autograd), and computes jaxconv's result."""
    import jax
    import numpy as np

    torch = pytest.importorskip("torch")
    calls = []
    real = torch.ops.aten.convolution_backward

    class Spy:
        def __call__(self, *args):
            calls.append(args[-1])
            return real(*args)

    monkeypatch.setattr(torch.ops.aten, "convolution_backward", Spy())
    forward_calls = []
    for name in ("conv1d", "conv2d", "conv3d"):
        fwd = getattr(torch.nn.functional, name)
        monkeypatch.setattr(torch.nn.functional, name,
                            lambda *a, fwd=fwd, **k: forward_calls.append(1) or fwd(*a, **k))
    prob = next(p for p in benchdnn.load(list_name, batch_cap=2) if p.rank == 2)
    impls = run.build(prob, kind)
    got = impls["torch"]().numpy()
    assert calls and all(m == mask for m in calls) and not forward_calls
    with jax.default_matmul_precision("float32"):  # a GPU's default is TF32; torch's CPU is exact
        ours = np.asarray(impls["jaxconv"]())
    if kind == "wgrad":  # torch OIX, ours XIO
        ours = np.transpose(ours, (3, 2, 0, 1))
    else:  # torch NCX, ours NXC (an explicit pad would make torch's dx the padded input's)
        assert not impls["torch"].explicit_pad
        ours = np.transpose(ours, (0, 3, 1, 2))
    h.assert_close(ours, got, np.float32)
    assert impls["torch"].layout in ("NCX", "channels_last")


def test_torch_forward_contender_is_the_convolution_alone(monkeypatch):
    """A forward row's torch contender is ``aten.convolution`` under no_grad (no backward)."""
    import numpy as np

    torch = pytest.importorskip("torch")
    backward = []
    real = torch.ops.aten.convolution_backward
    monkeypatch.setattr(torch.ops.aten, "convolution_backward",
                        lambda *a: backward.append(1) or real(*a))
    prob = benchdnn.load("conv_shapes_dilated", batch_cap=2)[0]
    impls = run.build(prob, "fwd")
    got = impls["torch"]().numpy()  # NCX
    h.assert_close(np.transpose(np.asarray(impls["jaxconv"]()), (0, 3, 1, 2)), got, np.float32)
    assert not backward


def test_timer_waits_for_every_array_of_every_call():
    """A training step returns a pytree: a sample must wait for all of it, for every call."""
    from jaxconv._src.bench.run import _time_n

    waited = []

    class Pending:
        def block_until_ready(self):
            waited.append(self)
            return self

    _time_n(lambda: (Pending(), {"params": [Pending(), Pending()]}), 4)
    assert len(waited) == 12



def test_each_sample_follows_a_lead_in_of_half_a_sample(monkeypatch):
    """The previous contender's threads settle (torch's libgomp workers spin ~5 ms after a
    region): before each timed sample of a contender, untimed calls of that same contender for
    half a sample, in the repetition's order; each contender is called once before its calls
    a sample are counted (a first call that compiles would count as a whole sample)."""
    from jaxconv._src.bench import timing

    log = []

    def counted(fn):  # each contender called once (compiled) before its calls are counted
        assert (fn(), 1) in log
        return 8
    monkeypatch.setattr(timing, "calls_per_sample", counted)
    monkeypatch.setattr(timing, "_time_n", lambda fn, n: log.append((fn(), n)) or 1.0)
    times = timing.interleaved({"a": lambda: "a", "b": lambda: "b"}, reps=3)
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert log[:2] == [("a", 1), ("b", 1)] and len(log) == 14
    for (lead, n_lead), (sample, n_sample) in zip(log[2::2], log[3::2]):
        assert lead == sample and (n_lead, n_sample) == (4, 8)

def test_smoke_preset(tmp_path):
    """`jaxconv bench --preset smoke` (three small problems, seconds): the runner works end
    to end, with torch when installed, and records every contender's time and the paired
    quartiles. It asserts no speed: under pytest-xdist the other worker shares the cores (CI
    once timed alexnet:deconv4 at 16 ms against 1.5 ms alone), so speed is the benchmark's
    report, not a test's verdict."""
    out = tmp_path / "smoke.json"
    assert run.main(["--backend", h.bench_backend(), "--preset", "smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["name"], r["kind"]) for r in rows] == run.PRESETS["smoke"]["only"]
    for r in rows:
        assert {"jaxconv", "jax.vjp"} <= set(r["median_ms"]), r["median_ms"]
        assert all(t > 0 for t in r["median_ms"].values()), r["median_ms"]
        assert r["speedup_vs_vjp"] == pytest.approx(
            r["median_ms"]["jax.vjp"] / r["median_ms"]["jaxconv"])
        low, high = r["speedup_vs_vjp_quartiles"]
        assert 0 < low <= high


def test_slower_beyond_noise_reads_the_paired_quartiles():
    """A row counts as slower beyond noise only when jaxconv lost by more than 5% in three of
    four paired rounds; a row without quartiles (a JSON from before they were recorded) never does."""
    from jaxconv._src.bench.run import _slower_beyond_noise
    assert _slower_beyond_noise({"speedup_vs_vjp_quartiles": [0.7, 0.9]})
    assert not _slower_beyond_noise({"speedup_vs_vjp_quartiles": [0.8, 0.97]})
    assert not _slower_beyond_noise({"speedup_vs_vjp_quartiles": [0.9, 1.2]})
    assert not _slower_beyond_noise({"speedup_vs_vjp": 0.5})


def test_programs_dump_and_compare(tmp_path):
    """benchmarks/programs.py: the same checkout dumps the same programs; a changed one differs."""
    from benchmarks import programs
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["--lists", "conv_shapes_dilated", "--per-list", "1"]
    assert programs.main(["dump", str(a), *args]) == 0
    assert programs.main(["dump", str(b), *args]) == 0
    assert programs.main(["compare", str(a), str(b)]) == 0
    changed = json.loads(b.read_text())
    key = next(iter(changed))
    changed[key] += "\nROOT another"
    b.write_text(json.dumps(changed))
    assert programs.compare(json.loads(a.read_text()), changed) == [key]
    assert programs.main(["compare", str(a), str(b)]) == 1


def test_train_step_contenders_agree_and_count_page_faults():
    """benchmarks/train_step.py on its smallest block: every contender's step from the same
    parameters gives the same loss and parameters (torch's nn modules too, when installed),
    and each row says what the kernel did for each contender (page faults, system time)."""
    from benchmarks import train_step

    contenders = ("lax", "jaxconv", "jaxconv_vmap", "torch")
    r = train_step.measure("unet3d", 1, 1, contenders)
    timed = set(r["median_ms"])
    assert {"lax", "jaxconv", "jaxconv_vmap"} <= timed <= set(contenders)
    tol = h.TOLERANCE["float32"]  # losses and parameters of order 1
    assert r["loss_gap"] < tol and r["param_gap"] < tol
    assert set(r["page_faults_per_step"]) == set(r["system_ms_per_step"]) == timed
    assert all(v >= 0 for v in [*r["page_faults_per_step"].values(),
                                *r["system_ms_per_step"].values()])


def test_filter_move_and_transposed_product_benchmarks_run(tmp_path):
    """``benchmarks/filter_moves.py`` (where the handler is loaded) and
    ``benchmarks/transposed_product.py`` run once through and write their JSON (no timing
    asserted)."""
    from benchmarks import filter_moves, transposed_product
    from jaxconv._src.native import library

    out = tmp_path / "p.json"
    assert transposed_product.main(["--reps", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["layer"] for r in rows] == list(transposed_product.SHAPES)
    assert all(r["accelerate_over_written"] > 0 for r in rows)
    if library.status().available:
        out = tmp_path / "m.json"
        assert filter_moves.main(["--reps", "1", "--out", str(out)]) == 0
        rows = json.loads(out.read_text())["rows"]
        assert len(rows) == len(filter_moves.ROWS)
        assert all(r["ratio"] > 0 for r in rows if r["applies"])


def test_scaling_runs_each_thread_count_confined_to_that_many_cpus(tmp_path, monkeypatch):
    """``benchmarks/scaling.py`` at one thread: its child runs on one CPU, and every contender
    sees it (XLA's pool, torch's threads); the outputs agree; the page renders the JSON."""
    from benchmarks import scaling
    from jaxconv._src.bench import page

    out = tmp_path / "scaling-test.json"
    assert scaling.main(["--threads", "1", "--inference-models", "mnist_cnn", "--batches", "1",
                         "--inference-contenders", "accelerate", "torch", "openvino",
                         "--steps-models",
                         "mnist_cnn", "--rounds", "1", "--reps", "1", "--out", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["threads"] == 1 and len(run["cpus"]) == 1
    assert run["machine"]["xla_threads"] == 1 and run["machine"]["torch"]["threads"] == 1
    assert all(all(r["agrees"].values()) and len(r["agrees"]) == 3 for r in run["inference"])
    assert [r["model"] for r in run["steps"]] == ["mnist_cnn"]
    assert scaling.cpus_by_core()[0] in run["cpus"]
    monkeypatch.setattr(page, "BENCH", tmp_path)
    table = page._scaling([out.name])
    assert "| 1 threads |" in table and "MNIST CNN (1)" in table


def assert_rounded_ratio(ratio: float, t: float, base: float) -> None:
    """``ratio`` is ``t / base`` as a benchmark's JSON writes them: the times rounded to 4
    decimals (each within 5e-5 ms of what was divided), the ratio to 3 (within 5e-4)."""
    half = 5e-5
    low, high = (t - half) / (base + half), (t + half) / (base - half)
    assert low - 5e-4 - 1e-12 <= ratio <= high + 5e-4 + 1e-12, (ratio, t, base)


def test_dense_products_benchmark_runs(tmp_path):
    """``benchmarks/dense_products.py`` times every method on every shape once and writes its
    JSON: each fastest call positive and at most its median, each ratio that call's over the
    baseline's (no timing asserted)."""
    from benchmarks import dense_products

    out = tmp_path / "d.json"
    assert dense_products.main(["--reps", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["layer"] for r in rows] == list(dense_products.SHAPES)
    for r in rows:
        assert {"baseline", "accelerate"} <= set(r["fastest_ms"])
        for k, t in r["fastest_ms"].items():
            assert 0 < t <= r["median_ms"][k]
            assert_rounded_ratio(r["over_baseline"][k], t, r["fastest_ms"]["baseline"])


def test_winograd_tiles_benchmark_runs(tmp_path):
    """``benchmarks/winograd_tiles.py`` times every method on one layer, rotating two filters,
    and writes its JSON (no timing asserted)."""
    from benchmarks import winograd_tiles
    from jaxconv._src.native import library

    if not library.status().available:
        pytest.skip("needs the onednn extra built")
    out = tmp_path / "w.json"
    assert winograd_tiles.main(["--reps", "1", "--filters", "2", "--layers",
                                "resnet50 5x5 512", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["forward", "data", "weight"]
    assert all(set(r["fastest_ms"]) == set(winograd_tiles.METHODS) for r in rows)
    # each method's median call no faster than its fastest, and every ratio over the baseline
    # that fastest call's
    for r in rows:
        for m, fastest in r["fastest_ms"].items():
            assert 0 < fastest <= r["median_ms"][m]
            assert_rounded_ratio(r["over_baseline"][m], fastest, r["fastest_ms"]["baseline"])


def test_winograd_tiles_benchmark_bfloat16_and_chosen_methods(tmp_path):
    """``--dtype bfloat16 --methods onednn winograd_4x4`` times those two and the baseline on
    bfloat16 operands, and the JSON says which dtype."""
    from benchmarks import winograd_tiles
    from jaxconv._src.native import library

    if not library.status().available:
        pytest.skip("needs the onednn extra built")
    out = tmp_path / "w.json"
    assert winograd_tiles.main(["--reps", "1", "--layers", "resnet18 7x7 512", "--dtype",
                                "bfloat16", "--methods", "onednn", "winograd_4x4",
                                "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dtype"] == "bfloat16"
    assert all(set(r["fastest_ms"]) == {"baseline", "onednn", "winograd_4x4"}
               for r in result["rows"])


def test_process_sharing_alternates_the_kinds_and_reports_each_round(tmp_path, monkeypatch,
                                                                     capsys):
    """``benchmarks/process_sharing.py``: each round an interleaved process, then a process per
    contender (merged as ``--separate`` merges them); the ratio per kind over rounds; the
    oneDNN lowering's status line in the JSON; the table from the JSON. The children are
    stand-ins (the real ones: test_bench_models's ``--separate`` test)."""
    from benchmarks import process_sharing
    from jaxconv._src.native import library

    calls = []

    def child(args, mode, contenders):
        calls.append(tuple(contenders))
        ms = {"accelerate": 100.0 + len(calls), "torch": 120.0}
        row = {"model": "mobilenet_v2", "median_ms": {k: ms[k] for k in contenders},
               "minor_faults_per_step": {k: 0.0 for k in contenders},
               "losses": {k: 1.0 for k in contenders}}
        return {"rows": [row], "peak_rss_mib": 10.0}

    monkeypatch.setattr(process_sharing, "_child", child)
    out = tmp_path / "sharing.json"
    assert process_sharing.main(["--rounds", "2", "--out", str(out)]) == 0
    assert calls == [("accelerate", "torch"), ("accelerate",), ("torch",)] * 2
    result = json.loads(out.read_text())
    assert [r["kind"] for r in result["rounds"]] == ["interleaved", "separate"] * 2
    assert result["onednn"] == library.status().line()  # a stale build shows as "not available"
    first = result["rounds"][0]
    assert first["ratio"] == pytest.approx(120.0 / 101.0)
    summary = {s["kind"]: s for s in result["summary"]}
    assert summary["separate"]["range"] == pytest.approx([120.0 / 105.0, 120.0 / 102.0])
    capsys.readouterr()
    assert process_sharing.main(["--report", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| mobilenet_v2 (32) | one, interleaved | 2 |")
    assert lines[3].startswith("| mobilenet_v2 (32) | one per contender | 2 |")


def test_measured_choices_alternates_the_kinds_and_names_what_moved(tmp_path, monkeypatch,
                                                                     capsys):
    """``benchmarks/measured_choices.py``: timing processes with an empty and a warm cache in
    turn with the rules' ones; per kind the median and the spread of the process medians; the
    methods that are not the rule's and those that differ between processes; the table from
    the JSON. The children are stand-ins (the real one: ``--child``)."""
    from benchmarks import measured_choices

    ms = iter([100.0, 110.0, 104.0, 100.0])
    verdicts = iter(["onednn", "conv"])

    def process(kind, args):
        layouts = [{"kernel": "forward", "x": [8, 7, 7, 64], "w": [1, 1, 64, 64],
                    "threading": "single", "source": "trial", "kept": "caller jit"}]
        decisions = [] if kind == "rule" else [
            {"kernel": "forward", "problem": "x[8, 7, 7, 64]", "dtype": "float32",
             "rule": "onednn", "verdict": next(verdicts), "lead": 0.2, "need": 0.05}]
        return {"kind": kind, "median_ms": next(ms), "onednn": "line",
                "decisions": decisions, "layouts": layouts}

    monkeypatch.setattr(measured_choices, "_process", process)
    out = tmp_path / "choices.json"
    assert measured_choices.main(["--processes", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [p["kind"] for p in result["processes"]] == ["empty", "rule", "warm", "rule"]
    s = result["summary"]
    assert s["rule"]["spread"] == pytest.approx(1.1) and s["timed"]["median_ms"] == 102.0
    assert s["timed_over_rule"] == pytest.approx(102.0 / 105.0)
    assert list(s["methods_not_the_rule"]) == ["forward x[8, 7, 7, 64] float32"]
    assert s["methods_that_moved"] == {"forward x[8, 7, 7, 64] float32": ["conv", "onednn"]}
    assert s["layouts_not_the_callers"] == [] and s["layouts_that_moved"] == {}
    capsys.readouterr()
    assert measured_choices.main(["--report", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| mobilenet_v2 (32), float32 | 105 (1.10, 2) | 100 (1.00, 1) |")
    assert lines[2].endswith("| 1 methods, 0 layouts; 1 moved |")


def test_measured_choices_ab_table_reads_each_process():
    from benchmarks import measured_choices
    taken = {"kernel": "weight", "problem": "x[8]", "rule": "onednn", "verdict": "winograd_4x4",
             "lead": 0.2, "need": 0.12}
    kept = {**taken, "kernel": "forward", "verdict": "onednn"}
    procs = [{"median_ms": {"timed": 99.0, "rule": 100.0}, "timed_over_rule": 0.99,
              "decisions": [taken, kept],
              "layouts_not_the_callers": ["data x[8, 7, 7, 64] w[3, 3, 1, 64]: blocked jit_dw"]},
             {"median_ms": {"timed": 103.0, "rule": 98.0}, "timed_over_rule": 103 / 98,
              "decisions": [{**taken, "lead": 0.3, "need": 0.1}], "layouts_not_the_callers": []}]
    text = measured_choices.ab_table([{"model": "resnet18", "batch": 8, "dtype": "bfloat16",
                                       "processes": procs}])
    assert text.splitlines()[2] == (
        "| resnet18 (8), bfloat16 | 99 | 1.021 (0.990, 1.051) | 1 (winograd_4x4 over onednn: "
        "leads 20%-30%, needed 10%-12%) | 1 (1 blocked data) |")
