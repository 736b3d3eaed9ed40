"""The whole-model benchmark (``jaxconv bench models``): its flax models against their torch.nn
twins, its per-layer table and its result file (no timing asserted).

The flax models are checked against torch.nn, an independent implementation: the number of
convolutions a forward pass runs equals the twin's ``Conv2d`` modules (and the architectures'
published counts), and one training step (BatchNorm in training mode, cross-entropy, SGD with
momentum) from the same parameters and batch is as close to the twin's float64 step as the
twin's own float32 step is.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

pytest.importorskip("flax")
torch = pytest.importorskip("torch")

from jaxconv._src.bench import model_layers, model_run, model_steps, models, torch_models  # noqa: E402
from tests.support import helpers as h  # noqa: E402

TOL = h.TOLERANCE["float32"]


@pytest.mark.parametrize("name, convs", [("resnet18", 20), ("resnet50", 53), ("mobilenet_v2", 52)])
def test_a_forward_pass_runs_every_convolution_of_the_torch_twin(name, convs):
    """The convolutions traced in a flax forward pass: as many as the torch twin's Conv2d
    modules (torchvision's counts: 20, 53, 52), each distinct one with its count; only the
    stem reads the model's input."""
    found = models.record_convolutions(name, 2, 64)
    assert sum(n for _, n in found) == convs
    twin = torch_models._modules(torch, name, True, 10)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in twin.modules()) == convs
    assert [c.first for c, _ in found].count(True) == 1 and found[0][0].first
    assert len({c for c, _ in found}) == len(found)


def _torch_step_result(name, params, x, labels, batchnorm, dtype):
    """One SGD step of the torch twin in ``dtype``: the loss and the parameters (flax paths)."""
    from jaxconv._src.bench import torch_models
    m = torch_models.build(torch, name, params, batchnorm).to(dtype)
    opt = torch.optim.SGD(m.parameters(), lr=model_steps.LR, momentum=model_steps.MOMENTUM)
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(dtype)
    loss = torch.nn.functional.cross_entropy(m(xt), torch.from_numpy(labels.astype(np.int64)))
    loss.backward()
    opt.step()
    return float(loss.detach()), torch_models.params_back(m, params)


@pytest.mark.parametrize("name, batchnorm, batch, image",
                         [("resnet50", False, 2, 32), ("mobilenet_v2", True, 4, 64)])
def test_one_step_is_as_exact_as_torch_nn(request, name, batchnorm, batch, image):
    """One training step of the flax model with jaxconv's convolution, from the same parameters
    and batch as its torch twin, against the twin's step in float64 (the oracle): jaxconv's
    float32 loss and parameter updates are as close to it as torch.nn's own float32 step.

    The bound is torch's float32 error, not a fixed tolerance: one step's parameter update is
    the learning rate times a gradient that went through every layer's reductions (and, with
    BatchNorm, through 1/std of small batches), so its float32 rounding depends on the model,
    not only on the dtype. (With BatchNorm: maps of at least 2x2 over 4 examples; a 1x1 map
    over 2 examples has no meaningful variance.) At XLA's own optimisation level, as users
    compile: level 0 rounds XLA's reductions differently (tests/conftest.py).

    Float32 rounding moves the step further than its own size: ReLU's and ReLU6's kinks make
    the gradient jump wherever rounding moves a unit across one. MobileNetV2 with BatchNorm at
    4 x 64x64: x scaled by 1 + 1e-7 noise moved torch's float32 error from 6.2e-4 to 1.1e-2,
    and jaxconv's step was 1.1e-2 off in some processes under load (its rounding differed at
    1e-7 between processes: a timed choice made once per process, such as the layout
    trials). So torch's float32 error is taken over the batch as it is and over
    four copies of it perturbed by float32's epsilon (relative), each an equally valid float32
    computation of the step, and the bound is the largest of them."""
    if h.rerun_at_xla_default_level(request):
        return
    import jax
    import jax.numpy as jnp

    import jaxconv
    from jaxconv._src.bench import torch_models
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, image, image, 3)).astype(np.float32)
    labels = rng.integers(0, 1000, batch).astype(np.int32)
    variables = models.init(name, jnp.asarray(x), batchnorm)
    params, stats = variables["params"], variables.get("batch_stats", {})
    step, tx = model_steps._jax_step(models.build(name, jaxconv.conv_general_dilated, batchnorm),
                                   batchnorm)
    with jax.default_matmul_precision("float32"):  # GPUs round to TF32 by default
        new, _, _, loss = step(params, stats, tx.init(params), jnp.asarray(x),
                               jnp.asarray(labels))
    ours = torch_models.flat_params(jax.device_get(new))
    loss64, oracle = _torch_step_result(name, params, x, labels, batchnorm, torch.float64)
    loss32, theirs = _torch_step_result(name, params, x, labels, batchnorm, torch.float32)
    old = torch_models.flat_params(params)
    scale = max(float(np.max(np.abs(oracle[n] - old[n]))) for n in oracle)

    def error(got):  # the largest error of an update, relative to the largest update
        return max(float(np.max(np.abs(got[n] - oracle[n]))) for n in oracle) / scale
    eps = float(np.finfo(np.float32).eps)
    assert error(theirs) > 0  # the oracle is a different computation
    noise = np.random.default_rng(1)
    perturbed = [_torch_step_result(name, params, (x * (1 + eps * noise.standard_normal(x.shape)))
                                    .astype(np.float32), labels, batchnorm, torch.float32)[1]
                 for _ in range(4)]
    bound = max(error(t) for t in [theirs, *perturbed])
    assert error(ours) <= 4 * bound, (error(ours), error(theirs), bound)
    assert abs(float(loss) - loss64) <= 4 * abs(loss32 - loss64) + 4 * eps * abs(loss64)


