"""The configuration without oneDNN, where the ``onednn`` extra is installed.

A child process with ``JAXCONV_ONEDNN=0`` (the handler left unloaded, as without the extra)
runs the 1-D and 2-D tests of oneDNN's convolution family and every upstream vector (ONNX's
ConvTranspose ones too), so that the package without oneDNN stays tested: nothing registered,
every ``"auto"`` choice an XLA formulation. (The family's 3-D cases, 60% of that file's time,
take the XLA formulations in the main run already.) The rest of the suite needs no second run: its problems
are small, so ``lowering="auto"`` gives them the XLA formulations with the extra built too (of
the 370 tests that chose a lowering in the vendor families' files and the vector files, 4
reached oneDNN in one run on a 2-core Zen 3 EPYC, AVX2), and the lowering tests force every
formulation.
Where the extra is not installed the main run is that configuration already.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from jaxconv._src.native import library

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the files and selection the child runs: about 60 s alone (2-core AMD EPYC, AVX2; 125 s with the family's 3-D cases)
ARGS = ["tests/ops/test_convolution.py", "tests/ops/test_convolution_vectors.py",
         "tests/ops/test_conv_transpose_vectors.py", "tests/ops/test_openvino_vectors.py",
         "-k", "not (3d and test_convolution.py)"]


@pytest.mark.skipif(not library.status().available,
                    reason="the onednn extra is not built: the main run is already without it")
def test_the_vendor_op_tests_pass_without_onednn():
    env = dict(os.environ, JAXCONV_ONEDNN="0", JAX_PLATFORMS="cpu")
    line = subprocess.run(
        [sys.executable, "-c", "from jaxconv._src.native import library; "
                               "print(library.status().line())"],
        capture_output=True, text=True, env=env, check=True, cwd=ROOT).stdout
    assert "not available (switched off by JAXCONV_ONEDNN=0)" in line, line
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *ARGS], capture_output=True, text=True, env=env, cwd=ROOT)
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    assert " passed" in out.stdout and " failed" not in out.stdout, tail
