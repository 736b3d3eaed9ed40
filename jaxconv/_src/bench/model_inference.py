"""Serving: the forward pass of each model (``jaxconv bench models --parts inference``).

Per model, batch and dtype, one call of the model's forward in inference mode (BatchNorm with
its running statistics), by each contender, interleaved in one process (a fresh random order
each round, each contender's block after at least 20 ms of its untimed calls), each call timed
alone (latency: the call, then its result ready); the JAX contenders serve the model as a
server holds it, its variables device arrays closed over (constants of the program, as every
other contender's weights are part of its model) and the input a device array, put once:

* ``lax``: ``jax.jit(functools.partial(model.apply, variables))``, the flax model as written;
* ``accelerate``: ``jax.jit(jaxconv.accelerate(functools.partial(model.apply, variables)))``
  (its constant filters packed once: docs/onednn.md, "Packed filters");
* ``torch``: the ``torch.nn`` twin in ``eval()`` under ``torch.inference_mode()``, in the
  faster of its two memory formats (timed first);
* ``openvino``: the torch twin converted by ``openvino.convert_model`` and compiled for the
  CPU with the latency hint (``PERFORMANCE_HINT=LATENCY``); float32 with
  ``INFERENCE_PRECISION_HINT=f32``, bfloat16 with OpenVINO's default on this CPU.

Every contender runs on the process's CPUs (its affinity mask, ``measured.usable_cpus``):
XLA's pool and oneDNN's OpenMP team size themselves by it, PyTorch is given it
(``torch.set_num_threads``) and OpenVINO too (``INFERENCE_NUM_THREADS``), so that under
``taskset`` (``benchmarks/scaling.py``) each runs that many threads.

The models: ResNet-18, ResNet-50, MobileNetV2 and flax's MNIST CNN (``models.py``, their
running statistics drawn at random so that BatchNorm is no identity), and DCGAN's generator
(:class:`Generator`: transposed convolutions, which OpenVINO runs as ConvolutionBackpropData).
Each contender's output agrees with lax's float32 output to ``TOLERANCE`` of its largest
magnitude (``gap``), else the row says so (``agrees``).

A process's medians vary more than its calls do (on a 2-core Xeon VM, DCGAN's generator at
batch 1 took 1.6 ms a call under accelerate in some processes and 2.1 in others, OpenVINO
1.35 in each): ``--inference-runs N`` runs the part in N processes (:func:`inference_runs`)
and reports each contender's median over them, each process's beside it (:func:`merge_runs`).
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import testing
from jaxconv._src.bench import models, torch_models
from jaxconv._src.lowering.measured import usable_cpus

CONTENDERS = ("lax", "accelerate", "torch", "openvino")

#: how far (over the reference's largest magnitude) an output may be from lax's float32 one: a
#: model's output gathers the error of each layer, so a multiple of one result's bound
#: (``jaxconv.testing.TOLERANCE``): float32, one per convolution of the deepest model (about 50,
#: ResNet-50's 53: errors add); bfloat16, three (each layer's result rounds to bfloat16, whose
#: own error the next layer's rounding does not add to linearly)
TOLERANCE = {"float32": 50 * testing.tolerance("float32"),
             "bfloat16": 3 * testing.tolerance("bfloat16")}


class Generator(nn.Module):
    """DCGAN's generator (Radford et al.; PyTorch's DCGAN example): a 100-vector to a 64 x 64
    image by five 4 x 4 transposed convolutions (stride 1 then 2, torch padding 0 then 1),
    BatchNorm and ReLU between, tanh at the end. flax's ``ConvTranspose`` with pads
    ``k - 1 - p`` is torch's ``ConvTranspose2d`` with padding ``p`` and the kernel reversed."""

    features: int = 64
    dtype: Any = None
    norm: Any = nn.BatchNorm

    @nn.compact
    def __call__(self, z: jax.Array) -> jax.Array:
        x = z
        widths = (8, 4, 2, 1)
        for i, w in enumerate(widths):
            p = 0 if i == 0 else 1
            x = nn.ConvTranspose(self.features * w, (4, 4), (1, 1) if i == 0 else (2, 2),
                                 padding=((3 - p, 3 - p), (3 - p, 3 - p)), use_bias=False,
                                 dtype=self.dtype, name=f"deconv{i}")(x)
            x = nn.relu(self.norm(name=f"bn{i}")(x))
        x = nn.ConvTranspose(3, (4, 4), (2, 2), padding=((2, 2), (2, 2)), use_bias=False,
                             dtype=self.dtype, name="deconv4")(x)
        return jnp.tanh(x)


