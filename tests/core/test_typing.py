"""The package type-checks strictly (mypy --strict on jaxconv/, configured in pyproject.toml)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_mypy_strict_on_the_package():
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary",
                           "--cache-dir", str(ROOT / ".mypy_cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
