"""Every distinct convolution of the models, each kernel a step runs, jaxconv's op against
torch's doing the same work (``jaxconv bench models --parts layers``; the runner:
``model_run.py``)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

import numpy as np

from jaxconv._src.bench import benchdnn, models
from jaxconv._src.bench.timing import _time_n, interleaved
from jaxconv._src.geometry import conv_output_size


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
    from jaxconv._src.native import library
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


def layers(args: argparse.Namespace, dtype: Any) -> list[dict[str, Any]]:
    """The per-layer tables: in this process, or with ``--layer-runs`` N > 1 in N child
    processes one after another, pooled (``_pooled``)."""
    def one(name: str) -> dict[str, Any]:
        return measure_layers(name, args.batch or models.MODELS[name].batch,
                              args.image or models.MODELS[name].image,
                              args.reps, dtype, not args.no_batchnorm)

    if args.layer_runs <= 1:
        return [one(m) for m in args.models]
    from jaxconv._src.native import library
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