#: the models served: (description, input shape without the batch)
MODELS: dict[str, tuple[str, tuple[int, ...]]] = {
    "resnet18": ("ResNet-18", (224, 224, 3)),
    "resnet50": ("ResNet-50", (224, 224, 3)),
    "mobilenet_v2": ("MobileNetV2", (224, 224, 3)),
    "mnist_cnn": ("MNIST CNN", (28, 28, 1)),
    "dcgan": ("DCGAN generator", (1, 1, 100)),
}


def _flax_model(name: str, dtype: Any) -> nn.Module:
    if name == "dcgan":
        norm = models.norm_def(True, train=False)
        return Generator(dtype=dtype, norm=norm if dtype is None else
                         functools.partial(norm, dtype=dtype))
    return models.build(name, lax.conv_general_dilated, True, dtype=dtype, train=False)


def variables(name: str, x: np.ndarray, seed: int = 0) -> dict[str, Any]:
    """The model's parameters (``models.init``'s draws) and running statistics drawn at
    random (mean normal with deviation 0.1, variance uniform in [0.5, 1.5])."""
    rng = np.random.default_rng(seed)
    if name == "dcgan":
        shapes = jax.eval_shape(_flax_model(name, None).init, jax.random.key(seed), x)

        def draw(path: tuple[Any, ...], leaf: jax.ShapeDtypeStruct) -> np.ndarray:
            key = path[-1].key
            if key == "kernel":
                fan_in = int(np.prod(leaf.shape[:-1]))
                return (rng.standard_normal(leaf.shape) / np.sqrt(fan_in)).astype(leaf.dtype)
            return np.full(leaf.shape, 1.0 if key in ("scale", "var") else 0.0, leaf.dtype)
        out = jax.tree_util.tree_map_with_path(draw, shapes)
    else:
        out = models.init(name, jnp.asarray(x), True, seed)
    stats = out.get("batch_stats", {})

    def stat(path: tuple[Any, ...], leaf: Any) -> np.ndarray:
        shape = np.shape(leaf)
        if path[-1].key == "mean":
            return (0.1 * rng.standard_normal(shape)).astype(np.float32)
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return {"params": out["params"], "batch_stats": jax.tree_util.tree_map_with_path(stat, stats)}


def _generator_modules(torch: Any) -> Any:
    """DCGAN's generator in torch.nn (PyTorch's DCGAN example), without weights."""
    nn_ = torch.nn
    layers: list[Any] = []
    chans = [100, 512, 256, 128, 64]
    for i in range(4):
        layers += [nn_.ConvTranspose2d(chans[i], chans[i + 1], 4, 1 if i == 0 else 2,
                                       0 if i == 0 else 1, bias=False),
                   nn_.BatchNorm2d(chans[i + 1], eps=1e-5), nn_.ReLU()]
    layers += [nn_.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), nn_.Tanh()]
    return nn_.Sequential(*layers)


def _torch_generator(torch: Any, v: dict[str, Any]) -> Any:
    m = _generator_modules(torch)
    p, s = v["params"], v["batch_stats"]
    with torch.no_grad():
        for i in range(5):
            k = np.asarray(p[f"deconv{i}"]["kernel"])  # (kh, kw, in, out), not reversed
            conv = m[3 * i]
            conv.weight.copy_(torch.from_numpy(np.ascontiguousarray(
                k[::-1, ::-1].transpose(2, 3, 0, 1))))
            if i < 4:
                bn = m[3 * i + 1]
                bn.weight.copy_(torch.from_numpy(np.asarray(p[f"bn{i}"]["scale"])))
                bn.bias.copy_(torch.from_numpy(np.asarray(p[f"bn{i}"]["bias"])))
                bn.running_mean.copy_(torch.from_numpy(np.asarray(s[f"bn{i}"]["mean"])))
                bn.running_var.copy_(torch.from_numpy(np.asarray(s[f"bn{i}"]["var"])))
    return m.eval()


