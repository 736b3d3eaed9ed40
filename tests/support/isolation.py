"""pytest plugin: run ``@pytest.mark.isolated`` tests in a child process off CPU.

Some programs once aborted the whole process in XLA:GPU's compiler (a CHECK
failure, SIGABRT: docs/lowerings.md, "GPU (CUDA, ROCm)"). A test that
reaches such a program is marked ``isolated``; on a backend other than CPU (or
with ``JAXCONV_ISOLATE=1``) it runs in a child pytest of its own, so that an
abort fails that one test with the child's exit status and output, and the
run goes on. On CPU the marked tests run in-process: XLA:CPU compiles them
fine, and a child per test would cost seconds each.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import pytest

CHILD = "JAXCONV_ISOLATED_CHILD"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "isolated: reaches a program XLA:GPU once aborted on; "
                            "runs in a child process off CPU (tests/support/isolation.py)")


def _isolate() -> bool:
    if os.environ.get(CHILD):
        return False
    if os.environ.get("JAXCONV_ISOLATE") == "1":
        return True
    import jax

    return jax.default_backend() != "cpu"


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if pyfuncitem.get_closest_marker("isolated") is None or not _isolate():
        return None
    root = pathlib.Path(pyfuncitem.config.rootpath)
    env = dict(os.environ, **{CHILD: "1"})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
           "-p", "no:benchmark", "-m", "", pyfuncitem.nodeid]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    out = (proc.stdout + proc.stderr)[-4000:]
    if proc.returncode == 0:
        if " passed" not in proc.stdout and " skipped" in proc.stdout:
            pytest.skip(f"skipped in the child process:\n{out}")
        return True
    pytest.fail(f"the isolated child process failed ({_describe(proc.returncode)}):\n{out}",
                pytrace=False)
