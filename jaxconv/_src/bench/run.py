"""Benchmark jaxconv's gradient ops against the plain jax.vjp path and PyTorch.

For every benchdnn problem of the chosen lists it times, interleaved in one
process, each kind of computation (``--kinds``): the weight gradient (``wgrad``), the
data gradient (``dgrad``; for a deconv line the ConvTranspose forward) and the forward
convolution (``fwd``; not for deconv lines, whose forward is their ``dgrad``) through

* ``jaxconv``: the public op (its lowering chosen per problem),
* ``jax.vjp``: the obvious JAX path, ``jax.vjp`` of ``lax.conv_general_dilated`` (for a
  ``fwd`` row ``lax.conv_general_dilated`` itself: the row's ``baseline`` says which),
* ``torch``: PyTorch, when installed: that computation alone, ``torch.ops.aten.convolution_backward``
  with the output mask of the one gradient (``torch.ops.aten.convolution`` for ``fwd``) under
  ``no_grad`` (oneDNN on CPU, cuDNN on GPU), the faster of NCHW and channels-last, an explicit
  pad only where pads differ,

and reports medians, ratios, GFLOP/s and compile times, as JSON and a plot.

``--backend gpu`` runs JAX on CUDA (or ROCm) and torch on its GPU; float32 is then computed
exactly everywhere: ``Precision.HIGHEST`` for jaxconv and jax.vjp, TF32 off in torch.

It ships with the package (``jaxconv bench``, the shape lists as package data) and is also
``python -m benchmarks.run`` in a source checkout. Results go to ``--out``, by default
``benchmarks/results/<preset>.json`` under the current directory when it is a source checkout,
else ``jaxconv-bench-results/<preset>.json``.

usage:
  jaxconv bench --preset quick            # 3 problems per list (78 s on 2 CPU cores)
  jaxconv bench --preset full             # every problem of the lists, all three kinds
  jaxconv bench --preset smoke            # three small problems (about 10 s)
  jaxconv bench --backend gpu --preset quick
  jaxconv bench --lists conv_shapes_resnet_50 --kinds wgrad --reps 7 --out r50.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import statistics
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv
from jaxconv._src import lax_refs
from jaxconv._src.bench import benchdnn, machine
from jaxconv._src.bench.timing import (  # noqa: F401 - re-exported for the scripts and tests
    _bind,
    _time,
    _time_n,
    calls_per_sample,
    cpu_model,
    geomean,
    hlo_instructions,
    interleaved,
    same_program,
)
from jaxconv._src.bench.torch_contender import _torch_impl
from jaxconv._src.native import library

TARGET_LISTS = ["conv_shapes_resnet_50", "conv_shapes_mobilenet", "conv_shapes_mobilenet_dw",
                "conv_shapes_3d", "conv_shapes_dilated"]
DECONV_LISTS = ["deconv_shapes_2d", "deconv_shapes_3d"]
KINDS = ("wgrad", "dgrad", "fwd")
KIND_LABELS = {"wgrad": "weight gradients", "dgrad": "data gradients", "fwd": "forward"}
PRESETS: dict[str, dict[str, Any]] = {
    "quick": dict(lists=TARGET_LISTS + DECONV_LISTS, per_list=3, reps=3),
    "full": dict(lists=TARGET_LISTS + DECONV_LISTS, per_list=None, reps=8),
    # CI's check that the runner works and that jaxconv is not slower than jax.vjp: three
    # small problems where jaxconv's formulation differs from jax.vjp's (run by the tests)
    "smoke": dict(lists=["conv_shapes_mobilenet_dw", "conv_shapes_3d", "deconv_shapes_2d"],
                  per_list=None, reps=3, batch_cap=2,
                  only=[("mobilenet:conv4_1/dw", "wgrad"), ("3d_gconv_channel-block-16", "wgrad"),
                        ("alexnet:deconv4", "dgrad")]),
}


def results_dir() -> pathlib.Path:
    """Where results go by default: the checkout's benchmarks/results, else a folder here."""
    here = pathlib.Path.cwd()
    return (here / "benchmarks" / "results" if (here / "benchmarks" / "__init__.py").is_file()
            else here / "jaxconv-bench-results")


def _dn(rank: int) -> tuple[str, str, str]:
    sp = "DHW"[3 - rank:]
    return (f"N{sp}C", f"{sp}IO", f"N{sp}C")