def _skeleton(torch: Any, name: str) -> Any:
    """The torch twin of ``name`` without its weights (what the conversion's child builds)."""
    if name == "dcgan":
        return _generator_modules(torch)
    return torch_models._modules(torch, name, True, models.MODELS[name].classes)


def openvino_ir(torch: Any, twin: Any, name: str, x: np.ndarray, directory: pathlib.Path
                ) -> pathlib.Path:
    """The twin converted to OpenVINO's IR by a child process (``--convert``): OpenVINO's
    conversion forks (its telemetry), which a process running JAX must not do."""
    torch.save(twin.state_dict(), directory / "twin.pt")
    np.save(directory / "x.npy", x)
    subprocess.run([sys.executable, "-m", "jaxconv._src.bench.model_inference", "--convert",
                    name, str(directory)], check=True, capture_output=True, text=True)
    return directory / "model.xml"


def _convert(name: str, directory: pathlib.Path) -> None:
    import openvino as ov  # type: ignore[import-untyped]
    import torch
    twin = _skeleton(torch, name)
    twin.load_state_dict(torch.load(directory / "twin.pt"))
    twin.eval()
    x = torch.from_numpy(np.load(directory / "x.npy"))
    ov.save_model(ov.convert_model(twin, example_input=x), directory / "model.xml")


def torch_twin(torch: Any, name: str, v: dict[str, Any]) -> Any:
    """The torch twin of model ``name`` in ``eval()`` with ``v``'s parameters and statistics."""
    if name == "dcgan":
        return _torch_generator(torch, v)
    m = torch_models.build(torch, name, v["params"], True)
    state = m.state_dict()
    with torch.no_grad():
        for path, value in torch_models.flat_params(v["batch_stats"]).items():
            module, leaf = path.rsplit(".", 1)
            key = f"{module}.running_{leaf}"
            state[key].copy_(torch.from_numpy(np.array(value)))
    return m.eval()


def _nchw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _contenders(name: str, x: np.ndarray, dtype: str, which: Sequence[str]
                ) -> tuple[dict[str, Callable[[], np.ndarray]], str | None]:
    """Each contender's call (a zero-argument function returning the output as NumPy, NHWC
    where the output is an image, its result ready), and torch's memory format (None where
    torch does not run)."""
    import jaxconv
    v = variables(name, x)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else None
    model = _flax_model(name, jdtype)

    # the variables as device arrays closed over, as a server holds its weights (lax's ResNet-50
    # at batch 1 on the 2-core Xeon: 69.6 ms against 75.4 with them as arguments), and the
    # input put once (NumPy arguments are copied in on every call: MobileNetV2 at batch 1, 10.0
    # ms against 7.4)
    vj, xj = jax.tree.map(jnp.asarray, v), jnp.asarray(x)

    def apply(x: jax.Array) -> jax.Array:
        out: jax.Array = model.apply(vj, x)  # type: ignore[assignment]
        return out.astype(jnp.float32)
    calls: dict[str, Callable[[], np.ndarray]] = {}
    if "lax" in which:
        f = jax.jit(apply)
        calls["lax"] = lambda: np.asarray(f(xj))
    if "accelerate" in which:
        g = jax.jit(jaxconv.accelerate(apply))
        calls["accelerate"] = lambda: np.asarray(g(xj))
    if "torch" not in which and "openvino" not in which:
        return calls, None
    import torch
    torch.set_num_threads(usable_cpus())
    twin = torch_twin(torch, name, v)
    xt = torch.from_numpy(_nchw(x))
    out_nhwc = name == "dcgan"

    def fmt(y: Any) -> np.ndarray:
        y = y.float().numpy()
        return y.transpose(0, 2, 3, 1) if out_nhwc else y
    layout = None
    if "torch" in which:
        best = None
        for memory in (torch.contiguous_format, torch.channels_last):
            m = twin.to(memory_format=memory)
            xm = xt.contiguous(memory_format=memory)

            def call(m: Any = m, xm: Any = xm) -> np.ndarray:
                with torch.inference_mode(), torch.autocast(
                        "cpu", torch.bfloat16, enabled=dtype == "bfloat16"):
                    return fmt(m(xm))
            for _ in range(3):
                call()
            t = min(_time(call) for _ in range(5))
            if best is None or t < best[0]:
                best = (t, call, str(memory).split(".")[-1])
        assert best is not None
        calls["torch"], layout = best[1], best[2]
    if "openvino" in which:
        import openvino as ov
        core = ov.Core()
        with tempfile.TemporaryDirectory() as directory:
            ir = openvino_ir(torch, twin.to(memory_format=torch.contiguous_format), name,
                             _nchw(x), pathlib.Path(directory))
            # the same thread count as the other contenders (the process's CPUs)
            config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": usable_cpus()}
            if dtype == "float32":
                config["INFERENCE_PRECISION_HINT"] = "f32"
            compiled = core.compile_model(core.read_model(ir), "CPU", config)
        request = compiled.create_infer_request()
        xo = _nchw(x)

        def ov_call() -> np.ndarray:
            y = request.infer([xo])[compiled.output(0)]
            return y.transpose(0, 2, 3, 1) if out_nhwc else np.asarray(y)
        calls["openvino"] = ov_call
    return calls, layout


