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

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


# The two programs that aborted XLA:GPU's Triton GEMM fusion on an H100 (docs/performance.md,
# "The XLA:GPU abort"), each in a child process on this run's backend: on a GPU an abort fails
# the test, elsewhere they are ordinary checks of the same programs.
GPU_REPRODUCTIONS = {
    # the "dot" weight gradient of a 2D 1x1 problem, NXC/XIO, one group
    "dot-1x1-weight-gradient": """
import jax.numpy as jnp, numpy as np, jaxconv, jaxconv.testing
from jax import lax
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((2, 9, 7, 4)), jnp.float32)
dy = jnp.asarray(rng.standard_normal((2, 9, 7, 3)), jnp.float32)
for m in ("auto", "dot"):
    dw = jaxconv.convolution_backprop_filters(x, dy, (1, 1, 4, 3), precision="highest", lowering=m)
    ref = jnp.einsum("nhwi,nhwo->io", x, dy, precision=lax.Precision.HIGHEST)[None, None]
    jaxconv.testing.assert_close(dw, ref, jnp.float32)
print("ok")
""",
    # the second derivative through the 3D path, NCX/XIO, valid padding
    "order-2-through-3d-dot": """
import jax, jax.numpy as jnp, numpy as np, jaxconv
from jaxconv.testing import check_grads
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((2, 4, 5, 4, 5)), jnp.float32)
dy = jnp.asarray(rng.standard_normal((2, 3, 4, 3, 4)), jnp.float32)
a = dict(data_format="NCX", precision="highest", lowering="dot")
f = lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, (2, 2, 2, 4, 3), **a)
check_grads(f, (x, dy), order=2)
print("ok")
""",
}


@pytest.mark.parametrize("name", sorted(GPU_REPRODUCTIONS))
def test_gpu_abort_reproductions_run_in_a_child(name):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run([sys.executable, "-c", GPU_REPRODUCTIONS[name]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        f"child exited with {proc.returncode} (negative = killed by a signal)\n{proc.stdout}\n"
        f"{proc.stderr[-3000:]}")
