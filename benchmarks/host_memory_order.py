"""The usual training script per host-memory mechanism: what `import jaxconv` keeps, and costs.

Each mode runs in processes of its own (several, round-robin, so that a VM's slow phase hits
every mode alike), each the script people write: ``import jaxconv`` at the top, arrays,
the model's variables, then ``jax.jit(jaxconv.accelerate(step), donate_argnums=...)``:

* ``import``: jaxconv's default (``keep_at_import``: ``jaxconv.keep_freed_memory()`` at the
  import, before XLA:CPU's client exists: glibc keeps freed memory, dispatch synchronous);
* ``arena-only``: the alternative it was measured against: glibc's settings alone at the
  import (one arena, no ``mmap``, no trim), asynchronous dispatch kept;
* ``late``: JAX computes before ``import jaxconv`` (the worker threads keep their own arenas);
* ``off``: ``JAXCONV_KEEP_FREED_MEMORY=0`` (glibc's defaults).

Per process: the step's median time, minor page faults per step (``getrusage``; measured
again with glibc's heap sampled around each step: ``faults_line`` says why where high), the peak
resident memory, a loop that prepares the next batch in Python (NumPy, ``--prepare-ms`` of
work) while the step runs, and the time of a small eager operation. JSON with every process's
figures and the median per mode and model:

    python -m benchmarks.host_memory_order --models resnet18 --out order.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("import", "arena-only", "late", "off")


def child(mode: str, name: str, batchnorm: bool, steps: int, prepare_ms: float) -> dict:
    if mode in ("off", "arena-only"):
        os.environ["JAXCONV_KEEP_FREED_MEMORY"] = "0"
    if mode == "late":
        import jax.numpy as jnp
        jnp.zeros(3).block_until_ready()  # JAX's first computation, before jaxconv's import
    import warnings

    warnings.simplefilter("ignore")  # the late mode's warning (it is what this mode measures)
    import jaxconv
    from jaxconv._src import host_memory
    if mode == "arena-only":
        host_memory._mallopt_keep()  # glibc's settings alone, dispatch left asynchronous
    import resource

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from jaxconv._src.bench import models

    spec = models.MODELS[name]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((spec.batch, spec.image, spec.image, spec.channels)),
                    jnp.float32)
    labels = jnp.asarray(rng.integers(0, spec.classes, spec.batch), jnp.int32)
    model = models.build(name, jax.lax.conv_general_dilated, batchnorm)
    variables = jax.tree.map(jnp.asarray, models.init(name, x, batchnorm))
    params, stats = variables["params"], variables.get("batch_stats", {})
    tx = optax.sgd(0.01, momentum=0.9)
    opt = tx.init(params)

    def step(params, stats, opt, x, labels):
        def loss_fn(p):
            if batchnorm:
                logits, new = model.apply({"params": p, "batch_stats": stats}, x,
                                          mutable=["batch_stats"])
                return optax.softmax_cross_entropy_with_integer_labels(
                    logits, labels).mean(), new["batch_stats"]
            logits = model.apply({"params": p}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), stats
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), stats, opt, loss

    f = jax.jit(jaxconv.accelerate(step), donate_argnums=(0, 1, 2))
    for _ in range(2):
        params, stats, opt, loss = f(params, stats, opt, x, labels)
        loss.block_until_ready()
    from jaxconv._src import host_faults
    faults, times = host_faults.minor_faults(), []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, stats, opt, loss = f(params, stats, opt, x, labels)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    faults = (host_faults.minor_faults() - faults) / steps
    # each step's faults again, with glibc's heap sampled around it: the reason where high
    state = [params, stats, opt]

    def one() -> None:
        out = f(*state, x, labels)
        state[:] = out[:3]
        out[3].block_until_ready()
    why = host_faults.step_faults(one, calls=steps, warm=0)
    params, stats, opt = state
    # a loop that prepares the next batch (NumPy work of about prepare_ms) while the step runs
    host = rng.standard_normal(x.shape).astype(np.float32)

    def prepare() -> np.ndarray:
        t0, out = time.perf_counter(), host
        while (time.perf_counter() - t0) * 1e3 < prepare_ms:
            out = np.flip(host, axis=2) * np.float32(0.5) + np.float32(0.1)
        return out

    t_prep = time.perf_counter()
    prepare()
    prep_ms = (time.perf_counter() - t_prep) * 1e3
    t0 = time.perf_counter()
    for _ in range(steps):
        params, stats, opt, loss = f(params, stats, opt, x, labels)
        x = jnp.asarray(prepare())
    loss.block_until_ready()
    loop_ms = (time.perf_counter() - t0) / steps * 1e3
    # small eager operations
    a = jnp.ones((64,))
    for _ in range(50):
        a = a * 1.0001 + 1e-4
    a.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(500):
        a = a * 1.0001 + 1e-4
    a.block_until_ready()
    eager_us = (time.perf_counter() - t0) / 1000 * 1e6  # two operations an iteration
    return {"mode": mode, "model": name, "batchnorm": batchnorm, "batch": spec.batch,
            "image": spec.image, "jaxconv_mode": host_memory.mode(),
            "async_dispatch": bool(jax.config.read("jax_cpu_enable_async_dispatch")),
            "step_ms": statistics.median(times) * 1e3, "steps_ms": [t * 1e3 for t in times],
            "minor_faults_per_step": faults, "faults_line": why.line(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "prepare_ms": prep_ms, "loop_ms_per_step": loop_ms, "eager_op_us": eager_us,
            "loss": float(loss)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2",
                                                    "mnist_cnn"])
    ap.add_argument("--batchnorm", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=2, help="processes per mode and model")
    ap.add_argument("--prepare-ms", type=float, default=30.0)
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        mode, name, bn = args.child.split(",")
        print(json.dumps(child(mode, name, bool(int(bn)), args.steps, args.prepare_ms)))
        return 0
    rows = []
    for name in args.models:
        for bn in args.batchnorm:
            for run in range(args.runs):
                for mode in args.modes:  # round-robin: each run visits every mode
                    cmd = [sys.executable, "-m", "benchmarks.host_memory_order", "--child",
                           f"{mode},{name},{bn}", "--steps", str(args.steps),
                           "--prepare-ms", str(args.prepare_ms)]
                    env = {k: v for k, v in os.environ.items() if k != "JAXCONV_KEEP_FREED_MEMORY"}
                    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
                    if res.returncode != 0:
                        raise RuntimeError(f"{mode} {name} failed:\n{res.stderr[-3000:]}")
                    row = json.loads(res.stdout.strip().splitlines()[-1])
                    row["run"] = run
                    print(json.dumps({k: v for k, v in row.items() if k != "steps_ms"}),
                          flush=True)
                    rows.append(row)
    summary = []
    for name in args.models:
        for bn in args.batchnorm:
            per = {m: [r for r in rows if (r["model"], r["batchnorm"], r["mode"]) ==
                       (name, bool(bn), m)] for m in args.modes}
            med = {m: statistics.median(r["step_ms"] for r in rs) for m, rs in per.items() if rs}
            summary.append({
                "model": name, "batchnorm": bool(bn), "median_step_ms": med,
                "over_import": {m: v / med["import"] for m, v in med.items()}
                if "import" in med else None,
                "faults_per_step": {m: statistics.median(r["minor_faults_per_step"] for r in rs)
                                    for m, rs in per.items() if rs},
                "peak_rss_mib": {m: max(r["peak_rss_mib"] for r in rs) for m, rs in per.items()
                                 if rs},
                "loop_ms_per_step": {m: statistics.median(r["loop_ms_per_step"] for r in rs)
                                     for m, rs in per.items() if rs},
                "eager_op_us": {m: statistics.median(r["eager_op_us"] for r in rs)
                                for m, rs in per.items() if rs}})
            print(json.dumps(summary[-1]), flush=True)
    if args.out:
        from jaxconv._src.bench import machine
        with open(args.out, "w") as f:
            json.dump({"machine": machine.describe(),
                       "argv": sys.argv[1:], "summary": summary, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