def build(prob: benchdnn.Problem, kind: str, dtype=jnp.float32,
          with_torch: bool = True, gpu: bool = False) -> dict[str, Callable]:
    """Zero-argument callables per implementation, with their inputs bound (NXC/XIO).

    The jitted programs of ``jaxconv`` and ``jax.vjp`` are also attached to each callable
    as ``.program = (jitted, args)`` so that their compiled HLO can be compared.
    """
    rng = np.random.default_rng(0)
    n, g = prob.batch, prob.groups
    x = jnp.asarray(rng.standard_normal((n, *prob.input_size, prob.in_channels)), dtype)
    dy = jnp.asarray(rng.standard_normal((n, *prob.output_size, prob.out_channels)), dtype)
    w_shape = (*prob.kernel, prob.in_channels // g, prob.out_channels)
    w = jnp.asarray(rng.standard_normal(w_shape), dtype)
    pads = list(zip(prob.pads_begin, prob.pads_end))
    # GPUs compute float32 in TF32 at the default precision: time exact float32 on both sides.
    precision = lax.Precision.HIGHEST if gpu else None
    attrs: dict[str, Any] = dict(strides=prob.strides, dilations=prob.dilations, pads_begin=prob.pads_begin,
                 pads_end=prob.pads_end, groups=g, precision=precision)

    def plain(x, w):
        return lax_refs.conv_general_dilated(x, w, prob.strides, pads, rhs_dilation=prob.dilations,
                                        dimension_numbers=_dn(prob.rank), feature_group_count=g,
                                        precision=precision)

    impls: dict[str, Callable] = {}
    if kind == "fwd":
        if prob.transposed:
            raise ValueError(f"bench: a deconv line's forward is its 'dgrad' row ({prob.name})")
        ours = jax.jit(lambda x, w: jaxconv.convolution(x, w, **attrs))
        base = jax.jit(plain)
        args = (x, w)
    elif kind == "wgrad":
        if prob.transposed:
            # ConvTranspose y -> x: src = dy (its input), diff_dst = x (its output); XIO weights
            # of the convolution read as the ConvTranspose's XOI (I letter = conv O).
            ours = jax.jit(lambda x, dy: jaxconv.conv_transpose_backward_weights(
                dy, x, (*prob.kernel, prob.in_channels // g, prob.out_channels), **attrs,
                output_padding=prob.output_padding, weights_format="XOI"))
        else:
            ours = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w_shape, **attrs))
        base = jax.jit(lambda x, dy: jax.vjp(lambda w: plain(x, w), jnp.zeros(w_shape, dtype))[1](dy)[0])
        args = (x, dy)
    else:  # dgrad: dx from dy (for a deconv line: the ConvTranspose forward)
        if prob.transposed:
            ours = jax.jit(lambda dy, w: jaxconv.conv_transpose(
                dy, w, **attrs, output_padding=prob.output_padding, filter_format="XOI"))
        else:
            ours = jax.jit(lambda dy, w: jaxconv.convolution_backward_data(
                dy, w, prob.input_size, **attrs))
        base = jax.jit(lambda dy, w: jax.vjp(lambda x: plain(x, w), jnp.zeros(x.shape, dtype))[1](dy)[0])
        args = (dy, w)
    impls["jaxconv"] = _bind(ours, args)
    if not gpu:
        impls["jaxconv+opts"] = _bind(
            jax.jit(ours, compiler_options=jaxconv.xla_cpu_compiler_options()), args)
    impls["jax.vjp"] = _bind(base, args)
    torch_fn = _torch_impl(prob, kind, np.asarray(x), np.asarray(dy), np.asarray(w), gpu=gpu) \
        if with_torch else None
    if torch_fn is not None:
        impls["torch"] = torch_fn
    return impls


