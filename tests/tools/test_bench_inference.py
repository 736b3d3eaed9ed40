"""The serving benchmark (``jaxconv bench models --parts inference``): each contender computes
the same forward pass (no timing asserted).

The flax models in inference mode are checked against their torch.nn twins in ``eval()`` and
against OpenVINO's compilation of those twins, independent implementations: the same
parameters and running statistics give the same outputs, DCGAN's transposed convolutions
included (its kernels reversed and their roles swapped for torch's ``ConvTranspose2d``).
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

pytest.importorskip("flax")
torch = pytest.importorskip("torch")
pytest.importorskip("openvino")

from jaxconv._src.bench import model_inference, model_run  # noqa: E402


@pytest.mark.parametrize("name", ["dcgan", "mnist_cnn"])
@jax.numpy_dtype_promotion("standard")  # flax's avg_pool divides by an int
def test_every_contender_computes_lax_forward_pass(name):
    row = model_inference.measure(name, 2, "float32", rounds=1, calls_per_round=1)
    assert set(row["median_ms"]) == set(model_inference.CONTENDERS)
    assert all(row["agrees"].values()), row["gap"]
    assert row["gap"]["lax"] == 0.0 and 0 < row["gap"]["torch"] <= row["tolerance"]
    assert row["over_accelerate"]["accelerate"] == 1.0
    assert all(row["p90_ms"][k] >= row["median_ms"][k] for k in row["median_ms"])


def test_running_statistics_are_no_identity():
    """BatchNorm in inference mode reads drawn statistics: a forward pass that ignored them
    (or used a batch's own) would not agree with the twin."""
    x = np.random.default_rng(0).standard_normal((1, 1, 1, 100)).astype(np.float32)
    v = model_inference.variables("dcgan", x)
    stats = model_inference.torch_models.flat_params(v["batch_stats"])
    assert all(np.std(s) > 0 for s in stats.values())
    twin = model_inference.torch_twin(torch, "dcgan", v)
    assert not twin.training
    assert np.allclose(twin[1].running_var.numpy(), np.asarray(v["batch_stats"]["bn0"]["var"]))


@jax.numpy_dtype_promotion("standard")
def _mnist_row(tmp_path, *options):
    """The inference part's one row: the MNIST CNN at batch 1, lax and accelerate, one round."""
    out = tmp_path / "inference.json"
    assert model_run.main(["--parts", "inference", "--inference-models", "mnist_cnn",
                           "--inference-batches", "1", "--inference-rounds", "1",
                           "--inference-contenders", "lax", "accelerate", *options,
                           "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["inference"]
    return row


def test_inference_part_writes_its_rows(tmp_path):
    row = _mnist_row(tmp_path, "--inference-calls", "1")
    assert row["model"] == "mnist_cnn" and row["batch"] == 1
    assert set(row["median_ms"]) == {"lax", "accelerate"}


def test_openvinos_telemetry_forks_before_jax_starts(tmp_path):
    """``import openvino`` forks a process (its telemetry): the benchmark imports it before
    JAX's backends start (machine.import_openvino), and its machine record reads OpenVINO's
    version from the package's metadata, so JAX never warns of a fork (a deadlock risk, and
    the parent's pages copy-on-write while contenders are timed)."""
    import subprocess
    import sys
    done = subprocess.run(
        [sys.executable, "-m", "jaxconv._src.bench.model_run", "--parts", "inference",
         "--inference-models", "mnist_cnn", "--inference-batches", "1", "--inference-rounds",
         "1", "--inference-calls", "1", "--inference-contenders", "lax", "openvino",
         "--out", str(tmp_path / "inference.json")],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "os.fork()" not in done.stderr, done.stderr[-3000:]
    result = json.loads((tmp_path / "inference.json").read_text())
    (row,) = result["inference"]
    assert row["agrees"]["openvino"], row["gap"]
    import openvino  # the machine record names the runtime timed, read without importing it
    assert result["machine"]["openvino"] == openvino.__version__.split("-")[0]


def _row(model, accelerate, openvino, gap=1e-5, agrees=True):
    return {"model": model, "batch": 1, "dtype": "float32", "description": model,
            "median_ms": {"accelerate": accelerate, "openvino": openvino},
            "p90_ms": {"accelerate": 2 * accelerate, "openvino": 2 * openvino},
            "calls": {"accelerate": 20, "openvino": 20}, "gap": {"accelerate": 0.0,
                                                                 "openvino": gap},
            "agrees": {"accelerate": True, "openvino": agrees}}


def test_runs_of_the_inference_part_merge_into_their_medians():
    runs = [[_row("dcgan", 1.6, 1.35), _row("mnist_cnn", 0.2, 0.3)],
            [_row("dcgan", 2.1, 1.36, gap=4e-4), _row("mnist_cnn", 0.3, 0.3)],
            [_row("dcgan", 1.7, 1.34, agrees=False), _row("mnist_cnn", 0.25, 0.3)]]
    dcgan, mnist = model_inference.merge_runs(runs)
    assert dcgan["median_ms"] == {"accelerate": 1.7, "openvino": 1.35}
    assert dcgan["p90_ms"] == {"accelerate": 3.4, "openvino": 2.7}
    assert dcgan["runs_median_ms"]["accelerate"] == [1.6, 2.1, 1.7]
    assert dcgan["spread"]["accelerate"] == pytest.approx(2.1 / 1.6)
    assert dcgan["calls"]["openvino"] == 60
    assert dcgan["gap"]["openvino"] == 4e-4 and not dcgan["agrees"]["openvino"]
    assert dcgan["runs_gap"]["openvino"] == [1e-5, 4e-4, 1e-5]
    assert dcgan["over_accelerate"]["openvino"] == pytest.approx(1.35 / 1.7)
    assert mnist["median_ms"]["accelerate"] == 0.25 and mnist["agrees"]["openvino"]
    with pytest.raises(ValueError, match="merge_runs: the runs' rows differ"):
        model_inference.merge_runs([runs[0], runs[1][::-1]])


def test_the_inference_part_runs_in_processes_of_its_own(tmp_path):
    row = _mnist_row(tmp_path, "--inference-calls", "2", "--inference-runs", "2")
    assert row["calls"] == {"lax": 4, "accelerate": 4}
    for k, each in row["runs_median_ms"].items():
        assert len(each) == 2 and row["median_ms"][k] == pytest.approx(sum(each) / 2)
    assert all(row["agrees"].values())
