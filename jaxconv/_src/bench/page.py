"""docs/performance.md, written from the JSONs it cites: ``python -m benchmarks.report --page``.

Every figure on the page comes from a JSON in ``docs/benchmarks/`` (``tests/docs/
test_performance.py`` writes the page again and compares): one table per question, each
measured at one commit, the commits and machines named once, at the top. A new measurement is a
new JSON named in :data:`TABLES`, then this script; what the page said before goes to
CHANGELOG.md.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any

from jaxconv._src.bench import model_report, run

ROOT = pathlib.Path(__file__).resolve().parents[3]
BENCH = ROOT / "docs" / "benchmarks"
PAGE = ROOT / "docs" / "performance.md"

#: the markers around the one block of the page that names commits (the hash test skips it)
MEASURED_BEGIN, MEASURED_END = "<!-- measured: begin -->", "<!-- measured: end -->"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((BENCH / name).read_text())
    return data


def _cpu(m: dict[str, Any]) -> str:
    """A model benchmark's machine, in words."""
    flags = m.get("isa_flags", [])
    isa = ("AVX-512 with BF16 and AMX" if "amx_bf16" in flags else
           "AVX-512 with BF16" if "avx512_bf16" in flags else
           "AVX-512" if "avx512f" in flags else "AVX2")
    torch = m.get("torch") or {}
    return (f"{m['cpu_count']}-core {m['cpu']} ({isa}), jax {m['jax']}, torch "
            f"{torch.get('version', '-').split('+')[0]}")


# ------------------------------------------------------------------------------------ tables

def _steps(jsons: list[str]) -> str:
    return model_report.lead_table([_load(j) for j in jsons])


def _slower(jsons: list[str]) -> str:
    """The models whose torch / accelerate is below 1, in words."""
    slow = [f"{r['description']} {'with' if r['batchnorm'] else 'without'} BatchNorm "
            f"({r['torch_over_accelerate']:.2f})"
            for j in jsons for r in _load(j)["steps"] if r.get("torch_over_accelerate", 2) < 1]
    return ("PyTorch's step is faster on " + ", ".join(slow) + "." if slow
            else "accelerate's step is the faster one on every model.")


def _spread(jsons: list[str]) -> str:
    """The largest spread between the processes of a model row: a contender's slowest
    process's median step over its fastest's."""
    worst = max(((v, who, r["description"], r["dtype"], r["batchnorm"]) for j in jsons
                 for r in _load(j)["steps"] for who, v in (r.get("spread") or {}).items()),
                key=lambda t: t[0])
    v, who, model, dtype, bn = worst
    return (f"Between the two processes of a row, a contender's median step moved by up to "
            f"{v - 1:.0%} ({who}'s {model} in {dtype.split()[0]} {'with' if bn else 'without'} BatchNorm)")


def _gaps(jsons: list[str]) -> str:
    """How far one step of each contender is from the other's, from the same state: the
    largest loss and parameter gaps over the models, per JSON (no BatchNorm, then with it)."""
    parts = []
    for j in jsons:
        rows = _load(j)["steps"]
        bn = "with BatchNorm" if rows[0]["batchnorm"] else "without BatchNorm"
        parts.append(f"{max(r['loss_gap'] for r in rows):.1e} in the loss and "
                     f"{max(r['param_gap'] for r in rows):.1e} in the parameters {bn}")
    return "One step of each contender from the same state agrees with the other to " + (
        ", and to ".join(parts)) + " (the largest over the models)."


def _layers(jsons: list[str]) -> str:
    (name,) = jsons
    return model_report.layers_summary(_load(name))


