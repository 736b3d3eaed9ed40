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
def test_inference_part_writes_its_rows(tmp_path):
    out = tmp_path / "inference.json"
    assert model_run.main(["--parts", "inference", "--inference-models", "mnist_cnn",
                           "--inference-batches", "1", "--inference-rounds", "1",
                           "--inference-calls", "1", "--inference-contenders", "lax",
                           "accelerate", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["inference"]
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
