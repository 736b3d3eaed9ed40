"""HAZARDS.md section 1: no jaxconv op may abort the process (jaxlib 0.10.2 CPU).

The checks run in child processes (``tests/hazards/xla_vjp_abort.py``), so a
regression fails a test instead of killing the test run.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jaxlib
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tests.hazards.xla_vjp_abort", mode],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("mode", ["jaxconv", pytest.param("jaxconv-full", marks=pytest.mark.slow)])
def test_jaxconv_ops_survive_the_strided_dilated_family(mode):
    """Every op, its gradient and its second derivative on the reproducer and neighbours.

    The default run takes the reproducer and 8 neighbours; ``-m slow`` the 33-case family.
    """
    proc = _run(mode)
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode} (negative = killed by a signal) on jaxlib "
        f"{jaxlib.__version__}\n{proc.stdout}\n{proc.stderr[-3000:]}")
    assert proc.stdout.startswith("ok ")


@pytest.mark.skipif(jaxlib.__version__ != "0.10.2",
                    reason=f"the abort was recorded on jaxlib 0.10.2, this is {jaxlib.__version__}")
def test_the_reproducer_still_aborts_plain_jax_vjp():
    """Proves the configuration above is a live hazard on this jaxlib (a test of the test)."""
    proc = _run("plain")
    assert proc.returncode != 0
    assert "Window dimensions do not match RHS shape" in proc.stderr
