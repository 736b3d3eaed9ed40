"""Whole training steps of the models, per contender and memory mode (``jaxconv bench
models --parts steps``; the runner: ``model_run.py``): each mode in child processes of its
own, each step timed interleaved (or, ``--separate``, each contender in a process of its
own) with its minor page faults, one step of each contender checked against the others, and
a ResNet's stem max pool timed alone."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src import host_memory
from jaxconv._src.bench import models
from jaxconv._src.bench.timing import _time_n, interleaved
from jaxconv._src.lowering.measured import usable_cpus

CONTENDERS = ("lax", "jaxconv", "accelerate", "torch")
LR, MOMENTUM = 0.01, 0.9


# --------------------------------------------------------------------------- steps

def _jax_step(model: Any, batchnorm: bool, donate: bool = False,
              accelerate: bool = False) -> tuple[Callable, Any]:
    """The jitted training step ``(params, stats, opt, x, labels) -> (params, stats, opt,
    loss)`` and its optax optimizer; with ``donate`` the step takes over the buffers of its
    parameters, statistics and optimizer state (``donate_argnums``, as a training loop
    compiles it: XLA then updates them in place, as ``torch.optim`` does); with
    ``accelerate``, ``jax.jit(jaxconv.accelerate(step))``."""
    import optax  # type: ignore[import-untyped]
    tx = optax.sgd(LR, momentum=MOMENTUM)

    def loss_fn(params: Any, stats: Any, x: jax.Array, labels: jax.Array) -> Any:
        if batchnorm:
            logits, new = model.apply({"params": params, "batch_stats": stats}, x,
                                      mutable=["batch_stats"])
            stats = new["batch_stats"]
        else:
            logits = model.apply({"params": params}, x)
        # in float32, as torch.autocast computes its cross-entropy (a bfloat16 model's logits)
        loss = optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), labels).mean()
        return loss, stats

    def step(params: Any, stats: Any, opt: Any, x: jax.Array, labels: jax.Array) -> Any:
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, labels)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), stats, opt, loss
    if accelerate:
        import jaxconv
        step = jaxconv.accelerate(step)
    return jax.jit(step, donate_argnums=(0, 1, 2) if donate else ()), tx


def _training_loop(step: Callable, params: Any, stats: Any, opt: Any, x: jax.Array,
                   labels: jax.Array) -> Callable[[], Any]:
    """A zero-argument call of a donating ``step`` that carries its state from call to call
    (copies of ``params`` and ``stats``: the caller's stay valid), as a training loop does."""
    state = [jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, stats), opt]

    def run() -> Any:
        new_params, new_stats, new_opt, loss = step(*state, x, labels)
        state[:] = [new_params, new_stats, new_opt]
        # the loss, and the state the loop holds now: a timed batch of calls waits for the last
        # call's state (this call's is donated to the next, and waiting on it then fails)
        return loss, state
    return run


def _torch_step(name: str, params: Any, x: np.ndarray, labels: np.ndarray,
                batchnorm: bool, bfloat16: bool = False) -> tuple[Callable, dict[str, Any]] | None:
    """A zero-argument torch training step in the faster memory format, and one step's
    result from ``params`` (loss, parameters in flax layouts, the format); ``bfloat16``: the
    forward under ``torch.autocast("cpu", torch.bfloat16)``, parameters float32."""
    try:
        import torch
    except ImportError:
        return None
    from jaxconv._src.bench import torch_models
    torch.set_num_threads(usable_cpus())
    lt = torch.from_numpy(labels.astype(np.int64))

    def make(fmt: Any) -> tuple[Callable, Any]:
        m = torch_models.build(torch, name, params, batchnorm).to(memory_format=fmt)
        opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
        xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).contiguous(
            memory_format=fmt)

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
                loss = torch.nn.functional.cross_entropy(m(xt), lt)
            loss.backward()
            opt.step()
            return loss.detach()
        return step, m

    first: dict[str, Any] = {}
    best, best_t, best_fmt = None, math.inf, ""
    for label, fmt in (("channels_last", torch.channels_last), ("NCHW", torch.contiguous_format)):
        step, m = make(fmt)
        first.setdefault("loss", float(step()))  # one step from params: the agreement check
        first.setdefault("params", torch_models.params_back(m, params))
        t = min(_time_n(step, 1) for _ in range(3))
        if t < best_t:
            best, best_t, best_fmt = step, t, label
    first["layout"] = best_fmt
    assert best is not None
    return best, first


