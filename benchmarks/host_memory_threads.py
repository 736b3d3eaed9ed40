"""Which threads fault fresh pages in a CPU training step, per host-memory mode.

A flax model (written with ``lax``; the step under ``jaxconv.accelerate``) trains for a few
steps in one of three modes, each in its own process:

* ``early``: jaxconv's default, applied by ``import jaxconv`` before JAX's backends exist;
* ``late``: ``import jaxconv`` after JAX's first computation (glibc's settings only, at the
  first kernel: XLA:CPU's dispatch and worker threads keep their own arenas);
* ``default``: opted out (``JAXCONV_KEEP_FREED_MEMORY=0``), glibc's defaults.

For each it reports the step's median time, the mode jaxconv reports, and the minor page
faults per step of each thread (from ``/proc/self/task``), as JSON:

    python -m benchmarks.host_memory_threads --model mobilenet_v2 --out faults.json

docs/training.md, "Host memory", says what the modes mean for a user.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _faults() -> dict[str, tuple[str, int]]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:  # the thread ended
            continue
        out[tid] = (name, int(stat.rsplit(")", 1)[1].split()[7]))  # minflt
    return out


def child(mode: str, model_name: str, batch: int, steps: int) -> dict:
    if mode == "default":
        os.environ["JAXCONV_KEEP_FREED_MEMORY"] = "0"
    import warnings

    import jax
    import jax.numpy as jnp
    import optax

    if mode == "late":
        jnp.zeros(3).block_until_ready()  # JAX's backends exist from here on
    warnings.simplefilter("ignore")  # the late import's warning (what that mode measures)
    import jaxconv
    from jaxconv._src import host_memory
    from jaxconv._src.bench import models

    x = jnp.ones((batch, 224, 224, 3))
    labels = jnp.zeros((batch,), jnp.int32)
    model = models.build(model_name, jax.lax.conv_general_dilated, False)
    params = model.init(jax.random.PRNGKey(0), x[:1])["params"]
    tx = optax.sgd(0.1, 0.9)
    opt = tx.init(params)

    def step(params, opt, x, labels):
        def loss(p):
            logits = model.apply({"params": p}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    f = jax.jit(jaxconv.accelerate(step), donate_argnums=(0, 1))
    for _ in range(2):
        params, opt, value = f(params, opt, x, labels)
        value.block_until_ready()
    before, times = _faults(), []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, opt, value = f(params, opt, x, labels)
        value.block_until_ready()
        times.append(time.perf_counter() - t0)
    after = _faults()
    threads = {f"{name} {tid}": (n - before.get(tid, (name, 0))[1]) // steps
               for tid, (name, n) in after.items()}
    return {"mode": mode, "jaxconv_mode": host_memory.mode(), "model": model_name,
            "batch": batch, "median_ms": statistics.median(times) * 1e3,
            "faults_per_step": {k: v for k, v in threads.items() if v >= 100}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v2",
                    choices=["resnet18", "resnet50", "mobilenet_v2"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=["early", "late", "default"])
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.model, args.batch, args.steps)))
        return 0
    rows = []
    for mode in args.modes:
        cmd = [sys.executable, "-m", "benchmarks.host_memory_threads", "--child", mode,
               "--model", args.model, "--batch", str(args.batch), "--steps", str(args.steps)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(res.stdout.strip().splitlines()[-1])
        print(json.dumps(row))
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "argv": sys.argv[1:]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
