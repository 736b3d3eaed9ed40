"""Many devices: the ops under jit with NamedSharding inputs and inside shard_map, on 8 simulated
CPU devices, equal to the single-device result (a child process: the device count is fixed
when JAX starts)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ops_on_eight_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.distributed.sharded_ops"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.strip() == "ok 13", proc.stdout
