"""Whole networks: training steps of ResNet-18, ResNet-50, MobileNetV2 and flax's MNIST CNN,
and their layers.

``jaxconv bench models`` (also ``python -m benchmarks.models``). Two parts, each timed
interleaved in one process (a fresh random order each repetition, medians):

* **steps**: one training step (forward, backward, cross-entropy, SGD with momentum 0.9) of
  each model written in flax (``models.py``) with ``lax.conv_general_dilated`` (``lax``), with
  ``jaxconv.conv_general_dilated`` and ``jaxconv.max_pool`` (``jaxconv``), as written with
  its step under ``jaxconv.accelerate`` (``accelerate``), and its ``torch.nn`` twin (``torch``,
  ``torch_models.py``) holding the same parameters, batch and labels, in its faster memory
  format. One step of each from the same state must agree (``loss_gap``, ``param_gap``).
  Each contender carries its state from step to step as a training loop does: torch's
  optimizer updates in place, and the flax steps donate their parameters, statistics and
  optimizer state (``donate_argnums``) so that XLA does too.
  ``--modes kept default`` runs each mode in a child process of its own: ``kept`` calls
  ``jaxconv.keep_freed_memory()`` first (PyTorch's allocations are the same process's, so it
  keeps them too), ``default`` does what a program that calls nothing gets: glibc's settings,
  or jaxconv's default where ``accelerate`` is a contender (applied before the first
  computation, as a decorator on the step is; each mode's peak resident memory is
  reported); ``--runs N`` repeats each mode in N processes and reports the median. ``--no-batchnorm`` replaces BatchNorm by identity in both.
  A ResNet's stem max pool (``jaxconv.max_pool`` in the jaxconv contender, flax's
  ``nn.max_pool`` in lax's) is timed alone too, forward and backward, on every side
  (``max_pool``: XLA:CPU's gradient of flax's took 10x torch's time), with torch/jaxconv of
  the steps without it (``torch_over_jaxconv_without_max_pool``).
* **layers**: every distinct convolution of those models at the same batch, each kernel a
  training step computes (forward, data gradient except at the input layer, weight gradient):
  jaxconv's op against ``torch.ops.aten.convolution`` / ``convolution_backward`` with its
  output mask (``run.build``), the same thread count. ``step_weighted`` sums each row times
  its count in a step; ``gflops`` is the convolutions' arithmetic over their time, beside the
  machine's peak (``machine.py``).

Writes JSON (the machine, both oneDNN versions and thread counts included) and a plot.

usage: jaxconv bench models [--models resnet18 ...] [--batch 8] [--reps 5] [--runs 3]
         [--lax-runs 1] [--modes kept default] [--no-batchnorm] [--parts steps layers] [--dtype float32]
         [--layer-runs 1]
         [--out benchmarks/results/models.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src import host_memory
from jaxconv._src.bench import benchdnn, machine, models
from jaxconv._src.bench.timing import _time_n, interleaved
from jaxconv._src.geometry import conv_output_size

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
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
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
        return new_params, new_opt, loss
    return run


def _torch_step(name: str, params: Any, x: np.ndarray, labels: np.ndarray,
                batchnorm: bool) -> tuple[Callable, dict[str, Any]] | None:
    """A zero-argument torch training step in the faster memory format, and one step's
    result from ``params`` (loss, parameters in flax layouts, the format)."""
    try:
        import torch
    except ImportError:
        return None
    from jaxconv._src.bench import torch_models
    torch.set_num_threads(os.cpu_count() or 1)
    lt = torch.from_numpy(labels.astype(np.int64))

    def make(fmt: Any) -> tuple[Callable, Any]:
        m = torch_models.build(torch, name, params, batchnorm).to(memory_format=fmt)
        opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
        xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).contiguous(
            memory_format=fmt)

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
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


def measure_max_pool(shape: tuple[int, ...], reps: int) -> dict[str, Any] | None:
    """The model's max pool alone, forward and backward (interleaved medians, ms): flax's
    ``nn.max_pool`` under ``jax.vjp`` (``xla``: XLA:CPU expands the gradient, a
    select-and-scatter, into a reduce-window over value-and-index tuples and a scatter), the
    jaxconv contender's ``jaxconv.max_pool`` (``jaxconv``) and torch's
    ``max_pool2d_with_indices`` and its backward, channels-last; ``gap``: the largest difference
    of either gradient from torch's. None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    xj = jnp.asarray(x)
    dy = rng.standard_normal(jax.eval_shape(models.max_pool, xj).shape).astype(np.float32)
    dyj = jnp.asarray(dy)
    xla = jax.jit(lambda x, dy: jax.vjp(models.max_pool, x)[1](dy)[0])
    ours = jax.jit(lambda x, dy: jax.vjp(models.jaxconv_max_pool, x)[1](dy)[0])
    nchw = (0, 3, 1, 2)
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(nchw))).contiguous(
        memory_format=torch.channels_last)
    dyt = torch.from_numpy(np.ascontiguousarray(dy.transpose(nchw))).contiguous(
        memory_format=torch.channels_last)
    aten = torch.ops.aten

    def peer() -> Any:
        _, idx = aten.max_pool2d_with_indices(xt, [3, 3], [2, 2], [1, 1])
        return aten.max_pool2d_with_indices_backward(dyt, xt, [3, 3], [2, 2], [1, 1], [1, 1],
                                                     False, idx)
    ref = peer().numpy().transpose(0, 2, 3, 1)
    gap = max(float(np.max(np.abs(np.asarray(f(xj, dyj)) - ref))) for f in (xla, ours))
    times = interleaved({"xla": lambda: xla(xj, dyj).block_until_ready(),
                         "jaxconv": lambda: ours(xj, dyj).block_until_ready(), "torch": peer},
                        reps, seed=2)
    return {"input": list(shape), "gap": gap,
            "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()}}


def without_max_pool(median_ms: dict[str, float], pool: dict[str, Any] | None) -> float | None:
    """torch/jaxconv with each step's max pool's time (forward and backward) taken from it
    (the jaxconv contender's: ``jaxconv.max_pool``; in results before it had one, flax's)."""
    if pool is None or "torch" not in median_ms:
        return None
    t = pool["median_ms"]
    return (median_ms["torch"] - t["torch"]) / (median_ms["jaxconv"] - t.get("jaxconv", t["xla"]))


def measure_steps(name: str, batch: int, image: int, reps: int, batchnorm: bool,
                  contenders: tuple[str, ...] = CONTENDERS) -> dict[str, Any]:
    """One model's training step per contender, timed interleaved; the agreement of one step."""
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
            made = _torch_step(name, params, x, labels, batchnorm)
            if made is None:
                continue
            steps[k], info = made
            first[k], layout = (info["loss"], info["params"]), info["layout"]
            continue
        # jaxconv: the explicit hooks; lax and accelerate: the unmodified model (nn.max_pool)
        stem_pool = models.jaxconv_max_pool if k == "jaxconv" else None
        model = models.build(name, convs.get(k, lax_refs.conv_general_dilated), batchnorm,
                             pool=stem_pool)
        step, tx = _jax_step(model, batchnorm, donate=True, accelerate=k == "accelerate")
        xj, lj = jnp.asarray(x), jnp.asarray(labels)
        steps[k] = _training_loop(step, params, stats, tx.init(params), xj, lj)
        new, _, loss = steps[k]()  # the first step, from params: the agreement check
        first[k] = (float(loss), torch_models.flat_params(jax.device_get(new)))
    ref_loss, ref = first[next(iter(first))]
    scale = max(float(np.max(np.abs(v))) for v in ref.values())
    # each contender against the first: the loss, the largest parameter difference and where
    gaps = {}
    for k, (loss, p) in first.items():
        diff = {n: float(np.max(np.abs(p[n] - ref[n]))) for n in ref}
        worst = max(diff, key=diff.__getitem__)
        gaps[k] = (abs(loss - ref_loss), diff[worst], worst)
    times = interleaved(steps, reps, seed=1)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    shape = models.max_pool_input(name, batch, image)
    pool = None if shape is None or "torch" not in steps else measure_max_pool(shape, 2 * reps)
    return {"model": name, "description": models.MODELS[name].name, "batch": batch,
            "image": image, "batchnorm": batchnorm, "median_ms": med,
            "samples_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
            "torch_over_jaxconv": med["torch"] / med["jaxconv"] if "torch" in med else None,
            "lax_over_jaxconv": med["lax"] / med["jaxconv"] if "lax" in med else None,
            "torch_over_accelerate": (med["torch"] / med["accelerate"]
                                      if "torch" in med and "accelerate" in med else None),
            "max_pool": pool,
            "torch_over_jaxconv_without_max_pool": (without_max_pool(med, pool)
                                                    if "jaxconv" in med else None),
            "torch_layout": layout, "loss_gap": max(g[0] for g in gaps.values()),
            "param_gap": max(g[1] for g in gaps.values()), "param_scale": scale,
            "gaps": {k: {"loss": g[0], "param": g[1], "worst_param": g[2]} for k, g in gaps.items()}}


def _steps_child(args: argparse.Namespace) -> dict[str, Any]:
    """The steps of every model in this process (a child of ``_steps``)."""
    import resource

    import jaxconv
    if args.mode == "kept" and not jaxconv.keep_freed_memory():
        raise SystemExit("models: --mode kept needs Linux with glibc")
    if args.mode == "default" and "accelerate" in args.contenders:
        # what `jaxconv.accelerate` does where a program applies it before its first
        # computation (a decorator on its training step): jaxconv's default host memory
        host_memory.keep_by_default()
    rows = [measure_steps(m, args.batch, args.image or models.MODELS[m].image, args.reps,
                          not args.no_batchnorm, tuple(args.contenders)) for m in args.models]
    from jaxconv._src.onednn import library
    return {"mode": args.mode, "rows": rows, "onednn": library.status().line(),
            "host_memory": host_memory.mode(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _steps(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each mode in ``args.runs`` child processes: per mode and model, every run's medians and
    the median over runs."""
    from jaxconv._src.onednn import library
    out = []
    for mode in args.modes:
        runs = []
        for run in range(args.runs):
            contenders = [c for c in args.contenders if c != "lax" or run < args.lax_runs]
            cmd = [sys.executable, "-m", "jaxconv._src.bench.model_run", "--child", "--mode", mode,
                   "--models", *args.models, "--batch", str(args.batch or 0),
                   "--reps", str(args.reps), "--contenders", *contenders]
            if args.image:
                cmd += ["--image", str(args.image)]
            if args.no_batchnorm:
                cmd.append("--no-batchnorm")
            print(f"steps: mode {mode}, run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"models: the {mode} child failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            # every child must have had the lowering the parent reports (a handler not built
            # for this source leaves a process on the XLA formulations)
            if runs[-1]["onednn"] != library.status().line():
                raise RuntimeError(f"models: a child's CPU lowering differs from this process's: "
                                   f"{runs[-1]['onednn']!r} vs {library.status().line()!r}")
        for i, name in enumerate(args.models):
            rows = [r["rows"][i] for r in runs]
            med = {k: statistics.median(r["median_ms"][k] for r in rows if k in r["median_ms"])
                   for k in rows[0]["median_ms"]}
            pools = [r["max_pool"] for r in rows if r.get("max_pool")]
            pool = None if not pools else {
                "input": pools[0]["input"], "gap": max(q["gap"] for q in pools),
                "median_ms": {k: statistics.median(q["median_ms"][k] for q in pools)
                              for k in pools[0]["median_ms"]}}
            out.append({**{k: v for k, v in rows[0].items()
                           if k not in ("median_ms", "samples_ms", "max_pool")},
                        "mode": mode, "runs": len(rows), "median_ms": med,
                        "run_medians_ms": [r["median_ms"] for r in rows],
                        "max_pool": pool,
                        "torch_over_jaxconv_without_max_pool": (
                            without_max_pool(med, pool) if "jaxconv" in med else None),
                        "torch_over_jaxconv": med["torch"] / med["jaxconv"] if "torch" in med else None,
                        "torch_over_jaxconv_runs": [r["torch_over_jaxconv"] for r in rows],
                        "lax_over_jaxconv": med["lax"] / med["jaxconv"] if "lax" in med else None,
                        "torch_over_accelerate": (med["torch"] / med["accelerate"]
                                                  if "torch" in med and "accelerate" in med
                                                  else None),
                        "torch_over_accelerate_runs": [r.get("torch_over_accelerate")
                                                       for r in rows],
                        "host_memory": [r["host_memory"] for r in runs],
                        "peak_rss_mib": [r["peak_rss_mib"] for r in runs],
                        "loss_gap": max(r["loss_gap"] for r in rows),
                        "param_gap": max(r["param_gap"] for r in rows)})
    return out


# --------------------------------------------------------------------------- layers

def problem(c: models.Convolution, name: str, source: str) -> benchdnn.Problem:
    """A model's convolution as a benchdnn problem (what ``run.build`` times)."""
    out = tuple(conv_output_size(i, k, s, 1, b, e) for i, k, s, (b, e) in
                zip(c.input_size, c.kernel, c.strides, c.pads))
    return benchdnn.Problem(name, source, c.batch, c.groups, c.in_channels, c.out_channels,
                            c.input_size, out, c.kernel, c.strides, (1,) * len(c.kernel),
                            tuple(b for b, _ in c.pads), tuple(e for _, e in c.pads))


def _label(c: models.Convolution) -> str:
    k = "x".join(map(str, c.kernel))
    s = f" s{c.strides[0]}" if max(c.strides) > 1 else ""
    g = " dw" if c.groups == c.in_channels and c.groups > 1 else (f" g{c.groups}" if c.groups > 1 else "")
    return f"{k}{s}{g} {c.in_channels}->{c.out_channels} {c.input_size[0]}x{c.input_size[1]}"


def _choices(prob: benchdnn.Problem, kind: str) -> list[dict[str, Any]]:
    """What jaxconv's oneDNN handler chose for this row's calls (``library.choices``: its
    threading, each candidate layout's impl and first-call trial time): the entries of this
    kernel whose buffers are the row's (NXC / XIO, as ``run.build`` passes them), a chunk's
    with its share of the batch. x is matched whole or as the output-sized grid a strided 1x1
    weight gradient may reach the handler as (which of the two is the lowering's choice)."""
    from jaxconv._src.onednn import library
    kernel = {"fwd": "forward", "dgrad": "data", "wgrad": "weight"}[kind]
    xs = {(*prob.input_size, prob.in_channels), (*prob.output_size, prob.in_channels)}
    y = (*prob.output_size, prob.out_channels)
    w = (*prob.kernel, prob.in_channels // prob.groups, prob.out_channels)
    return [c for c in library.choices()
            if c["kernel"] == kernel and c["x"][1:] in xs and c["y"][1:] == y and c["w"] == w]


def measure_layers(name: str, batch: int, image: int, reps: int, dtype: Any,
                   batchnorm: bool = True) -> dict[str, Any]:
    """Every distinct convolution of model ``name``: each kernel of a training step, jaxconv
    against torch, interleaved; the sum weighted by each convolution's count in a step."""
    from jaxconv._src.bench import run
    rows = []
    for c, count in models.record_convolutions(name, batch, image, batchnorm):
        prob = problem(c, _label(c), name)
        for kind in ("fwd", "wgrad") if c.first else ("fwd", "dgrad", "wgrad"):
            impls = run.build(prob, kind, dtype=dtype)
            impls = {k: v for k, v in impls.items() if k in ("jaxconv", "torch")}
            if "torch" not in impls:
                continue
            for fn in impls.values():
                _time_n(fn, 1)  # compiled before the first sample
            times = interleaved(impls, reps)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            paired = sorted(j / t for j, t in zip(times["jaxconv"], times["torch"]))
            rows.append({"layer": prob.name, "kind": kind, "count": count, "gflop": prob.flops / 1e9,
                         "median_ms": med, "jaxconv_over_torch": med["jaxconv"] / med["torch"],
                         "samples_ms": {k: [round(t * 1e3, 4) for t in v] for k, v in times.items()},
                         "paired_ratio_range": [paired[0], paired[-1]],
                         "torch_layout": impls["torch"].layout,  # type: ignore[attr-defined]
                         "onednn_choices": _choices(prob, kind),
                         "problem": {k: v for k, v in prob.__dict__.items()
                                     if k not in ("name", "source")}})
            print(f"  {name:12s} {prob.name:32s} {kind:5s} x{count:<2d} jaxconv "
                  f"{med['jaxconv']:8.3f} ms torch {med['torch']:8.3f} ms "
                  f"ratio {rows[-1]['jaxconv_over_torch']:.2f}", file=sys.stderr, flush=True)
    return _summary({"model": name, "batch": batch, "image": image,
                     "dtype": str(np.dtype(dtype))}, rows)


def _summary(head: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A model's table: its rows, their sum weighted by each row's count in a step, the worst
    row, and the convolutions' time per step and GFLOP/s on each side."""
    ours = sum(r["count"] * r["median_ms"]["jaxconv"] for r in rows)
    theirs = sum(r["count"] * r["median_ms"]["torch"] for r in rows)
    flop = sum(r["count"] * r["gflop"] for r in rows)
    return {**head, "rows": rows, "step_weighted": ours / theirs,
            "worst": max(r["jaxconv_over_torch"] for r in rows),
            "conv_ms_per_step": {"jaxconv": ours, "torch": theirs},
            "conv_gflops": {"jaxconv": flop / ours * 1e3, "torch": flop / theirs * 1e3}}


def _pooled(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's tables from several processes as one: each row's median over the samples of
    every process (a process's first-call choices and heap layout hold for all its samples, so
    one process's table is one draw of them), each process's ratio listed beside it, and the
    worst row of each process's own table (``worst_per_process``)."""
    rows = []
    for parts in zip(*(t["rows"] for t in tables)):
        samples = {k: [v for p in parts for v in p["samples_ms"][k]] for k in ("jaxconv", "torch")}
        med = {k: statistics.median(v) for k, v in samples.items()}
        paired = sorted(j / t for p in parts
                        for j, t in zip(p["samples_ms"]["jaxconv"], p["samples_ms"]["torch"]))
        rows.append({**parts[0], "median_ms": med, "samples_ms": samples,
                     "jaxconv_over_torch": med["jaxconv"] / med["torch"],
                     "paired_ratio_range": [paired[0], paired[-1]],
                     "process_ratios": [p["jaxconv_over_torch"] for p in parts],
                     "onednn_choices": [p["onednn_choices"] for p in parts]})
    head = {k: v for k, v in tables[0].items() if k in ("model", "batch", "image", "dtype")}
    return {**_summary(head, rows), "processes": len(tables),
            "worst_per_process": [t["worst"] for t in tables],
            "step_weighted_per_process": [t["step_weighted"] for t in tables]}


def _layers(args: argparse.Namespace, dtype: Any) -> list[dict[str, Any]]:
    """The per-layer tables: in this process, or with ``--layer-runs`` N > 1 in N child
    processes one after another, pooled (``_pooled``)."""
    def one(name: str) -> dict[str, Any]:
        return measure_layers(name, args.batch or models.MODELS[name].batch,
                              args.image or models.MODELS[name].image,
                              args.reps, dtype, not args.no_batchnorm)

    if args.layer_runs <= 1:
        return [one(m) for m in args.models]
    from jaxconv._src.onednn import library
    runs = []
    for run in range(args.layer_runs):
        cmd = [sys.executable, "-m", "jaxconv._src.bench.model_run", "--child-layers",
               "--models", *args.models, "--batch", str(args.batch or 0), "--reps", str(args.reps),
               "--dtype", args.dtype]
        if args.image:
            cmd += ["--image", str(args.image)]
        if args.no_batchnorm:
            cmd.append("--no-batchnorm")
        if args.force_dtype:
            cmd.append("--force-dtype")
        print(f"layers: run {run + 1}/{args.layer_runs}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"models: the layers child failed (exit {done.returncode})")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        if got["onednn"] != library.status().line():
            raise RuntimeError(f"models: a child's CPU lowering differs from this process's: "
                               f"{got['onednn']!r} vs {library.status().line()!r}")
        runs.append(got["layers"])
    return [_pooled([r[i] for r in runs]) for i in range(len(args.models))]


# --------------------------------------------------------------------------- output

def plot(result: dict[str, Any], path: pathlib.Path) -> None:
    """Step time per model and contender, one panel per mode (and BatchNorm setting)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    steps = result.get("steps", [])
    panels = sorted({(r["mode"], r["batchnorm"]) for r in steps})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    colors = {"lax": "tab:gray", "jaxconv": "tab:blue", "accelerate": "tab:green",
              "torch": "tab:orange"}
    for ax, (mode, bn) in zip(axes[0], panels):
        rows = [r for r in steps if r["mode"] == mode and r["batchnorm"] == bn]
        width = 0.8 / len(CONTENDERS)
        for i, k in enumerate(CONTENDERS):
            xs = [j + (i - (len(CONTENDERS) - 1) / 2) * width for j in range(len(rows))]
            ys = [r["median_ms"].get(k, math.nan) for r in rows]
            ax.bar(xs, ys, width, label=k, color=colors[k])
        ax.set_xticks(range(len(rows)), [f"{r['description']}\n{r['image']}px, batch {r['batch']}"
                                         for r in rows],
                      fontsize=7)
        ax.set_ylabel("ms per training step (median)")
        ax.set_title(f"{'BatchNorm' if bn else 'no BatchNorm'}, memory "
                     f"{'kept by keep_freed_memory()' if mode == 'kept' else 'jaxconv default'}",
                     fontsize=8)
        ax.legend(fontsize=7)
    cpu = result["machine"]["cpu"]
    fig.suptitle(f"float32, {cpu}, {result['machine']['cpu_count']} cores",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _print(result: dict[str, Any]) -> None:
    peak = result["machine"]["peak"]["gflops"]
    for r in result.get("steps", []):
        m = r["median_ms"]
        print(f"{r['description']:12s} {r['mode']:8s} bn={int(r['batchnorm'])} "
              + " ".join(f"{k} {m.get(k, math.nan):8.1f}" for k in CONTENDERS)
              + f"  torch/jaxconv {r['torch_over_jaxconv'] or math.nan:.2f} "
              f"(runs {', '.join(f'{v:.2f}' for v in r['torch_over_jaxconv_runs'] if v)})"
              f"  loss gap {r['loss_gap']:.1e} param gap {r['param_gap']:.1e}")
        if r.get("max_pool"):
            t = r["max_pool"]["median_ms"]
            print(f"{'':12s} its max pool, forward and backward: flax's (XLA) {t['xla']:.1f} ms, "
                  f"jaxconv's {t.get('jaxconv', math.nan):.1f}, torch {t['torch']:.1f}; the steps "
                  f"without it: torch/jaxconv "
                  f"{r['torch_over_jaxconv_without_max_pool']:.2f}")
    for lay in result.get("layers", []):
        g = lay["conv_gflops"]
        print(f"{lay['model']:12s} layers ({lay['dtype']}): step-weighted jaxconv/torch "
              f"{lay['step_weighted']:.3f}, worst row {lay['worst']:.2f}; convolutions "
              f"{g['jaxconv']:.0f} GFLOP/s (torch {g['torch']:.0f}) of a {peak:.0f} GFLOP/s peak")
        if "worst_per_process" in lay:
            print(f"{'':12s} {lay['processes']} processes pooled; each one's step-weighted "
                  f"{', '.join(f'{v:.3f}' for v in lay['step_weighted_per_process'])}, worst row "
                  f"{', '.join(f'{v:.2f}' for v in lay['worst_per_process'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jaxconv bench models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=sorted(models.MODELS), default=list(models.MODELS))
    ap.add_argument("--batch", type=int, default=0,
                    help="the batch of every model (default: each model's own: 8, the MNIST "
                         "CNN's 128)")
    ap.add_argument("--image", type=int, help="image size (default: each model's own)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="processes per mode (the median is reported)")
    ap.add_argument("--lax-runs", type=int, default=1,
                    help="the runs that time lax too (default 1: its step is far slower, and "
                         "the runs compare jaxconv with torch)")
    ap.add_argument("--modes", nargs="+", choices=("kept", "default"), default=["kept", "default"])
    ap.add_argument("--no-batchnorm", action="store_true", help="BatchNorm replaced by identity")
    ap.add_argument("--parts", nargs="+", choices=("steps", "layers"), default=["steps", "layers"])
    ap.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the per-layer table's dtype (bfloat16: where oneDNN has AVX-512 BF16 "
                         "or AMX here, or with --force-dtype)")
    ap.add_argument("--force-dtype", action="store_true")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--layer-runs", type=int, default=1,
                    help="processes for the per-layer table (default 1: this one); from 2, each "
                         "row is the median of every process's samples, with each process's "
                         "ratio beside it")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-layers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("kept", "default"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_steps_child(args)))
        return 0
    if args.child_layers:
        host_memory.keep_freed_memory()
        from jaxconv._src.onednn import library
        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        print(json.dumps({"onednn": library.status().line(), "layers": _layers(args, dtype)}))
        return 0
    kept_by_call = False
    if "layers" in args.parts:
        # the layers in the steps' kept mode (keep_freed_memory: torch's allocations are this
        # process's too), before anything starts JAX's backends: called after machine.describe()
        # it raised, was skipped, and every table so far ran on glibc's defaults, where a large
        # output is fresh pages on each call (ResNet-18's projection data gradient, 6.4 MB: 1.0
        # ms against 0.79 kept; 2-core AVX-512 Xeon)
        try:
            kept_by_call = host_memory.keep_freed_memory()
        except RuntimeError:  # a caller (a test) whose JAX backends exist: its own settings
            pass
    info = machine.describe()
    if args.dtype == "bfloat16" and "bfloat16" not in info["jaxconv_onednn_dtypes"] \
            and not args.force_dtype:
        ap.error("--dtype bfloat16: jaxconv's oneDNN lowering does not compute bfloat16 on this "
                 f"CPU ({info['jaxconv_onednn']}); --force-dtype times it anyway")
    info["measured_matmul_gflops"] = machine.measured_matmul_gflops()
    result: dict[str, Any] = {"machine": info, "command": " ".join(
        ["jaxconv bench models", *(argv if argv is not None else sys.argv[1:])])}
    if "steps" in args.parts:
        result["steps"] = _steps(args)
    if "layers" in args.parts:
        result["layers_memory_kept"] = kept_by_call or host_memory.keeps_freed_memory()
        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        result["layers"] = _layers(args, dtype)
    from jaxconv._src.bench.run import results_dir
    out = args.out or results_dir() / f"models{'-nobn' if args.no_batchnorm else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    _print(result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
