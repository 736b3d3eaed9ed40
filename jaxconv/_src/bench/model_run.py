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
  ``--modes usual kept`` runs each mode in a child process of its own: ``usual`` is the
  script people write (``import jaxconv`` at the top, the arrays and the model's variables,
  then the wrap of the step: jaxconv's default host memory, applied at the import), ``kept``
  calls ``jaxconv.keep_freed_memory()`` first (synchronous dispatch as well; PyTorch's
  allocations are the same process's, so both keep them); each mode's peak resident memory
  is reported; ``--runs N`` repeats each mode in N processes and reports the median, and
  each contender's per-process spread beside it (``spread``: its slowest process's median
  over its fastest).
  Each sample's minor page faults per step are counted (``minor_faults_per_step``: fresh
  memory faulted in, docs/training.md "Host memory"). ``--separate`` times each contender in a
  process of its own instead (the same script, one contender): its ratios against the
  interleaved ones show what sharing a process costs each side (memory, threads).
  ``--no-batchnorm`` replaces BatchNorm by identity in both.
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
         [--lax-runs 1] [--modes usual kept] [--separate] [--no-batchnorm] [--parts steps layers]
         [--dtype float32]
         [--layer-runs 1]
         [--out benchmarks/results/models.json]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp

from jaxconv._src import host_memory
from jaxconv._src.bench import machine, models
from jaxconv._src.bench.model_inference import CONTENDERS as INFERENCE_CONTENDERS
from jaxconv._src.bench.model_inference import MODELS as INFERENCE_MODELS
from jaxconv._src.bench.model_inference import inference, inference_runs
from jaxconv._src.bench.model_layers import layers
from jaxconv._src.bench.model_report import runs
from jaxconv._src.bench.model_steps import CONTENDERS, steps, steps_child


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
        ax.set_title(f"{'BatchNorm' if bn else 'no BatchNorm'}, "
                     f"{'keep_freed_memory() first' if mode == 'kept' else 'the usual script'}",
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
    peak_bf16 = result["machine"]["peak"].get("bfloat16_gflops")
    for r in result.get("steps", []):
        m = r["median_ms"]
        print(f"{r['description']:12s} {r['mode']:8s} bn={int(r['batchnorm'])} "
              f"{r.get('dtype', 'float32').split(' ')[0]} "
              + " ".join(f"{k} {m.get(k, math.nan):8.1f}" for k in CONTENDERS)
              + f"  torch/jaxconv {r['torch_over_jaxconv'] or math.nan:.2f}{runs(r, 'jaxconv', 'runs ')} "
              f"torch/accelerate {r.get('torch_over_accelerate') or math.nan:.2f}{runs(r, 'accelerate', 'runs ')}"
              f"  loss gap {r['loss_gap']:.1e} param gap "
              + ("-" if r["param_gap"] is None else f"{r['param_gap']:.1e}"))
        if r.get("runs", 1) > 1 and r.get("spread"):
            print(f"{'':12s} per-process spread (slowest / fastest of {r['runs']} processes): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["spread"].items()))
        faults = r.get("minor_faults_per_step") or {}
        if faults:
            print(f"{'':12s} minor page faults a step ({r.get('processes', '')} process): "
                  + ", ".join(f"{k} {v:,.0f}" for k, v in faults.items()))
        if r.get("max_pool"):
            t = r["max_pool"]["median_ms"]
            without = r.get("torch_over_jaxconv_without_max_pool") or math.nan
            print(f"{'':12s} its max pool, forward and backward: flax's (XLA) {t['xla']:.1f} ms, "
                  f"jaxconv's {t.get('jaxconv', math.nan):.1f}, torch {t['torch']:.1f}; the steps "
                  f"without it: torch/jaxconv {without:.2f}")
    for lay in result.get("layers", []):
        g = lay["conv_gflops"]
        top = peak_bf16 if lay["dtype"] == "bfloat16" and peak_bf16 else peak
        print(f"{lay['model']:12s} layers ({lay['dtype']}): step-weighted jaxconv/torch "
              f"{lay['step_weighted']:.3f}, worst row {lay['worst']:.2f}; convolutions "
              f"{g['jaxconv']:.0f} GFLOP/s (torch {g['torch']:.0f}) of a {top:.0f} GFLOP/s "
              f"{lay['dtype']} peak")
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
    ap.add_argument("--modes", nargs="+", choices=("usual", "kept"), default=["usual"],
                    help="usual: the script people write (import jaxconv, arrays, the model, "
                         "then the wrap); kept: jaxconv.keep_freed_memory() first")
    ap.add_argument("--separate", action="store_true",
                    help="each contender in a process of its own (default: interleaved in one)")
    ap.add_argument("--no-batchnorm", action="store_true", help="BatchNorm replaced by identity")
    ap.add_argument("--parts", nargs="+", choices=("steps", "layers", "inference"),
                    default=["steps", "layers"],
                    help="inference: each model's forward pass in inference mode at batch 1 "
                         "and 8, against torch and OpenVINO (model_inference.py)")
    ap.add_argument("--inference-models", nargs="+", default=list(INFERENCE_MODELS),
                    choices=list(INFERENCE_MODELS))
    ap.add_argument("--inference-batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--inference-rounds", type=int, default=5)
    ap.add_argument("--inference-calls", type=int, default=20,
                    help="calls of each contender a round, each timed alone")
    ap.add_argument("--inference-contenders", nargs="+", choices=INFERENCE_CONTENDERS,
                    default=list(INFERENCE_CONTENDERS))
    ap.add_argument("--inference-runs", type=int, default=1,
                    help="processes for the inference part (default 1: this one); from 2, each "
                         "contender's median and p90 are the median over the processes, each "
                         "process's median beside them (a process's median varies more than "
                         "its calls do)")
    ap.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the steps' and the per-layer table's dtype (bfloat16: the steps in "
                         "mixed precision, flax's dtype=jnp.bfloat16 with float32 parameters "
                         "against torch.autocast; where oneDNN has AVX-512 BF16 or AMX here, "
                         "or with --force-dtype, which times emulated arithmetic)")
    ap.add_argument("--force-dtype", action="store_true")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--layer-runs", type=int, default=1,
                    help="processes for the per-layer table (default 1: this one); from 2, each "
                         "row is the median of every process's samples, with each process's "
                         "ratio beside it")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-layers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-inference", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("usual", "kept"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if ("inference" in args.parts or args.child_inference) \
            and "openvino" in args.inference_contenders:
        machine.import_openvino()  # before JAX starts: its import forks (machine.import_openvino)
    if args.child_inference:
        from jaxconv._src.native import library
        print(json.dumps({"onednn": library.status().line(), "inference": inference(args)}))
        return 0
    if args.child:
        print(json.dumps(steps_child(args)))
        return 0
    if args.child_layers:
        host_memory.keep_freed_memory()
        from jaxconv._src.native import library
        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        print(json.dumps({"onednn": library.status().line(), "layers": layers(args, dtype)}))
        return 0
    kept_by_call = False
    if "layers" in args.parts:
        # the layers in the steps' kept mode (keep_freed_memory: torch's allocations are this
        # process's too), before anything starts JAX's backends (machine.describe() does):
        # with glibc's defaults a large output is fresh pages on each call
        try:
            kept_by_call = host_memory.keep_freed_memory()
        except RuntimeError:  # a caller (a test) whose JAX backends exist: its own settings
            pass
    if (backend := jax.default_backend()) != "cpu":  # starts JAX's backends
        # the contenders are CPU programs: torch's twin runs on the CPU, and the layers and the
        # machine's peak are the CPU's
        ap.error(f"times training steps on the CPU, and JAX's default backend here is {backend}; "
                 "run it with JAX_PLATFORMS=cpu")
    info = machine.describe()
    if args.dtype == "bfloat16" and "bfloat16" not in info["jaxconv_onednn_dtypes"] \
            and not args.force_dtype:
        ap.error("--dtype bfloat16: jaxconv's oneDNN lowering does not compute bfloat16 on this "
                 f"CPU ({info['jaxconv_onednn']}); --force-dtype times it anyway")
    info["measured_matmul_gflops"] = machine.measured_matmul_gflops()
    if args.dtype == "bfloat16":
        info["bfloat16_arithmetic"] = ("native: oneDNN computes bfloat16 on this CPU"
                                       if "bfloat16" in info["jaxconv_onednn_dtypes"] else
                                       "emulated: oneDNN computes no bfloat16 on this CPU "
                                       "(--force-dtype)")
        print(f"bfloat16 arithmetic: {info['bfloat16_arithmetic']}", file=sys.stderr)
    result: dict[str, Any] = {"machine": info, "command": " ".join(
        ["jaxconv bench models", *(argv if argv is not None else sys.argv[1:])])}
    if "steps" in args.parts:
        result["steps"] = steps(args)
    if "layers" in args.parts:
        result["layers_memory_kept"] = kept_by_call or host_memory.keeps_freed_memory()
        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        result["layers"] = layers(args, dtype)
    if "inference" in args.parts:
        result["inference"] = (inference(args) if args.inference_runs <= 1
                               else inference_runs(args))
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