def test_models_off_the_cpu_is_a_usage_error(monkeypatch, capsys):
    """Where JAX's default backend is not the CPU, ``jaxconv bench models`` says so and exits 2
    before it computes anything (its contenders are CPU programs)."""
    from jaxconv._src import cli
    from jaxconv._src.bench import machine

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(machine, "describe", lambda: pytest.fail("described the machine"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "models", "--models", "mnist_cnn", "--parts", "steps"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "default backend here is gpu" in err and "JAX_PLATFORMS=cpu" in err, err


def test_printed_steps_give_each_ratio_its_own_runs(capsys):
    """The printed line puts each contender's per-run ratios beside its own pooled ratio."""
    step = {"description": "ResNet-18", "mode": "default", "batchnorm": True, "dtype": "bfloat16",
            "median_ms": {"jaxconv": 260.0, "accelerate": 234.0, "torch": 305.0},
            "torch_over_jaxconv": 1.17, "torch_over_accelerate": 1.30,
            "torch_over_jaxconv_runs": [1.14, 1.04], "torch_over_accelerate_runs": [1.33, 1.18],
            "loss_gap": 0.0, "param_gap": 0.0}
    model_run._print({"machine": {"peak": {"gflops": 200.0}}, "steps": [step]})
    out = capsys.readouterr().out
    assert "torch/jaxconv 1.17 (runs 1.14, 1.04) torch/accelerate 1.30 (runs 1.33, 1.18)" in out, out
    assert "spread" not in out  # one value per run: none printed without it


def test_each_contenders_per_process_spread_is_printed_beside_its_median(capsys):
    runs = [{"accelerate": 240.0, "torch": 300.0}, {"accelerate": 264.0, "torch": 290.0},
            {"accelerate": 250.0}]
    spread = model_steps.spread(runs)
    assert spread == pytest.approx({"accelerate": 1.1, "torch": 300 / 290})
    assert model_steps.spread(runs[:1]) == {"accelerate": 1.0, "torch": 1.0}
    step = {"description": "MobileNetV2", "mode": "kept", "batchnorm": True, "runs": 3,
            "median_ms": {"accelerate": 250.0, "torch": 295.0}, "spread": spread,
            "torch_over_jaxconv": None, "torch_over_accelerate": 1.18, "loss_gap": 0.0,
            "param_gap": 0.0}
    model_run._print({"machine": {"peak": {"gflops": 200.0}}, "steps": [step]})
    out = capsys.readouterr().out
    assert ("per-process spread (slowest / fastest of 3 processes): accelerate 1.10, "
            "torch 1.03") in out, out


def test_runner_end_to_end(tmp_path):
    """``jaxconv bench models`` on ResNet-18 at 32x32 without BatchNorm (its 1x1 maps of two
    examples would leave BatchNorm no variance to speak of): a child process whose three
    contenders (lax, jaxconv's explicit hooks, the unmodified model under jaxconv.accelerate, torch)
    agree, the peak resident memory of the child, the per-layer table (no data gradient at the input layer), the machine
    (both oneDNN versions, threads, a positive peak and how it was obtained), a plot."""
    from jaxconv._src import cli
    out = tmp_path / "models.json"
    argv = ["bench", "models", "--models", "resnet18", "--image", "32", "--batch", "2", "--reps",
            "1", "--runs", "1", "--modes", "kept", "--no-batchnorm", "--out", str(out)]
    if jax.default_backend() != "cpu":  # it times the CPU's steps: elsewhere a usage error
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2 and not out.exists()
        return
    assert cli.main(argv) == 0
    result = json.loads(out.read_text())
    (step,) = result["steps"]
    assert step["mode"] == "kept"
    assert set(step["median_ms"]) == {"lax", "jaxconv", "accelerate", "torch"}
    assert step["loss_gap"] < TOL and step["param_gap"] < TOL
    assert step["torch_over_accelerate"] == pytest.approx(
        step["median_ms"]["torch"] / step["median_ms"]["accelerate"])
    assert step["host_memory"] == ["kept"] and step["peak_rss_mib"][0] > 0
    assert step["processes"] == "contenders interleaved in one"
    faults = step["minor_faults_per_step"]  # each contender's, counted around its samples
    assert set(faults) == set(step["median_ms"]) and all(v >= 0 for v in faults.values())
    # the max pool timed alone (flax's, jaxconv's, jaxconv's with XLA's argmax, torch's), at the shape the model's pool reads
    # (the 16x16 output of the stride-2 stem), computing the same gradient; and the steps
    # without it (the jaxconv step's pool is jaxconv.max_pool)
    pool = step["max_pool"]
    assert pool["input"] == [2, 16, 16, 64] and pool["gap"] < TOL
    t, m = pool["median_ms"], step["median_ms"]
    assert set(t) == {"xla", "jaxconv", "jaxconv_xla_argmax", "torch"}
    assert step["torch_over_jaxconv_without_max_pool"] == pytest.approx(
        (m["torch"] - t["torch"]) / (m["jaxconv"] - t["jaxconv"]))
    (layers,) = result["layers"]
    kinds = [(r["layer"], r["kind"]) for r in layers["rows"]]
    stem = kinds[0][0]
    assert (stem, "dgrad") not in kinds and (stem, "wgrad") in kinds
    assert len(kinds) == 3 * 11 - 1  # 11 distinct convolutions in ResNet-18
    counts = {r["layer"]: r["count"] for r in layers["rows"]}
    assert sum(counts.values()) == 20
    rows = layers["rows"]  # the summary is the rows' count-weighted sum and their worst ratio
    weighted = (sum(r["count"] * r["median_ms"]["jaxconv"] for r in rows)
                / sum(r["count"] * r["median_ms"]["torch"] for r in rows))
    assert layers["step_weighted"] == pytest.approx(weighted, rel=1e-12)
    assert layers["worst"] == max(r["jaxconv_over_torch"] for r in rows)
    # each row names what jaxconv's oneDNN handler chose for its calls (where oneDNN ran them)
    kernel = {"fwd": "forward", "dgrad": "data", "wgrad": "weight"}
    assert all(c["kernel"] == kernel[r["kind"]] and c["candidates"]
               for r in rows for c in r["onednn_choices"])
    from jaxconv._src.native import library
    assert any(r["onednn_choices"] for r in rows) == library.status().available
    m = result["machine"]
    assert m["torch"]["onednn"] and m["torch"]["threads"] >= 1 and m["xla_threads"] >= 1
    assert m["peak"]["gflops"] > 0 and m["peak"]["how"]
    assert out.with_suffix(".png").exists()


def test_separate_processes_time_each_contender_alone(tmp_path, capsys):
    """``--separate``: each contender's steps in a process of its own, merged into one row (the
    ratios, each one's faults, the first steps' loss gap across the processes; no parameter
    gap), as the report's table prints it."""
    from jaxconv._src import cli
    from jaxconv._src.bench import model_report
    if jax.default_backend() != "cpu":
        pytest.skip("times the CPU's steps")
    out = tmp_path / "models.json"
    assert cli.main(["bench", "models", "--models", "mnist_cnn", "--batch", "2", "--reps", "1",
                     "--runs", "1", "--parts", "steps", "--separate", "--contenders",
                     "accelerate", "torch", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (step,) = result["steps"]
    assert step["processes"] == "one per contender"
    assert set(step["median_ms"]) == set(step["minor_faults_per_step"]) == {"accelerate", "torch"}
    assert step["torch_over_accelerate"] == pytest.approx(
        step["median_ms"]["torch"] / step["median_ms"]["accelerate"])
    assert step["loss_gap"] < TOL and step["param_gap"] is None
    assert step["torch_layout"] in ("channels_last", "NCHW")  # from torch's process
    capsys.readouterr()
    assert model_report.main([str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].endswith("| minor faults a step, jaxconv / accelerate / torch |")
    assert table[2].split("|")[-2].strip().startswith("- / ")  # no jaxconv contender here


def test_layer_tables_of_several_processes_pool_their_samples():
    """``--layer-runs``: each row is the median of every process's samples (not a median of
    medians), its ratio from those; each process's own ratios, worst row and weighted sum are
    kept beside the pooled ones."""
    def table(jax_ms, torch_ms):
        rows = []
        for layer, count, j, t in zip(("a", "b"), (3, 1), jax_ms, torch_ms):
            rows.append({"layer": layer, "kind": "fwd", "count": count, "gflop": 1.0,
                         "samples_ms": {"jaxconv": j, "torch": t},
                         "median_ms": {"jaxconv": float(np.median(j)), "torch": float(np.median(t))},
                         "onednn_choices": []})
            rows[-1]["jaxconv_over_torch"] = rows[-1]["median_ms"]["jaxconv"] / float(np.median(t))
        return model_layers._summary({"model": "m", "batch": 8, "image": 32, "dtype": "float32"}, rows)

    one = table([[1.0, 2.0, 9.0], [4.0, 4.0, 4.0]], [[2.0, 2.0, 2.0], [5.0, 5.0, 5.0]])
    two = table([[1.0, 1.0, 1.0], [6.0, 6.0, 6.0]], [[2.0, 2.0, 2.0], [5.0, 5.0, 5.0]])
    got = model_layers._pooled([one, two])
    a, b = got["rows"]
    assert a["median_ms"] == {"jaxconv": 1.0, "torch": 2.0}  # median of 1,2,9,1,1,1
    assert a["jaxconv_over_torch"] == 0.5 and b["jaxconv_over_torch"] == 1.0
    assert a["process_ratios"] == [1.0, 0.5] and b["process_ratios"] == [0.8, 1.2]
    assert a["paired_ratio_range"] == [0.5, 4.5] and len(a["samples_ms"]["torch"]) == 6
    assert got["worst"] == 1.0 and got["worst_per_process"] == [1.0, 1.2]
    assert got["step_weighted"] == pytest.approx((3 * 1.0 + 5.0) / (3 * 2.0 + 5.0))
    assert got["step_weighted_per_process"] == [one["step_weighted"], two["step_weighted"]]
    assert got["processes"] == 2 and got["model"] == "m"


def test_bfloat16_table_needs_the_instructions(capsys):
    """The bfloat16 per-layer table is refused, with the reason, where jaxconv's oneDNN does
    not compute bfloat16 on this CPU."""
    from jaxconv._src.native import library
    if "bfloat16" in library.status().dtypes:
        pytest.skip("this CPU's oneDNN computes bfloat16: the table runs")
    with pytest.raises(SystemExit):
        model_run.main(["--dtype", "bfloat16", "--parts", "layers"])
    assert "does not compute bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fwd", "dgrad", "wgrad"])
def test_torch_contender_takes_bfloat16(kind):
    """The per-layer table in bfloat16 (``--dtype bfloat16``): torch's kernel gets bfloat16
    operands holding the same values, and its result equals jaxconv's at bfloat16's bound."""
    import jax.numpy as jnp

    from jaxconv._src.bench import benchdnn, run
    p = benchdnn.Problem("t", "m", 2, 2, 4, 8, (7, 6), (4, 6), (3, 3), (2, 1), (1, 1), (1, 1), (1, 1))
    impls = run.build(p, kind, dtype=jnp.bfloat16)
    ours, theirs = np.asarray(impls["jaxconv"]()), impls["torch"]()
    assert theirs.dtype == torch.bfloat16
    perm = (0, 2, 3, 1) if kind != "wgrad" else (2, 3, 1, 0)  # NCHW / OIHW -> NHWC / HWIO
    h.assert_close(ours.astype(np.float32), theirs.float().numpy().transpose(perm), jnp.bfloat16)


@pytest.mark.parametrize("name, batchnorm, batch, image",
                         [("resnet18", False, 2, 32), ("mobilenet_v2", True, 8, 96)])
def test_one_bfloat16_step_agrees_with_torch_autocast(name, batchnorm, batch, image):
    """``--dtype bfloat16``: one mixed-precision step (flax's dtype=jnp.bfloat16, float32
    parameters) of the hooked and the accelerated model agrees with the torch twin's under
    ``torch.autocast("cpu", torch.bfloat16)`` at bfloat16's bound: the loss and every parameter
    after the SGD update are as close to torch's bfloat16 step as that is to torch's own float32
    step (twice that, plus bfloat16's tolerance of the parameters' scale): with BatchNorm over
    a few positions, bfloat16's rounding moves a step far more than its epsilon."""
    import jax
    with jax.numpy_dtype_promotion("standard"):  # flax's BatchNorm mixes bfloat16 and float32
        row = model_steps.measure_steps(name, batch, image, 1, batchnorm,
                                        ("jaxconv", "accelerate", "torch"), bfloat16=True)
    assert row["dtype"].startswith("bfloat16")
    rng = np.random.default_rng(0)  # the inputs measure_steps drew
    spec = models.MODELS[name]
    x = rng.standard_normal((batch, image, image, spec.channels)).astype(np.float32)
    labels = rng.integers(0, spec.classes, batch).astype(np.int32)
    params = models.init(name, jax.numpy.asarray(x), batchnorm)["params"]
    (_, f32), (_, b16) = (model_steps._torch_step(name, params, x, labels, batchnorm, b)
                          for b in (False, True))
    own_loss = abs(f32["loss"] - b16["loss"])
    own_param = max(float(np.max(np.abs(f32["params"][n] - b16["params"][n])))
                    for n in f32["params"])
    rtol = h.TOLERANCE["bfloat16"]
    for k in ("accelerate", "torch"):
        gap = row["gaps"][k]
        assert gap["loss"] <= 2 * own_loss + rtol, (k, gap, own_loss)
        assert gap["param"] <= 2 * own_param + rtol * row["param_scale"], (k, gap, own_param)


def test_a_timed_batch_of_donating_steps_waits_for_the_state_it_holds():
    """A fast step is timed in batches of back-to-back calls, each donating its state to the
    next: the batch waits for the state the loop holds, not for the donated one (which failed
    with 'called on deleted or donated buffer')."""
    import jax
    import jax.numpy as jnp

    from jaxconv._src.bench import timing

    def _step(params, stats, opt, x, labels):
        new = jax.tree.map(lambda p: p - 0.1 * x.mean(), params)
        return new, stats, opt, jnp.sum(new["w"]) + jnp.sum(labels).astype(jnp.float32)

    step = jax.jit(_step, donate_argnums=(0, 1, 2))
    run = model_steps._training_loop(step, {"w": jnp.ones(4)}, {}, {"m": jnp.zeros(4)},
                                     jnp.ones(3), jnp.arange(2))
    assert timing._time_n(run, 3) > 0