def _host(jsons: list[str]) -> str:
    (name,) = jsons
    data = _load(name)
    modes = {"import": "`import jaxconv` first (the default: kept, synchronous dispatch)",
             "arena-only": "glibc's settings alone, asynchronous dispatch (not taken)",
             "late": "imported after JAX's first computation",
             "off": "opted out (`JAXCONV_KEEP_FREED_MEMORY=0`)"}
    models = [s["model"] for s in data["summary"]]
    head = " | ".join(f"{m}: ms (faults a step), peak MiB" for m in models)
    lines = [f"| mode | {head} |", "|---|" + "---|" * len(models)]
    for mode, label in modes.items():
        cells = []
        for s in data["summary"]:
            if mode not in s["median_step_ms"]:
                cells.append("-")
                continue
            cells.append(f"{s['median_step_ms'][mode]:.0f} ({s['faults_per_step'][mode]:,.0f}), "
                         f"{s['peak_rss_mib'][mode]:,.0f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _lists(jsons: list[str]) -> str:
    (name,) = jsons
    summary = run.summarize(_load(name)["rows"])
    lines = ["| list (kind) | problems | over jax.vjp (forward: lax), geomean | lowest "
             "| jaxconv/torch, geomean |", "|---|---|---|---|---|"]
    for key, s in summary.items():
        if key == "target_lists" or key.startswith("category:"):
            continue
        torch = s.get("geomean_jaxconv_over_torch", math.nan)
        lines.append(f"| {key} | {s['problems']} | {s['geomean_speedup_vs_vjp']:.2f}x "
                     f"| {s['min_speedup_vs_vjp']:.2f}x | {torch:.2f} |")
    t = summary["target_lists"]
    behind = ", ".join(f"`{r}`" for r in t.get("slower_beyond_noise", [])) or "none"
    lines += ["", f"Over the target lists, {t['problems']} problems: "
                  f"{t['geomean_speedup_vs_vjp']:.2f}x `jax.vjp` (geomean); behind it by over "
                  f"5% in three of four paired rounds: {behind}."]
    return "\n".join(lines)


def _serving(jsons: list[str]) -> str:
    """One row per model and batch, a column group per dtype (a JSON each)."""
    data = [_load(j)["inference"] for j in jsons]
    dtypes = [rows[0]["dtype"] for rows in data]
    head = " | ".join(f"{d}: accelerate ms, median (p90) | lax / acc. | torch / acc. "
                      f"| OpenVINO / acc." for d in dtypes)
    lines = [f"| model (batch) | {head} | outputs agree with lax's float32 (largest gap) |",
             "|---|" + "---|---|---|---|" * len(dtypes) + "---|"]
    for rows in zip(*data):
        cells, gaps, agree = [], [], True
        for r in rows:
            m, p90, over = r["median_ms"], r["p90_ms"], r["over_accelerate"]
            cells.append(f"{m['accelerate']:.2f} ({p90['accelerate']:.2f}) | "
                         + " | ".join(f"{over[k]:.2f}" for k in ("lax", "torch", "openvino")))
            gaps.append(f"{max(r['gap'].values()):.0e}")
            agree = agree and all(r["agrees"].values())
        r = rows[0]
        lines.append(f"| {r['description']} ({r['batch']}) | " + " | ".join(cells)
                     + f" | {'yes' if agree else '**no**'} ({', '.join(gaps)}) |")
    tolerances = ", ".join(f"{rows[0]['tolerance']:.0e} ({rows[0]['dtype']})" for rows in data)
    return "\n".join(lines) + f"\n\n(Tolerance: {tolerances} of the largest magnitude.)"


def _serving_processes(jsons: list[str]) -> str:
    """How many processes each dtype's figures are the median over, from its JSON's command
    (``--inference-runs N``; one without it)."""
    words = {1: "one process", 2: "two processes", 3: "three processes"}
    counts = {}
    for j in jsons:
        d = _load(j)
        found = re.search(r"--inference-runs (\d+)", d.get("command", ""))
        counts[d["inference"][0]["dtype"]] = int(found.group(1)) if found else 1

    def said(n: int) -> str:
        return ("each contender's median over " if n > 1 else "") + words.get(n, f"{n} processes")
    if len(set(counts.values())) == 1:  # one count for every dtype: said once
        return said(next(iter(counts.values())))
    return ", ".join(f"{dtype} {said(n)}" for dtype, n in counts.items())


def _serving_short(jsons: list[str]) -> str:
    """Where accelerate is slower than each peer, in words."""
    slow: dict[str, list[str]] = {"lax": [], "torch": []}
    for j in jsons:
        for r in _load(j)["inference"]:
            for k in slow:
                if r["over_accelerate"][k] < 1:
                    slow[k].append(f"{r['description']} ({r['batch']}, {r['dtype']})")
    names = {"lax": "lax", "torch": "PyTorch"}
    faster = sum(r["over_accelerate"]["openvino"] >= 1 for j in jsons
                 for r in _load(j)["inference"])
    rows = sum(len(_load(j)["inference"]) for j in jsons)
    # the serving mark: float32 latency within 1.25 times OpenVINO's
    f32 = [r for j in jsons for r in _load(j)["inference"] if r["dtype"] == "float32"]
    behind = [f"{r['description']} ({r['batch']}, {1 / r['over_accelerate']['openvino']:.2f}x)"
              for r in f32 if r["over_accelerate"]["openvino"] < 1 / 1.25]
    return (" ".join(f"Slower than {names[k]}: {', '.join(v) if v else 'none'}." for k, v in
                     slow.items()) + f" At OpenVINO's speed or faster: {faster} rows of {rows}."
            + f" In float32 within 1.25 times OpenVINO's latency: {len(f32) - len(behind)} rows "
            f"of {len(f32)}" + (f"; further behind: {', '.join(behind)}." if behind else "."))


def _scaling(jsons: list[str]) -> str:
    """One row per model and batch (and the training step), a column per thread count:
    accelerate's median ms with torch / accelerate and OpenVINO / accelerate; then each
    contender's speed-up from the fewest threads to the most."""
    (name,) = jsons
    runs = _load(name)["runs"]
    threads = [r["threads"] for r in runs]
    lo, hi = threads[0], threads[-1]
    head = " | ".join(f"{n} threads" for n in threads)
    lines = [f"| model (batch) | {head} | {hi} over {lo} threads: accelerate, torch, OpenVINO |",
             "|---|" + "---|" * len(threads) + "---|"]

    def row(label: str, found: list[dict[str, Any]], who: tuple[str, ...]) -> None:
        cells = []
        for r in found:
            ms = r["median_ms"]
            cells.append(f"{ms['accelerate']:.2f} (" + ", ".join(
                f"{ms[k] / ms['accelerate']:.2f}" for k in who) + ")")
        first, last = found[0]["median_ms"], found[-1]["median_ms"]
        gains = ", ".join(f"{first[k] / last[k]:.1f}x" for k in ("accelerate", *who))
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {gains} |")

    for i, r in enumerate(runs[0]["inference"]):
        row(f"{r['description']} ({r['batch']})", [run["inference"][i] for run in runs],
            ("torch", "openvino"))
    for i, r in enumerate(runs[0]["steps"]):
        row(f"{r['description']} training step ({r['batch']})",
            [run["steps"][i] for run in runs], ("torch",))
    agree = all(all(r["agrees"].values()) for run in runs for r in run["inference"])
    gaps = max(max(r["gap"].values()) for run in runs for r in run["inference"])
    pool = [(run["threads"], r["max_pool"]) for run in runs for r in run["steps"]
            if r.get("max_pool")]
    pools = "; ".join(f"{n}: {p['median_ms']['jaxconv']:.1f} against {p['median_ms']['torch']:.1f}"
                      for n, p in pool)
    return "\n".join(lines) + (
        f"\n\nEach cell: accelerate's median ms (torch / accelerate, OpenVINO / accelerate; "
        f"above 1: accelerate faster). Outputs agree with lax's float32 output: "
        f"{'yes' if agree else '**no**'} (largest gap {gaps:.0e}). The training step's stem max "
        f"pool alone (forward and backward), jaxconv's against torch's, ms by threads: {pools}.")


def _scaling_short(name: str) -> str:
    """Where accelerate is slower than PyTorch, and how many rows are within 1.25 times
    OpenVINO's latency, over every thread count, in words."""
    runs = _load(name)["runs"]
    slow = [f"{r['description']}{' training step' if 'steps' in part else ''} ({r['batch']}) "
            f"at {run['threads']} threads ({r['median_ms']['torch'] / r['median_ms']['accelerate']:.2f})"
            for run in runs for part in ("inference", "steps") for r in run[part]
            if r["median_ms"]["torch"] < r["median_ms"]["accelerate"]]
    rows = [r for run in runs for r in run["inference"]]
    near = sum(r["median_ms"]["accelerate"] <= 1.25 * r["median_ms"]["openvino"] for r in rows)
    return (f"Slower than PyTorch: {', '.join(slow) if slow else 'none'}. Within 1.25 times "
            f"OpenVINO's latency: {near} serving cells of {len(rows)}.")


def _gpu(jsons: list[str]) -> str:
    quick, steps = _load(jsons[0]), _load(jsons[1])
    t = quick["summary"]["target_lists"]
    lines = ["| measured | jaxconv over `jax.vjp` / lax: geomean (problems) |", "|---|---|",
             f"| `jaxconv bench --backend gpu --preset quick`, target lists "
             f"| {t['geomean_speedup_vs_vjp']:.2f}x ({t['problems']}) |"]
    for key, r in steps.items():
        model, bn = key.rsplit("-bn", 1)
        ms = r["median_ms"]
        lines.append(f"| accelerate's training step, {model}, {'with' if bn == '1' else 'no'} "
                     f"BatchNorm (batch 32) | {ms['lax'] / ms['accelerate']:.2f}x "
                     f"({ms['accelerate']:.1f} ms) |")
    return "\n".join(lines)


class Table:
    """One question of the page: its JSONs and how they become a table."""

    def __init__(self, title: str, jsons: list[str], render: Callable[[list[str]], str],
                 machine: Callable[[], str], commit: Callable[[], str]) -> None:
        self.title, self.jsons, self.render = title, jsons, render
        self.machine, self.commit = machine, commit


def _model_machine(name: str) -> Callable[[], str]:
    return lambda: _cpu(_load(name)["machine"])


def _model_commit(*names: str) -> Callable[[], str]:
    def commit() -> str:
        found = set()
        for n in names:
            data = _load(n)
            found.add((data.get("machine") or data.get("meta") or {}).get("commit"))
        return ", ".join(sorted(c or "not recorded" for c in found))
    return commit


def _scaling_machine() -> str:
    data = _load("scaling-xeon16.json")
    m, top = data["runs"][-1]["machine"], data["machine"]["topology"]
    openvino = m.get("openvino") or data["machine"]["openvino"]
    return (f"{_cpu(m)}, OpenVINO {openvino}; {top['physical_cores']} "
            f"cores, one thread each, KVM")


def _lists_machine() -> str:
    meta = _load("full.json")["meta"]
    return f"{meta['cpu_count']}-core {meta['cpu']}, jax {meta['jax']}"


TABLES = [
    Table("Whole steps against PyTorch, float32", ["models-steps-nobn-zen4.json",
                                                   "models-steps-bn-zen4.json"], _steps,
          _model_machine("models-steps-bn-zen4.json"),
          _model_commit("models-steps-nobn-zen4.json", "models-steps-bn-zen4.json")),
    Table("Whole steps against PyTorch, bfloat16", ["models-steps-bf16-nobn-zen4.json",
                                                    "models-steps-bf16-bn-zen4.json"], _steps,
          _model_machine("models-steps-bf16-bn-zen4.json"),
          _model_commit("models-steps-bf16-nobn-zen4.json", "models-steps-bf16-bn-zen4.json")),
    Table("Per layer", ["models-layers-zen4.json"], _layers,
          _model_machine("models-layers-zen4.json"), _model_commit("models-layers-zen4.json")),
    Table("Host memory", ["host-memory-order-zen4.json"], _host,
          _model_machine("host-memory-order-zen4.json"),
          _model_commit("host-memory-order-zen4.json")),
    Table("Serving on CPU", ["inference-f32-zen4.json", "inference-bf16-zen4.json"], _serving,
          _model_machine("inference-f32-zen4.json"),
          _model_commit("inference-f32-zen4.json", "inference-bf16-zen4.json")),
    Table("Serving on CPU, Intel Xeon", ["inference-f32-xeon.json", "inference-bf16-xeon.json"],
          _serving, _model_machine("inference-f32-xeon.json"),
          _model_commit("inference-f32-xeon.json", "inference-bf16-xeon.json")),
    Table("Scaling with cores", ["scaling-xeon16.json"], _scaling, _scaling_machine,
          _model_commit("scaling-xeon16.json")),
    Table("Per kernel: oneDNN's benchdnn lists", ["full.json"], _lists, _lists_machine,
          _model_commit("full.json")),
    Table("GPU", ["quick-gpu-h100.json", "accelerate-steps-h100.json"], _gpu,
          lambda: "NVIDIA H100, jax 0.11.2", lambda: "not recorded"),
]

_BY_TITLE = {t.title: t for t in TABLES}


def _measured() -> str:
    """Each commit once, with its machine (as the most detailed of its JSONs records it) and
    the tables (and JSONs) measured there."""
    groups: dict[str, list[Table]] = {}
    for t in TABLES:
        groups.setdefault(t.commit(), []).append(t)
    lines = [MEASURED_BEGIN, "| commit | machine | tables (JSONs in `docs/benchmarks/`) |",
             "|---|---|---|"]
    for commit, tables in groups.items():
        machine = max((t.machine() for t in tables), key=len)
        lines.append(f"| {commit} | {machine} | " + "; ".join(
            f"{t.title} ({', '.join(f'`{j}`' for j in t.jsons)})" for t in tables) + " |")
    return "\n".join([*lines, MEASURED_END])


def _table(title: str) -> str:
    t = _BY_TITLE[title]
    return t.render(t.jsons)


# -------------------------------------------------------------------------------------- page

def page() -> str:
    """The page, from the JSONs of :data:`TABLES`."""
    return f"""# Performance

What jaxconv costs against PyTorch, OpenVINO and the obvious JAX path (`jax.vjp` of
`lax.conv_general_dilated`). Ratios `torch / accelerate` above 1: jaxconv faster; `jaxconv/torch`
is the inverse. Which method each kernel runs is in {{doc}}`lowerings`; earlier measurements in
`CHANGELOG.md`. Written by `python -m benchmarks.report --page` from the JSONs below (a test
writes it again and compares), each table measured at one commit, on one machine:

{_measured()}

{_spread(TABLES[0].jsons + TABLES[1].jsons)}: each model row shows every process's ratio; the
contenders are interleaved in each process.

## Whole steps against PyTorch

![training-step time per model and contender, with BatchNorm](benchmarks/models_steps.png)

The script people write (`import jaxconv` at the top, the arrays and the model's variables,
then `jax.jit(jaxconv.accelerate(step), donate_argnums=...)`) against the `torch.nn` twins in
their faster memory format. One step: forward, backward, cross-entropy, SGD with momentum,
batch 8 (the MNIST CNN: 128 images of 28 x 28). Each cell: the median of two processes, each
process's ratio in brackets, then accelerate's ms.

### float32

`jaxconv bench models --parts steps --modes usual --runs 2 --reps 5 --lax-runs 0 --contenders
accelerate torch --models mnist_cnn resnet18 resnet50 mobilenet_v2 [--no-batchnorm]`:

{_table("Whole steps against PyTorch, float32")}

{_slower(TABLES[0].jsons)} {_gaps(TABLES[0].jsons)} Winograd's rounding: {{doc}}`precision`;
with BatchNorm, ResNet-50's 5 x 5 maps over 8 examples leave it a small variance to divide by.

### bfloat16

The same command with `--dtype bfloat16`: flax's `dtype=jnp.bfloat16` (float32 parameters)
against the torch twin under `torch.autocast("cpu", torch.bfloat16)`. oneDNN computes bfloat16
natively on this CPU (AVX-512 BF16); `accelerate` runs 16-bit element-wise work and sums in
float32 (`jaxconv/_src/accelerate/widening.py`):

{_table("Whole steps against PyTorch, bfloat16")}

{_slower(TABLES[1].jsons)} {_gaps(TABLES[1].jsons)}

## Per layer

Every distinct convolution of each model (batch 8; the MNIST CNN 128) and each kernel a step
runs, jaxconv's op against torch's doing the same work, interleaved, 9 rounds in each of two
processes; `step-weighted`: each row weighted by how often a step runs it; GFLOP/s: the direct
convolution's arithmetic over each side's time, against the measured float32 FMA peak (Winograd
can exceed it). `jaxconv bench models --parts layers --reps 9 --layer-runs 2`:

{_table("Per layer")}

## Host memory

The usual script per host-memory mechanism ({{doc}}`training`, "Host memory"), each mode in two
processes of its own, round-robin, no BatchNorm, batch 8: the step's median ms (minor page
faults a step) and the peak resident memory.
`python -m benchmarks.host_memory_order --models resnet18 mobilenet_v2 --batchnorm 0 --runs 2`:

{_table("Host memory")}

Kept memory costs resident memory: the process stays at its peak between steps, and is never
trimmed, also past 2 GiB free (`tests/core/test_host_memory.py`).

## Serving on CPU

The forward pass in inference mode (BatchNorm's running statistics) of the models above and
DCGAN's generator, at batch 1 and 8: `jax.jit(functools.partial(model.apply, variables))`
(lax), the same under `jaxconv.accelerate`, the torch twin under `torch.inference_mode()`, and
OpenVINO running it (latency hint; float32: `INFERENCE_PRECISION_HINT=f32`); each call timed
alone, 5 rounds of 20, interleaved, each block after 20 ms of untimed calls; the JAX variables
closed over, as the others' weights are part of their models. Above 1: accelerate faster.
`jaxconv bench models --parts inference [--dtype bfloat16]` ({{doc}}`training`, "Serve a model
on CPU"). A process's median varies more than its calls do, so a figure may be each
contender's median over several processes (`--inference-runs N`). On the 2-core Zen 4 VM
({_serving_processes(_BY_TITLE["Serving on CPU"].jsons)}):

{_table("Serving on CPU")}

{_serving_short(_BY_TITLE["Serving on CPU"].jsons)}

The same on a 2-core Intel Xeon with AVX-512 BF16 and FP16 but no AMX (its own row of the table
of machines above; {_serving_processes(_BY_TITLE["Serving on CPU, Intel Xeon"].jsons)}):

{_table("Serving on CPU, Intel Xeon")}

{_serving_short(_BY_TITLE["Serving on CPU, Intel Xeon"].jsons)}

## Scaling with cores

The serving table's float32 rows for ResNet-50 and MobileNetV2 and the ResNet-18 training step
(with BatchNorm, batch 8; accelerate and torch) on a 16-core Intel Xeon (model 207, the 2-core
Xeon's family, here with AMX), each thread count in a process of its own confined to that many
cores: XLA's pool and oneDNN's OpenMP team size themselves by the process's CPUs, PyTorch and
OpenVINO are given the same count (`torch.set_num_threads`, `INFERENCE_NUM_THREADS`).
`python -m benchmarks.scaling` (3 rounds of 20 calls; 3 step repetitions):

{_table("Scaling with cores")}

{_scaling_short("scaling-xeon16.json")}

What scales worse than OpenVINO: batch-1 latency, most of all MobileNetV2's; batch 8 past 8
threads, where a chunk of the batch was one example at most, so that 8 examples kept 8 of 16
threads busy (each example's rows now split too, {{doc}}`onednn` "Threads": not in this
table); in the training step, the max pool (XLA's; on the handler since: {{doc}}`onednn`).

## Per kernel: oneDNN's benchdnn lists

(like-for-like)=
Every problem of the eight benchdnn lists (float32, NXC/XIO, minibatch capped at 16, 8
interleaved repetitions), jaxconv's op against `jax.vjp` of `lax.conv_general_dilated` (the
forward: against lax's) and against PyTorch doing exactly the same work (a gradient alone:
`aten.convolution_backward` with its output mask; its faster layout). `jaxconv bench --preset
full` (per row: `python -m benchmarks.report docs/benchmarks/full.json`):

![speed-up over jax.vjp per benchdnn problem](benchmarks/full.png)

{_table("Per kernel: oneDNN's benchdnn lists")}

## GPU

`jaxconv bench --backend gpu --preset quick` (torch with TF32 off, float32
`Precision.HIGHEST`, minibatch capped at 16, medians of 3) and accelerate's training steps
against lax's (15 interleaved rounds, one process). Not measured again since: no GPU was lent.

{_table("GPU")}

## Method

* **Samples.** A sample runs calls back to back for at least 20 ms and blocks once, after
  untimed calls that let the last contender's threads settle; contenders run in a fresh random
  order each repetition, interleaved in one process; medians are reported. The per-kernel
  runner compares the optimized HLO of jaxconv and `jax.vjp` (the same program: noise) and counts
  a row as slower only when three of four paired rounds say so.
* **Like for like.** A peer does exactly jaxconv's work (a weight gradient is
  `aten.convolution_backward` with the output mask `[False, True, False]`, never a forward plus
  autograd; `tests/tools/test_benchmarks.py`), in its faster layout, with as many threads.
* **The models** (`jaxconv/_src/bench/models.py`, `torch_models.py`): torchvision's ResNets and
  MobileNetV2 and flax's MNIST CNN in flax, BatchNorm with torch's momentum, epsilon and
  variance; each torch twin starts from the same parameters (`tests/tools/test_bench_models.py`
  checks one step of each). The peak is measured (independent FMAs on every core for 0.5 s).

## Reproduce

```bash
pip install -e ".[bench,onednn]" && jaxconv build-onednn
jaxconv bench models                          # whole steps and per layer against torch.nn
jaxconv bench models --parts inference        # serving: the forward pass, batch 1 and 8
jaxconv bench --preset full                   # every benchdnn problem: about 25 minutes on 2 cores
python -m benchmarks.host_memory_order        # the usual script per host-memory mechanism
python -m benchmarks.scaling --out s.json     # serving and a step at 2, 4, 8, ... threads
python -m benchmarks.report --page            # this page, from docs/benchmarks/*.json
```

`jaxconv bench ...` is `python -m benchmarks.run ...` in a checkout; the runner and its shape
lists (`jaxconv/_src/bench/shapes/`) ship with the package.
"""


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    out = pathlib.Path(args[0]) if args else PAGE
    out.write_text(page())
    print(f"wrote {out} ({len(page().splitlines())} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
