"""The ``jaxconv`` command line: check, shapes, bench, demo; errors and --help."""

from __future__ import annotations

import json
import os
import platform
import pathlib
import subprocess
import sys

import jax
import pytest

from jaxconv._src import checks, cli
from tests.support import helpers as h


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_check_passes_and_prints_a_row_per_op(capsys):
    rc, out, _ = run(capsys, "check")
    assert rc == 0
    ops = [name for name, *_ in checks._cases()]
    assert len(ops) == 13
    for op in ops:
        assert any(line.startswith(op + " ") and line.endswith("ok") for line in out.splitlines())
    assert "13 passed, 0 failed" in out
    if jax.default_backend() == "cpu" and platform.libc_ver()[0] == "glibc":
        assert "  probe: " in out and "minor page faults a step" in out  # host_faults.probe


def test_check_fails_with_a_nonzero_exit(capsys, monkeypatch):
    """A wrong result must turn the row into FAIL and the exit status into 1."""
    cases = checks._cases()
    op, family, got, ref = cases[2]
    monkeypatch.setattr(checks, "_cases", lambda: [(op, family, lambda: got() * 1.001, ref)])
    rc, out, _ = run(capsys, "check")
    assert rc == 1 and "FAIL" in out and "0 passed, 1 failed" in out


def test_shapes_resolves_auto_pad(capsys, monkeypatch):
    from jaxconv._src.lowering import tables
    monkeypatch.setattr(tables, "_onednn_pays", lambda p, kernel=None, xla="": False)  # the XLA:CPU rules
    rc, out, _ = run(capsys, "shapes", "convolution_backprop_filters", "input_forward=8,32,32,16",
                     "output_delta=8,16,16,32", "filter_shape=3,3,8,32", "strides=2,2",
                     "auto_pad=same_upper", "groups=2")
    assert rc == 0
    assert "output shape (3, 3, 8, 32)" in out
    rows = {ln[:38].strip(): ln[38:].strip() for ln in out.splitlines()[2:]}
    assert rows["pads_begin"] == "[0, 0]" and rows["pads_end"] == "[1, 1]"  # same_upper
    assert "cpu: per_group, gpu: vjp, default: vjp" in out


def test_shapes_of_the_seed_3d_example_computes_nothing(capsys):
    """1x8x447^3 float32 is 2.9 GB: only shape evaluation can answer this in a test."""
    rc, out, _ = run(capsys, "shapes", "group_convolution_backprop_data", "data=1,20,224,224,224",
                     "filters=4,5,2,3,3,3", "strides=2,2,2", "pads_begin=1,1,1", "pads_end=1,1,1")
    assert rc == 0 and "output shape (1, 8, 447, 447, 447)" in out


def test_shapes_takes_json_and_dtype(capsys):
    para = json.dumps({"strides": [1, 1], "padding": [0, 0, 0, 0], "dilations": [1, 1, 1, 1]})
    rc, out, _ = run(capsys, "shapes", "conv2d_backprop_filter", "input_x=1,1,7,7,16",
                     "out_backprop=1,1,7,7,16", "filter_sizes=16,16,1,1", f"para_dict={para}",
                     "--dtype", "float16")
    assert rc == 0 and "output shape (1, 1, 16, 16), dtype float32" in out


@pytest.mark.parametrize("argv,message", [
    (["shapes", "convolutio"], "unknown op 'convolutio'; one of: conv2d_backprop_filter"),
    (["shapes", "convolution", "input=1,8,8,3"], "convolution needs the shape of filter"),
    (["shapes", "convolution", "input=1,8,8,3", "filter=3,3,3,8", "foo=1"],
     "convolution has no argument 'foo'"),
    (["shapes", "convolution", "input=1,8,8,3", "filter=3,3,3,8", "strides"],
     "argument 'strides' is not NAME=VALUE"),
    (["shapes", "convolution", "input=a,b", "filter=3,3,3,8"], "input must be a shape"),
    (["shapes", "conv2d_backprop_filter", "input_x=1,1,7,7,16", "out_backprop=1,1,7,7,16",
      "filter_sizes=16,16,1,1", "para_dict={bad"], "not valid JSON"),
    # the op's own validation error, passed through
    (["shapes", "convolution", "input=1,8,8,3", "filter=3,3,4,8"],
     "convolution: filter [3, 3, 4, 8] in XIO format holds O=8, I=4"),
])
def test_bad_arguments_exit_2_with_a_message(capsys, argv, message):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and message in err and err.startswith("jaxconv shapes: ")


@pytest.mark.parametrize("command", ["check", "shapes", "bench", "demo"])
def test_help_for_each_command(capsys, command):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"] if command != "bench" else ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: jaxconv" in out and (command in out)


def test_no_command_prints_help_and_exits_2(capsys):
    rc, _, err = run(capsys)
    assert rc == 2 and "check" in err and "shapes" in err and "bench" in err


def test_bench_runs_the_runner(capsys, tmp_path):
    out = tmp_path / "r.json"
    rc, text, _ = run(capsys, "bench", "--backend", h.bench_backend(), "--lists",
                      "conv_shapes_dilated", "--per-list", "1", "--reps", "1", "--no-torch",
                      "--out", str(out))
    assert rc == 0 and out.exists() and "dilated_conv:1" in text
    assert json.loads(out.read_text())["rows"][0]["speedup_vs_vjp"] > 0


def test_bench_runs_from_a_built_wheel_outside_the_checkout(tmp_path):
    """The runner and its shape lists ship in the wheel: `jaxconv bench` works anywhere."""
    import zipfile

    root = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(root)], check=True,
                   capture_output=True)
    wheel = next((tmp_path / "dist").glob("jaxconv-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(site)
    assert "jaxconv/_src/bench/run.py" in names
    assert "jaxconv/_src/bench/shapes/conv_shapes_mobilenet_dw.txt" in names
    assert not [n for n in names if n.startswith(("benchmarks/", "tests/"))]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = subprocess.run(
        [sys.executable, "-c", "import jaxconv, sys; from jaxconv._src import cli; "
         "print(jaxconv.__file__); sys.exit(cli.main(sys.argv[1:]))",
         "bench", "--backend", h.bench_backend(), "--lists", "conv_shapes_mobilenet_dw",
         "--per-list", "1", "--reps", "1", "--no-torch"], cwd=work, env=env,
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(str(site)), proc.stdout[:200]  # the wheel's copy ran
    suffix = "-gpu" if h.bench_backend() == "gpu" else ""
    assert (work / "jaxconv-bench-results" / f"quick{suffix}.json").is_file()
    assert "median time per call in ms" in proc.stdout


def test_bench_help_lists_the_runner_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--", "--help"])
    assert e.value.code == 0 and "--preset" in capsys.readouterr().out


def test_demo(capsys):
    rc, out, _ = run(capsys, "demo")
    assert rc == 0 and "-> OK" in out


def test_python_dash_m_and_console_script_entry():
    proc = subprocess.run([sys.executable, "-m", "jaxconv", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "check" in proc.stdout
    from importlib.metadata import entry_points
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "jaxconv"]
    assert ep.value == "jaxconv._src.cli:main"