def _time(call: Callable[[], Any]) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


#: a contender's untimed calls before its timed ones last at least this long (seconds)
LEAD_IN_S = 0.02


def _lead_in(call: Callable[[], Any]) -> None:
    """Untimed calls of ``call`` (at least two, for at least :data:`LEAD_IN_S`): its threads
    awake, its caches warm, and the previous contender's threads settled (PyTorch's OpenMP
    workers spin for milliseconds after a call: ``timing.settle``). With two calls as the
    lead-in, the MNIST CNN at batch 1 took 0.43-0.47 ms a call in torch against 0.23 after
    20 ms, each contender's block of 20 calls lasting about 5 ms."""
    t0 = time.perf_counter()
    for k in range(1_000_000):
        call()
        if k >= 1 and time.perf_counter() - t0 >= LEAD_IN_S:
            break


def measure(name: str, batch: int, dtype: str, rounds: int, calls_per_round: int,
            which: Sequence[str] = CONTENDERS) -> dict[str, Any]:
    """One row: each contender's latencies (ms), their median and 90th percentile, the
    ratios against accelerate's median, and each output's gap to lax's float32 output."""
    desc, shape = MODELS[name]
    x = np.random.default_rng(1).standard_normal((batch, *shape)).astype(np.float32)
    calls, torch_layout = _contenders(name, x, dtype, which)
    # lax's float32 output, computed once untimed where lax is no contender of this row
    reference = (calls["lax"]() if dtype == "float32" and "lax" in calls
                 else _contenders(name, x, "float32", ["lax"])[0]["lax"]())
    gaps = {}
    for k, call in calls.items():
        out = call()  # compiles
        gaps[k] = float(np.max(np.abs(out - reference)) / max(np.max(np.abs(reference)), 1e-30))
    lat: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        order = list(calls)
        random.shuffle(order)
        for k in order:
            _lead_in(calls[k])
            lat[k] += [_time(calls[k]) * 1e3 for _ in range(calls_per_round)]
    med = {k: statistics.median(v) for k, v in lat.items()}
    p90 = {k: float(np.percentile(v, 90)) for k, v in lat.items()}
    row: dict[str, Any] = {
        "model": name, "description": desc, "batch": batch, "input": list(x.shape[1:]),
        "dtype": dtype, "median_ms": med, "p90_ms": p90, "calls": {k: len(v) for k, v in lat.items()},
        "gap": gaps, "tolerance": TOLERANCE[dtype],
        "agrees": {k: g <= TOLERANCE[dtype] for k, g in gaps.items()},
        "torch_layout": torch_layout}
    if "accelerate" in med:
        row["over_accelerate"] = {k: v / med["accelerate"] for k, v in med.items()}
    return row