def _compiled_by_the_rules(fn: Callable, *args: Any) -> Callable:
    """``fn`` compiled with timed choices off (``JAXCONV_MEASURE=0``: each choice its rule;
    the setting, read once per process, read again before and after), JAX's caches cleared
    before and after (JAX keeps a program's lowering, and the choices made in it, for the next
    trace of the same program)."""
    from jaxconv._src.lowering import measured
    before = os.environ.get("JAXCONV_MEASURE")
    os.environ["JAXCONV_MEASURE"] = "0"
    measured.enabled.cache_clear()
    jax.clear_caches()
    try:
        return jax.jit(fn).lower(*args).compile()
    finally:
        jax.clear_caches()
        if before is None:
            del os.environ["JAXCONV_MEASURE"]
        else:
            os.environ["JAXCONV_MEASURE"] = before
        measured.enabled.cache_clear()


def measure_max_pool(shape: tuple[int, ...], reps: int, dtype: str = "float32"
                     ) -> dict[str, Any] | None:
    """The model's max pool alone, forward and backward (interleaved medians, ms): flax's
    ``nn.max_pool`` under ``jax.vjp`` (``xla``: XLA:CPU expands the gradient, a
    select-and-scatter, into a reduce-window over value-and-index tuples and a scatter), the
    jaxconv contender's ``jaxconv.max_pool`` (``jaxconv``: its forward and argmax where the
    chooser timed them faster, the handler's one pass or XLA's; ``jaxconv_xla_argmax``: XLA's,
    the rule) and torch's ``max_pool2d_with_indices`` and its backward, channels-last (bfloat16
    tensors for ``dtype`` bfloat16); ``gap``: the largest difference of a jaxconv gradient from
    torch's; ``handler``: whether ``jaxconv``'s program holds the handler's pool. None without
    torch."""
    try:
        import torch
    except ImportError:
        return None
    from jaxconv._src.native import library
    torch.set_num_threads(usable_cpus())
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    xj = jnp.asarray(x, jdtype)
    dy = rng.standard_normal(jax.eval_shape(models.max_pool, xj).shape).astype(np.float32)
    dyj = jnp.asarray(dy, jdtype)

    def vjp_of(pool: Callable) -> Callable:
        return lambda x, dy: jax.vjp(pool, x)[1](dy)[0]
    xla = jax.jit(vjp_of(models.max_pool))
    ours = jax.jit(vjp_of(models.jaxconv_max_pool))
    ours_rule = _compiled_by_the_rules(vjp_of(models.jaxconv_max_pool), xj, dyj)
    tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    nchw = (0, 3, 1, 2)
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(nchw))).to(tdtype).contiguous(
        memory_format=torch.channels_last)
    dyt = torch.from_numpy(np.ascontiguousarray(dy.transpose(nchw))).to(tdtype).contiguous(
        memory_format=torch.channels_last)
    aten = torch.ops.aten

    def peer() -> Any:
        _, idx = aten.max_pool2d_with_indices(xt, [3, 3], [2, 2], [1, 1])
        return aten.max_pool2d_with_indices_backward(dyt, xt, [3, 3], [2, 2], [1, 1], [1, 1],
                                                     False, idx)
    ref = peer().float().numpy().transpose(0, 2, 3, 1)
    gap = max(float(np.max(np.abs(np.asarray(f(xj, dyj), np.float32) - ref)))
              for f in (ours, ours_rule))
    times = interleaved({"xla": lambda: xla(xj, dyj).block_until_ready(),
                         "jaxconv": lambda: ours(xj, dyj).block_until_ready(),
                         "jaxconv_xla_argmax": lambda: ours_rule(xj, dyj).block_until_ready(),
                         "torch": peer}, reps, seed=2)
    handler = f"@{library.MAX_POOL_TARGET}(" in ours.lower(xj, dyj).as_text()
    return {"input": list(shape), "dtype": dtype, "gap": gap, "handler": handler,
            "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()}}


def spread(run_medians_ms: list[dict[str, float]]) -> dict[str, float]:
    """Each contender's per-process spread: its slowest process's median over its fastest
    (1.0 with one process)."""
    keys = {k for r in run_medians_ms for k in r}
    return {k: max(v) / min(v) for k in sorted(keys)
            if (v := [r[k] for r in run_medians_ms if k in r]) and min(v) > 0}


def ratio(median_ms: dict[str, float], a: str, b: str) -> float | None:
    """a's time over b's, or None where either was not timed (``--contenders``)."""
    return median_ms[a] / median_ms[b] if a in median_ms and b in median_ms else None


def without_max_pool(median_ms: dict[str, float], pool: dict[str, Any] | None) -> float | None:
    """torch/jaxconv with each step's max pool's time (forward and backward) taken from it
    (the jaxconv contender's: ``jaxconv.max_pool``; in results before it had one, flax's)."""
    if pool is None or "torch" not in median_ms or "jaxconv" not in median_ms:
        return None
    t = pool["median_ms"]
    return (median_ms["torch"] - t["torch"]) / (median_ms["jaxconv"] - t.get("jaxconv", t["xla"]))


def measure_steps(name: str, batch: int, image: int, reps: int, batchnorm: bool,
                  contenders: tuple[str, ...] = CONTENDERS, bfloat16: bool = False) -> dict[str, Any]:
    """One model's training step per contender, timed interleaved; the agreement of one step.
    ``bfloat16``: mixed precision on every side (flax's ``dtype=jnp.bfloat16`` with float32
    parameters; torch under ``torch.autocast("cpu", torch.bfloat16)``)."""
    import jaxconv
    from jaxconv._src import lax_refs
    from jaxconv._src.bench import torch_models
    rng = np.random.default_rng(0)
    spec = models.MODELS[name]
    batch = batch or spec.batch
    x = rng.standard_normal((batch, image, image, spec.channels)).astype(np.float32)
    labels = rng.integers(0, spec.classes, batch).astype(np.int32)
    convs = {"lax": lax_refs.conv_general_dilated, "jaxconv": jaxconv.conv_general_dilated}
    variables = models.init(name, jnp.asarray(x), batchnorm)
    params, stats = variables["params"], variables.get("batch_stats", {})
    steps: dict[str, Callable] = {}
    first: dict[str, tuple[float, dict[str, np.ndarray]]] = {}
    layout = None
    for k in contenders:
        if k == "torch":
            made = _torch_step(name, params, x, labels, batchnorm, bfloat16)
            if made is None:
                continue
            steps[k], info = made
            first[k], layout = (info["loss"], info["params"]), info["layout"]
            continue
        # jaxconv: the explicit hooks; lax and accelerate: the unmodified model (nn.max_pool)
        stem_pool = models.jaxconv_max_pool if k == "jaxconv" else None
        model = models.build(name, convs.get(k, lax_refs.conv_general_dilated), batchnorm,
                             pool=stem_pool, dtype=jnp.bfloat16 if bfloat16 else None)
        step, tx = _jax_step(model, batchnorm, donate=True, accelerate=k == "accelerate")
        xj, lj = jnp.asarray(x), jnp.asarray(labels)
        steps[k] = _training_loop(step, params, stats, tx.init(params), xj, lj)
        loss, state = steps[k]()  # the first step, from params: the agreement check
        first[k] = (float(loss), torch_models.flat_params(jax.device_get(state[0])))
    ref_loss, ref = first[next(iter(first))]
    scale = max(float(np.max(np.abs(v))) for v in ref.values())
    # each contender against the first: the loss, the largest parameter difference and where
    gaps = {}
    for k, (loss, p) in first.items():
        diff = {n: float(np.max(np.abs(p[n] - ref[n]))) for n in ref}
        worst = max(diff, key=diff.__getitem__)
        gaps[k] = (abs(loss - ref_loss), diff[worst], worst)
    faults: dict[str, list[float]] = {}
    times = interleaved(steps, reps, seed=1, faults=faults)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    shape = models.max_pool_input(name, batch, image)
    pool = None if shape is None or "torch" not in steps else measure_max_pool(shape, 2 * reps)
    return {"model": name, "description": models.MODELS[name].name, "batch": batch,
            "image": image, "batchnorm": batchnorm,
            "dtype": "bfloat16 (float32 parameters)" if bfloat16 else "float32", "median_ms": med,
            "samples_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
            "minor_faults_per_step": {k: statistics.median(v) for k, v in faults.items()},
            "losses": {k: loss for k, (loss, _) in first.items()},
            "torch_over_jaxconv": ratio(med, "torch", "jaxconv"),
            "lax_over_jaxconv": ratio(med, "lax", "jaxconv"),
            "torch_over_accelerate": ratio(med, "torch", "accelerate"),
            "max_pool": pool,
            "torch_over_jaxconv_without_max_pool": (without_max_pool(med, pool)
                                                    if "jaxconv" in med else None),
            "torch_layout": layout, "loss_gap": max(g[0] for g in gaps.values()),
            "param_gap": max(g[1] for g in gaps.values()), "param_scale": scale,
            "gaps": {k: {"loss": g[0], "param": g[1], "worst_param": g[2]} for k, g in gaps.items()}}


def steps_child(args: argparse.Namespace) -> dict[str, Any]:
    """The steps of every model in this process (a child of :func:`steps`)."""
    import resource

    import jaxconv
    if args.mode == "kept" and not jaxconv.keep_freed_memory():
        raise SystemExit("models: --mode kept needs Linux with glibc")
    # "usual": nothing more; jaxconv's default host memory came with its import (this module's
    # first line of jaxconv), and measure_steps makes the arrays and variables before the wrap
    rows = [measure_steps(m, args.batch, args.image or models.MODELS[m].image, args.reps,
                          not args.no_batchnorm, tuple(args.contenders),
                          bfloat16=args.dtype == "bfloat16") for m in args.models]
    from jaxconv._src.native import library
    return {"mode": args.mode, "rows": rows, "onednn": library.status().line(),
            "host_memory": host_memory.mode(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child(args: argparse.Namespace, mode: str, contenders: list[str]) -> dict[str, Any]:
    """One child process's steps (:func:`steps_child`) of ``contenders``."""
    from jaxconv._src.native import library
    cmd = [sys.executable, "-m", "jaxconv._src.bench.model_run", "--child", "--mode", mode,
           "--models", *args.models, "--batch", str(args.batch or 0),
           "--reps", str(args.reps), "--contenders", *contenders]
    if args.image:
        cmd += ["--image", str(args.image)]
    if args.no_batchnorm:
        cmd.append("--no-batchnorm")
    cmd += ["--dtype", args.dtype]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"models: the {mode} child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # every child must have had the lowering the parent reports (a handler not built for this
    # source leaves a process on the XLA formulations)
    if result["onednn"] != library.status().line():
        raise RuntimeError(f"models: a child's CPU lowering differs from this process's: "
                           f"{result['onednn']!r} vs {library.status().line()!r}")
    return result


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One run of contenders each timed in a process of its own (``--separate``), as one
    child's result: each model's medians, faults and first losses side by side; the losses'
    gap across the processes (each started from the same parameters), no parameter gap."""
    rows = []
    for i in range(len(parts[0]["rows"])):
        each = [p["rows"][i] for p in parts]
        row = {**each[0], **{key: next((r[key] for r in each if r.get(key)), None)
                             for key in ("max_pool", "torch_layout")}}
        for key in ("median_ms", "minor_faults_per_step", "losses"):
            row[key] = {k: v for r in each for k, v in r[key].items()}
        med, losses = row["median_ms"], list(row["losses"].values())
        row.update(torch_over_jaxconv=ratio(med, "torch", "jaxconv"),
                   torch_over_accelerate=ratio(med, "torch", "accelerate"),
                   lax_over_jaxconv=ratio(med, "lax", "jaxconv"),
                   loss_gap=max(losses) - min(losses), param_gap=None)
        rows.append(row)
    return {**parts[0], "rows": rows, "peak_rss_mib": max(p["peak_rss_mib"] for p in parts)}


def steps(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each mode in ``args.runs`` child processes (with ``args.separate``, each contender in
    a process of its own): per mode and model, every run's medians and the median over
    runs."""
    out = []
    for mode in args.modes:
        runs = []
        for run in range(args.runs):
            contenders = [c for c in args.contenders if c != "lax" or run < args.lax_runs]
            print(f"steps: mode {mode}, run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
            if args.separate:
                runs.append(_merge([_child(args, mode, [c]) for c in contenders]))
            else:
                runs.append(_child(args, mode, contenders))
        for i, name in enumerate(args.models):
            rows = [r["rows"][i] for r in runs]
            med = {k: statistics.median(r["median_ms"][k] for r in rows if k in r["median_ms"])
                   for k in rows[0]["median_ms"]}
            faults = {k: statistics.median(r["minor_faults_per_step"][k] for r in rows
                                           if k in r.get("minor_faults_per_step", {}))
                      for k in rows[0].get("minor_faults_per_step", {})}
            pools = [r["max_pool"] for r in rows if r.get("max_pool")]
            pool = None if not pools else {
                "input": pools[0]["input"], "gap": max(q["gap"] for q in pools),
                "median_ms": {k: statistics.median(q["median_ms"][k] for q in pools)
                              for k in pools[0]["median_ms"]}}
            out.append({**{k: v for k, v in rows[0].items()
                           if k not in ("median_ms", "samples_ms", "max_pool")},
                        "mode": mode, "runs": len(rows), "median_ms": med,
                        "processes": ("one per contender" if args.separate
                                      else "contenders interleaved in one"),
                        "run_medians_ms": [r["median_ms"] for r in rows],
                        "spread": spread([r["median_ms"] for r in rows]),
                        "minor_faults_per_step": faults,
                        "run_minor_faults_per_step": [r.get("minor_faults_per_step")
                                                      for r in rows],
                        "max_pool": pool,
                        "torch_over_jaxconv_without_max_pool": (
                            without_max_pool(med, pool) if "jaxconv" in med else None),
                        "torch_over_jaxconv": ratio(med, "torch", "jaxconv"),
                        "torch_over_jaxconv_runs": [r["torch_over_jaxconv"] for r in rows],
                        "lax_over_jaxconv": ratio(med, "lax", "jaxconv"),
                        "torch_over_accelerate": ratio(med, "torch", "accelerate"),
                        "torch_over_accelerate_runs": [r.get("torch_over_accelerate")
                                                       for r in rows],
                        "host_memory": [r["host_memory"] for r in runs],
                        "peak_rss_mib": [r["peak_rss_mib"] for r in runs],
                        "loss_gap": max(r["loss_gap"] for r in rows),
                        "param_gap": (None if any(r["param_gap"] is None for r in rows)
                                      else max(r["param_gap"] for r in rows))})
    return out
