"""The training scripts of examples/ and the README's code run as a user runs them.

Each runs in a fresh child process (``import jaxconv`` at its top, the order a user's script
has), at a tiny size: one progress line per epoch, finite losses, exit status 0.
"""

from __future__ import annotations

import math
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py") if p.name != "common.py")
TINY = ["--epochs", "2", "--train", "64", "--test", "32", "--batch", "16", "--image", "16"]
LINE = re.compile(r"^epoch (\d+)/2: loss (\S+), held-out accuracy (\S+), .* \((\d+) steps\)$",
                  re.M)


def _run(args: list[str], cwd: pathlib.Path) -> str:
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Warning" not in done.stderr, done.stderr[-4000:]  # no late-import warning
    return done.stdout


def test_there_are_examples():
    assert {"flax_linen_resnet.py", "flax_nnx_cnn.py", "equinox_cnn.py"} <= set(EXAMPLES)


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_trains(script):
    out = _run([str(ROOT / "examples" / script), *TINY], cwd=ROOT)
    lines = LINE.findall(out)
    assert [int(e) for e, *_ in lines] == [1, 2], out
    for _, loss, accuracy, steps in lines:
        assert math.isfinite(float(loss)) and 0 <= float(accuracy) <= 1, out
        assert int(steps) == 4, out  # 64 images in batches of 16


def test_readme_code_runs_as_written(tmp_path):
    """Every python block of the README, each in a child process of its own, as written."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    for i, code in enumerate(blocks):
        path = tmp_path / f"readme_{i}.py"
        path.write_text(code)
        _run([str(path)], cwd=tmp_path)
