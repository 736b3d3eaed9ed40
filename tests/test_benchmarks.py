"""The benchmark runner's parser and one tiny measurement (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from benchmarks import benchdnn, run


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
    assert run.main(["--lists", "conv_shapes_dilated", "--per-list", "1", "--reps", "1",
                     "--no-torch", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert set(row["median_ms"]) >= {"jaxconv", "jax.vjp"} and row["speedup_vs_vjp"] > 0
    assert "conv_shapes_dilated" in result["summary"]


def test_runner_backend_option(tmp_path, capsys):
    """--backend cpu runs here; --backend gpu without a GPU is a usage error, not a crash."""
    import jax

    out = tmp_path / "c.json"
    assert run.main(["--backend", "cpu", "--lists", "conv_shapes_mobilenet_dw", "--per-list", "1",
                     "--reps", "1", "--no-torch", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["meta"]["backend"] == "cpu"
    if not any(d.platform in ("gpu", "cuda", "rocm") for d in jax.devices()):
        with pytest.raises(SystemExit) as e:
            run.main(["--backend", "gpu", "--per-list", "1", "--no-torch"])
        assert e.value.code == 2
        assert "--backend gpu: JAX has no gpu backend here" in capsys.readouterr().err


def test_torch_gpu_contender():
    """On a GPU the cuDNN contender computes the same weight gradient as jaxconv; elsewhere it
    is absent (the row then has no torch column)."""
    import jax
    import numpy as np

    prob = benchdnn.load("conv_shapes_mobilenet_dw", batch_cap=2)[0]
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or jax.default_backend() == "cpu":
        assert run._torch_gpu_impl(prob, "wgrad", None, None, None) is None
        return
    impls = run.build(prob, "wgrad", gpu=True)
    got = impls["torch"]().block_until_ready().value.cpu().numpy()  # OIX
    ours = np.asarray(impls["jaxconv"]())  # XIO
    np.testing.assert_allclose(np.transpose(ours, (3, 2, 0, 1)), got, rtol=1e-4, atol=1e-4)


def test_timer_waits_for_every_array_of_every_call():
    """A training step returns a pytree: a sample must wait for all of it, for every call."""
    from benchmarks.run import _time_n

    waited = []

    class Pending:
        def block_until_ready(self):
            waited.append(self)
            return self

    _time_n(lambda: (Pending(), {"params": [Pending(), Pending()]}), 4)
    assert len(waited) == 12