def measure(prob: benchdnn.Problem, kind: str, reps: int, with_torch: bool = True,
            gpu: bool = False) -> dict[str, Any]:
    """Times one problem's gradient through every contender, interleaved in this process.

    Args:
      prob: a benchdnn problem (:func:`parse_line`, :func:`load`).
      kind: ``"wgrad"`` (weight gradient), ``"dgrad"`` (data gradient) or ``"fwd"``.
      reps: samples per contender; each sample runs enough calls to last >= 20 ms.
      with_torch: also time PyTorch's ``convolution_backward`` (when installed).
      gpu: run on the GPU (float32 at ``Precision.HIGHEST``, torch with TF32 off).

    Returns:
      The result row: medians in ms (``median_ms``), ``speedup_vs_vjp`` (jax.vjp's time over
      jaxconv's), ``jaxconv_over_torch``, GFLOP/s, compile times and the problem.
    """
    impls = build(prob, kind, with_torch=with_torch, gpu=gpu)
    compile_s = {name: _time(fn) for name, fn in impls.items()}  # first call: compile + run
    # Interleaved, in a fresh random order each rep (a fixed rotation keeps the same
    # neighbours, and a program timed right after another inherits its threads' state:
    # two copies of one program differed by 15% that way), each sample after an untimed
    # lead-in that lets the previous implementation's threads settle (timing.settle).
    times = interleaved(impls, reps)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    # jax.vjp's sample over jaxconv's, per repetition (the two taken in the same round): the
    # spread of these paired ratios is the row's noise (identical programs differ by up to
    # 25% on a small VM), their quartiles say whether a ratio below 1 is more than that
    paired = sorted(v / j for j, v in zip(times["jaxconv"], times["jax.vjp"]))
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
    row = {
        "list": prob.source, "name": prob.name, "kind": kind, "category": prob.category,
        "baseline": "lax.conv_general_dilated" if kind == "fwd" else "jax.vjp",
        "problem": {k: v for k, v in prob.__dict__.items() if k not in ("name", "source")},
        "gflop": prob.flops / 1e9,
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "gflops_per_s": {k: prob.flops / v / 1e9 for k, v in med.items()},
        "first_call_s": compile_s,
        "speedup_vs_vjp": med["jax.vjp"] / med["jaxconv"],
        "speedup_vs_vjp_quartiles": [quartiles[0], quartiles[2]],
        "same_program_as_vjp": same_program(impls["jaxconv"], impls["jax.vjp"]),
    }
    if "jaxconv+opts" in med:
        row["speedup_vs_vjp_with_opts"] = med["jax.vjp"] / med["jaxconv+opts"]
    if "torch" in med:
        row["jaxconv_over_torch"] = med["jaxconv"] / med["torch"]
        torch_impl: Any = impls["torch"]
        row["torch_layout"] = torch_impl.layout
        row["torch_explicit_pad"] = torch_impl.explicit_pad
    return row


def _key(r: dict) -> str:
    return f"{r['list']}:{r['name']}:{r['kind']}"


def _slower(r: dict) -> bool:
    return r["speedup_vs_vjp"] < 1 / 1.05


def _slower_beyond_noise(r: dict) -> bool:
    """Slower by more than 5% in at least three of four paired rounds (upper quartile of the
    paired ratios below 1/1.05); False for a row measured before the quartiles were kept."""
    return "speedup_vs_vjp_quartiles" in r and r["speedup_vs_vjp_quartiles"][1] < 1 / 1.05


def summarize(rows: list[dict]) -> dict:
    """Geometric means per list and kind (``"<list> (<kind label>)"``), per category
    (``"category:<grouped|depthwise> (<kind label>)"``) and over the target lists."""
    out = {}
    for lst, kind in sorted({(r["list"], r["kind"]) for r in rows},
                            key=lambda lk: (lk[0], KINDS.index(lk[1]))):
        sel = [r for r in rows if r["list"] == lst and r["kind"] == kind]
        out[f"{lst} ({KIND_LABELS[kind]})"] = {
            "problems": len(sel),
            "geomean_speedup_vs_vjp": geomean(r["speedup_vs_vjp"] for r in sel),
            "min_speedup_vs_vjp": min(r["speedup_vs_vjp"] for r in sel),
            "geomean_jaxconv_over_torch": geomean(
                r["jaxconv_over_torch"] for r in sel if "jaxconv_over_torch" in r),
            "geomean_best_over_torch": geomean(
                min(r["median_ms"]["jaxconv"], r["median_ms"].get("jaxconv+opts", math.inf))
                / r["median_ms"]["torch"] for r in sel if "torch" in r["median_ms"]),
        }
    for cat in ("grouped", "depthwise"):
        for kind, label in KIND_LABELS.items():
            sel = [r for r in rows if r["category"] == cat and r["kind"] == kind]
            if sel:
                out[f"category:{cat} ({label})"] = {
                    "problems": len(sel),
                    "geomean_speedup_vs_vjp": geomean(r["speedup_vs_vjp"] for r in sel),
                    "min_speedup_vs_vjp": min(r["speedup_vs_vjp"] for r in sel),
                    "geomean_jaxconv_over_torch": geomean(
                        r["jaxconv_over_torch"] for r in sel if "jaxconv_over_torch" in r)}
    target = [r for r in rows if r["list"] in TARGET_LISTS]
    if target:
        out["target_lists"] = {"problems": len(target),
                               "geomean_speedup_vs_vjp": geomean(r["speedup_vs_vjp"] for r in target),
                               "slower_than_vjp": [_key(r) for r in target if _slower(r)
                                                   and not r.get("same_program_as_vjp")],
                               "slower_same_program": [_key(r) for r in target if _slower(r)
                                                       and r.get("same_program_as_vjp")],
                               "slower_beyond_noise": [_key(r) for r in target
                                                       if _slower_beyond_noise(r)],
                               "same_program_as_vjp": sum(bool(r.get("same_program_as_vjp"))
                                                          for r in target)}
    return out


