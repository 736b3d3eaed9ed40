"""Several processes: JAX's distributed runtime on 127.0.0.1, CPU collectives over gloo.

Two child processes (``tests/distributed/sgd_steps.py``) join ``jax.distributed.initialize``,
each takes half of one global batch and runs 3 SGD steps of a convolution block whose
gradients are jaxconv's, the gradients averaged across the processes; their parameters must
equal 3 steps on the whole batch in this process. Bounded in time; a free port; both children
reaped whatever happens (docs/distributed.md shows the launch commands).
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np

from tests.support import helpers as h
from tests.distributed import sgd_steps

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 240  # seconds for both processes together


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_processes_train_as_one(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    out = tmp_path / "params.npz"
    # one CPU device per process: no simulated devices that another test asked for
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), XLA_FLAGS=" ".join(flags))
    logs = [open(tmp_path / f"process{i}.log", "w+") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.sgd_steps", str(i), "2",
                               coordinator, str(out)], cwd=ROOT, env=env, stdout=logs[i],
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:  # a child left running (a timeout, a peer that died) is killed
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = []
    for f in logs:
        f.seek(0)
        texts.append(f.read())
        f.close()
    assert codes == [0, 0], "\n---\n".join(t[-3000:] for t in texts)
    assert all(f"process {i}: done" in t for i, t in enumerate(texts)), texts

    params, x, target = sgd_steps.init()
    step = jax.jit(lambda p, x, t: sgd_steps.sgd(p, jax.grad(sgd_steps.loss)(p, x, t)))
    for _ in range(sgd_steps.STEPS):
        params = step(params, x, target)
    got = np.load(out)
    for name, want in params.items():
        want = np.asarray(want)
        err = float(np.max(np.abs(got[name] - want)) / max(1.0, float(np.max(np.abs(want)))))
        assert err <= h.TOLERANCE["float32"], (name, err)
        assert not np.allclose(want, sgd_steps.init()[0][name])  # the steps moved it
