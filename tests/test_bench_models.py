"""The whole-model benchmark (``jaxconv bench models``): its flax models against their torch.nn
twins, its per-layer table and its result file (no timing asserted).

The flax models are checked against torch.nn, an independent implementation: the number of
convolutions a forward pass runs equals the twin's ``Conv2d`` modules (and the architectures'
published counts), and one training step (BatchNorm in training mode, cross-entropy, SGD with
momentum) from the same parameters and batch gives the same loss and parameters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flax")
torch = pytest.importorskip("torch")

from jaxconv._src.bench import model_run, models, torch_models  # noqa: E402
from tests import helpers as h  # noqa: E402

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


@pytest.mark.parametrize("name, batchnorm, batch, image",
                         [("resnet50", False, 2, 32), ("mobilenet_v2", True, 4, 64)])
def test_one_step_equals_torch_nn(name, batchnorm, batch, image):
    """One training step of the flax model with jaxconv's convolution and of its torch twin,
    from the same parameters and batch: the same loss and parameters (with BatchNorm, maps of
    at least 2x2 over 4 examples: a 1x1 map over 2 examples has no meaningful variance)."""
    r = model_run.measure_steps(name, batch, image, 1, batchnorm, ("jaxconv", "torch"))
    assert set(r["median_ms"]) == {"jaxconv", "torch"}
    assert r["loss_gap"] < 10 * TOL and r["param_gap"] < 10 * TOL * r["param_scale"], r["gaps"]


def test_runner_end_to_end(tmp_path):
    """``jaxconv bench models`` on ResNet-18 at 32x32 without BatchNorm (its 1x1 maps of two
    examples would leave BatchNorm no variance to speak of): a child process whose three
    contenders agree, the per-layer table (no data gradient at the input layer), the machine
    (both oneDNN versions, threads, a positive peak and how it was obtained), a plot."""
    from jaxconv._src import cli
    out = tmp_path / "models.json"
    assert cli.main(["bench", "models", "--models", "resnet18", "--image", "32", "--batch", "2",
                     "--reps", "1", "--runs", "1", "--modes", "kept", "--no-batchnorm",
                     "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (step,) = result["steps"]
    assert step["mode"] == "kept" and set(step["median_ms"]) == {"lax", "jaxconv", "torch"}
    assert step["loss_gap"] < TOL and step["param_gap"] < TOL
    (layers,) = result["layers"]
    kinds = [(r["layer"], r["kind"]) for r in layers["rows"]]
    stem = kinds[0][0]
    assert (stem, "dgrad") not in kinds and (stem, "wgrad") in kinds
    assert len(kinds) == 3 * 11 - 1  # 11 distinct convolutions in ResNet-18
    counts = {r["layer"]: r["count"] for r in layers["rows"]}
    assert sum(counts.values()) == 20
    assert np.isfinite(layers["step_weighted"]) and layers["worst"] >= layers["step_weighted"] * 0.5
    m = result["machine"]
    assert m["torch"]["onednn"] and m["torch"]["threads"] >= 1 and m["xla_threads"] >= 1
    assert m["peak"]["gflops"] > 0 and m["peak"]["how"]
    assert out.with_suffix(".png").exists()


def test_bfloat16_table_needs_the_instructions(capsys):
    """The bfloat16 per-layer table is refused, with the reason, where jaxconv's oneDNN does
    not compute bfloat16 on this CPU."""
    from jaxconv._src.onednn import library
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
