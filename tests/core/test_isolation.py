"""The isolation plugin (tests/support/isolation.py): an abort in an isolated test fails that test only."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONFTEST = 'pytest_plugins = ["tests.support.isolation"]\n'
TESTS = '''
import os
import pytest


@pytest.mark.isolated
def test_aborts():
    os.abort()


@pytest.mark.isolated
def test_isolated_and_fine():
    assert 1 + 1 == 2


def test_after():
    assert True
'''


def test_an_abort_fails_one_test_and_the_run_goes_on(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_child.py").write_text(TESTS)
    env = dict(os.environ, JAXCONV_ISOLATE="1", PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("JAXCONV_ISOLATED_CHILD", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:benchmark", "-n", "0", "-W", "error", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 2 passed" in out, out
    assert "test_aborts" in out and "killed by SIGABRT" in out, out
