"""The vendor ops' tests once more, without oneDNN, where the ``onednn`` extra is installed.

With the extra built, ``lowering="auto"`` gives oneDNN every problem it pays on, so the rest of
the suite checks the XLA:CPU formulations only where a test forces them. Here a child process
with ``JAXCONV_ONEDNN=0`` (the handler left unloaded, as without the extra) runs the tests of
the vendor ops' families (oneDNN's convolution, OpenVINO's, Ascend's), every upstream vector
(ONNX's ConvTranspose ones too) and the empty problems, so that the configuration without
oneDNN stays tested. Where the extra is not installed the main run is that configuration already.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from jaxconv._src.onednn import library

ROOT = pathlib.Path(__file__).resolve().parents[1]
# about 110 s on one core: the vendor families' tests and every upstream vector
FILES = ["tests/test_convolution.py", "tests/test_openvino.py", "tests/test_tbe.py",
         "tests/test_convolution_vectors.py", "tests/test_conv_transpose_vectors.py",
         "tests/test_openvino_vectors.py", "tests/test_empty_problems.py"]


@pytest.mark.skipif(not library.status().available,
                    reason="the onednn extra is not built: the main run is already without it")
def test_the_vendor_op_tests_pass_without_onednn():
    env = dict(os.environ, JAXCONV_ONEDNN="0", JAX_PLATFORMS="cpu")
    line = subprocess.run(
        [sys.executable, "-c", "from jaxconv._src.onednn import library; "
                               "print(library.status().line())"],
        capture_output=True, text=True, env=env, check=True, cwd=ROOT).stdout
    assert "not available (switched off by JAXCONV_ONEDNN=0)" in line, line
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *FILES], capture_output=True, text=True, env=env, cwd=ROOT)
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    assert " passed" in out.stdout and " failed" not in out.stdout, tail