def inference(args: Any) -> list[dict[str, Any]]:
    """Every model of ``args.inference_models`` at each of ``args.inference_batches``."""
    rows = []
    for name in args.inference_models:
        for batch in args.inference_batches:
            row = measure(name, batch, args.dtype, args.inference_rounds, args.inference_calls,
                          args.inference_contenders)
            rows.append(row)
            m = row["median_ms"]
            print(f"{row['description']:16s} batch {batch:2d} {args.dtype} "
                  + " ".join(f"{k} {m[k]:8.2f} (p90 {row['p90_ms'][k]:.2f})" for k in m)
                  + "  gaps " + ", ".join(f"{k} {g:.1e}" for k, g in row["gap"].items()),
                  flush=True)
    return rows


def merge_runs(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several processes (``runs``, each :func:`inference`'s rows in the same
    order) as one: each contender's median and p90 the median over the processes, each
    process's median (``runs_median_ms``) and the spread of them (``spread``: the slowest
    process's median over the fastest's) beside them; the largest gap, each process's
    (``runs_gap``: which process disagreed), and agreement in every process."""
    rows = []
    for i, first in enumerate(runs[0]):
        each = [run[i] for run in runs]
        if any((r["model"], r["batch"], r["dtype"]) != (first["model"], first["batch"],
                                                         first["dtype"]) for r in each):
            raise ValueError("merge_runs: the runs' rows differ in their models, batches or "
                             "dtypes")
        per_run = {k: [r["median_ms"][k] for r in each] for k in first["median_ms"]}
        med = {k: statistics.median(v) for k, v in per_run.items()}
        row = {**first, "median_ms": med,
               "p90_ms": {k: statistics.median(r["p90_ms"][k] for r in each) for k in med},
               "calls": {k: sum(r["calls"][k] for r in each) for k in med},
               "runs_median_ms": per_run,
               "spread": {k: max(v) / min(v) for k, v in per_run.items()},
               "gap": {k: max(r["gap"][k] for r in each) for k in first["gap"]},
               "runs_gap": {k: [r["gap"][k] for r in each] for k in first["gap"]},
               "agrees": {k: all(r["agrees"][k] for r in each) for k in first["agrees"]}}
        if "accelerate" in med:
            row["over_accelerate"] = {k: v / med["accelerate"] for k, v in med.items()}
        rows.append(row)
    return rows


def inference_runs(args: Any) -> list[dict[str, Any]]:
    """:func:`inference` in ``args.inference_runs`` child processes, merged
    (:func:`merge_runs`)."""
    from jaxconv._src.native import library
    cmd = [sys.executable, "-m", "jaxconv._src.bench.model_run", "--child-inference",
           "--parts", "inference", "--inference-models", *args.inference_models,
           "--inference-batches", *map(str, args.inference_batches),
           "--inference-rounds", str(args.inference_rounds),
           "--inference-calls", str(args.inference_calls),
           "--inference-contenders", *args.inference_contenders, "--dtype", args.dtype]
    runs = []
    for i in range(args.inference_runs):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"models: inference process {i + 1} failed:\n"
                               f"{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        # each process must have had the lowering this one reports
        if result["onednn"] != library.status().line():
            raise RuntimeError("models: an inference process's CPU lowering differs from this "
                               f"process's: {result['onednn']!r} vs {library.status().line()!r}")
        runs.append(result["inference"])
        print(f"inference process {i + 1} of {args.inference_runs} done", file=sys.stderr,
              flush=True)
    rows = merge_runs(runs)
    for row in rows:
        m = row["median_ms"]
        print(f"{row['description']:16s} batch {row['batch']:2d} {args.dtype} "
              + " ".join(f"{k} {m[k]:8.2f} (spread {row['spread'][k]:.2f})" for k in m),
              flush=True)
    return rows


if __name__ == "__main__":  # the conversion's child: --convert NAME DIRECTORY
    if sys.argv[1:2] == ["--convert"]:
        _convert(sys.argv[2], pathlib.Path(sys.argv[3]))