def plot(rows: list[dict], path: pathlib.Path, backend: str = "cpu") -> None:
    """Per list and kind: every row's speed-up over jax.vjp (dots) and over torch (crosses)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    groups = sorted({(r["list"], r["kind"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(groups)), 4.2))
    rng = np.random.default_rng(0)
    for i, (lst, kind) in enumerate(groups):
        sel = [r for r in rows if r["list"] == lst and r["kind"] == kind]
        vjp = [r["speedup_vs_vjp"] for r in sel]
        jit = rng.uniform(-0.15, 0.15, len(sel))
        ax.scatter(i - 0.12 + jit, vjp, s=12, color="tab:blue", alpha=0.7,
                   label="jaxconv vs jax.vjp" if i == 0 else None)
        ax.plot([i - 0.3, i + 0.06], [geomean(vjp)] * 2, color="tab:blue", lw=2.5)
        tor = [1 / r["jaxconv_over_torch"] for r in sel if "jaxconv_over_torch" in r]
        if tor:
            ax.scatter(i + 0.18 + jit[: len(tor)], tor, s=12, marker="x", color="tab:orange",
                       alpha=0.7, label="jaxconv vs torch" if i == 0 else None)
            ax.plot([i + 0.06, i + 0.36], [geomean(tor)] * 2, color="tab:orange", lw=2.5)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speed-up of jaxconv (>1: jaxconv faster)")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{lst.replace('deconv_shapes_', 'deconv ').replace('conv_shapes_', '')}"
                        f"\n{kind}" for lst, kind in groups], fontsize=8)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"jaxconv gradient ops ({backend}, f32): each problem a point, "
                 f"bars the geometric means", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _progress(items, desc):
    try:
        from tqdm import tqdm
        return tqdm(items, desc=desc, file=sys.stderr)
    except ImportError:
        total = len(items)

        def gen():
            for i, item in enumerate(items):
                print(f"\r{desc} {i + 1}/{total}", end="", file=sys.stderr, flush=True)
                yield item
            print(file=sys.stderr)
        return gen()


#: a data gradient (and forward) is left out where jax.vjp's dense convolution would take
#: this many multiply-adds: 3d_conv_large_shape:2 (a 192^3 kernel over a 192^3 input, one
#: output) has 4.5e8 of its own, but jax.vjp convolves the padded dy with the whole kernel at
#: every input position, 3.2e15 (hours); its forward, a 192^3 window, ran for minutes
MAX_DENSE_DATA_MACS = 1e12


def _dense_data_macs(prob: benchdnn.Problem) -> float:
    return (prob.batch * math.prod(prob.input_size) * prob.in_channels * math.prod(prob.kernel)
            * prob.out_channels / prob.groups)


def tasks_for(lists, per_list, batch_cap, only=None, kinds=KINDS):
    """(problem, kind) pairs: the first ``per_list`` problems of each list in each of ``kinds``
    (no ``fwd`` for deconv lines: their forward is ``dgrad``), or exactly ``only``."""
    if only is not None:
        by_name = {p.name: p for lst in lists for p in benchdnn.load(lst, batch_cap)}
        return [(by_name[name], kind) for name, kind in only]
    out = []
    for lst in lists:
        probs = benchdnn.load(lst, batch_cap)
        if per_list is not None:
            probs = probs[:per_list]
        for prob in probs:
            out += [(prob, kind) for kind in kinds if not (kind == "fwd" and prob.transposed)
                    and not (kind != "wgrad" and _dense_data_macs(prob) > MAX_DENSE_DATA_MACS)]
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line of ``jaxconv bench``; ``argv`` as after ``bench`` (e.g. ``["--preset", "smoke"]``).

    Returns:
      The exit status (0 on success; argparse exits with 2 on bad arguments).
    """
    ap = argparse.ArgumentParser(prog="jaxconv bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    ap.add_argument("--backend", choices=["cpu", "gpu"], default="cpu",
                    help="where JAX (and torch) compute: cpu (default) or gpu (CUDA or ROCm; "
                         "float32 at Precision.HIGHEST, torch with TF32 off)")
    ap.add_argument("--lists", nargs="+", help=f"shape lists (file names without .txt in {benchdnn.SHAPES})")
    ap.add_argument("--per-list", type=int, help="first N problems of each list")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                    help="what to time per problem (default: all three)")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--batch-cap", type=int,
                    help="cap on the minibatch (default 16, smoke 2; the file's own where "
                         "smaller)")
    ap.add_argument("--no-torch", action="store_true",
                    help="leave torch out (its OpenMP threads spin after each call and can "
                         "disturb the next measurement on a small machine)")
    ap.add_argument("--out", type=pathlib.Path,
                    help="JSON path (default: benchmarks/results/<preset>.json in a source "
                         "checkout, else jaxconv-bench-results/<preset>.json)")
    args = ap.parse_args(argv)
    preset = PRESETS[args.preset]
    lists = args.lists or preset["lists"]
    per_list = args.per_list if args.per_list is not None else preset["per_list"]
    reps = args.reps or preset["reps"]
    for lst in lists:
        if not (benchdnn.SHAPES / f"{lst}.txt").exists():
            ap.error(f"unknown list {lst!r}; see {benchdnn.SHAPES}")
    gpu = args.backend == "gpu"
    try:
        device = jax.devices(args.backend)[0]
    except RuntimeError as e:
        ap.error(f"--backend {args.backend}: JAX has no {args.backend} backend here ({e})")
    if args.batch_cap is None:
        args.batch_cap = preset.get("batch_cap", 16)
    tasks = tasks_for(lists, per_list, args.batch_cap,
                      None if args.lists or args.per_list is not None else preset.get("only"),
                      tuple(args.kinds))
    rows: list[dict] = []
    out = args.out or results_dir() / f"{args.preset}{'-gpu' if gpu else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def result() -> dict:
        return {"meta": meta, "summary": summarize(rows) if rows else {}, "rows": rows}

    meta = {"jax": jax.__version__, "backend": device.platform,
            "precision": "HIGHEST (torch: TF32 off)" if gpu else "default",
            "devices": [str(device)], "cpu_count": os.cpu_count(), "cpu": cpu_model(),
            "onednn": library.status().line(),
            "platform": platform.platform(), "reps": reps, "batch_cap": args.batch_cap,
            "commit": machine.commit(),
            "command": " ".join(["jaxconv bench", *(argv if argv is not None else sys.argv[1:])])}
    with jax.default_device(device):
        for prob, kind in _progress(tasks, "benchmarks"):
            rows.append(measure(prob, kind, reps, with_torch=not args.no_torch, gpu=gpu))
            # the rows so far, after each (a long run stopped midway keeps them)
            out.write_text(json.dumps({**result(), "partial": True}, indent=1))
    out.write_text(json.dumps(result(), indent=1))
    plot(rows, out.with_suffix(".png"), device.platform)
    print("median time per call in ms; x vjp = jax.vjp's time / jaxconv's; /torch = jaxconv's "
          "time / torch's")
    print(f"{'list':26s} {'problem':28s} {'kind':5s} {'jaxconv':>9s} {'jax.vjp':>9s} "
          f"{'torch':>9s} {'x vjp':>7s} {'/torch':>7s}")
    for r in rows:
        m = r["median_ms"]
        print(f"{r['list'][:26]:26s} {r['name'][:28]:28s} {r['kind']:5s} {m['jaxconv']:9.2f} "
              f"{m['jax.vjp']:9.2f} {m.get('torch', float('nan')):9.2f} "
              f"{r['speedup_vs_vjp']:7.2f} {r.get('jaxconv_over_torch', float('nan')):7.2f}")
    print(json.dumps(summarize(rows), indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
