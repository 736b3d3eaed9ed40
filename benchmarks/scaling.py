"""How the CPU figures scale with cores: serving latency and a training step at 2, 4, 8, ... threads.

Each thread count runs ``jaxconv bench models --parts steps inference`` in a child process
confined to that many CPUs (its affinity mask, ``os.sched_setaffinity``: one CPU of each
physical core first, then their siblings). Every contender sizes itself by the mask
(``measured.usable_cpus``): XLA's pool and oneDNN's OpenMP team do so themselves, PyTorch is
given it (``torch.set_num_threads``) and OpenVINO too (``INFERENCE_NUM_THREADS``), so each
runs as many threads as the row says, interleaved with the others in the same process as in
the serving and step tables. The verdicts of ``accelerate``'s contests are measured per
thread count (the verdict cache's key holds the thread count).

Writes one JSON: the machine (its CPUs and their cores), and each thread count's
``jaxconv bench models`` result (``inference`` rows, ``steps`` rows, the child's machine).
``python -m benchmarks.report --page`` renders it (docs/performance.md, "Scaling with cores").

usage: python -m benchmarks.scaling [--threads 2 4 8 16] [--inference-models resnet50
         mobilenet_v2] [--steps-models resnet18] [--rounds 3] [--reps 3] --out F
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

from jaxconv._src.bench import machine
from jaxconv._src.bench.timing import cpu_model
from jaxconv._src.lowering.measured import usable_cpus


def cpus_by_core() -> list[int]:
    """This process's CPUs, one of each physical core first (then the second of each, ...):
    the first n of them are n cores where the machine has n, not n hyperthreads of n/2."""
    mine = sorted(os.sched_getaffinity(0))
    rank: dict[tuple[str, str], int] = {}
    order = []
    for cpu in mine:
        top = pathlib.Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = ((top / "physical_package_id").read_text().strip(),
                    (top / "core_id").read_text().strip())
        except OSError:
            core = ("?", str(cpu))
        rank[core] = rank.get(core, -1) + 1
        order.append((rank[core], cpu))
    return [cpu for _, cpu in sorted(order)]


def topology() -> dict[str, Any]:
    """The CPUs and the physical cores behind them (sysfs), and the order they are taken in."""
    order = cpus_by_core()
    cores = set()
    for cpu in order:
        top = pathlib.Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((top / "physical_package_id").read_text().strip(),
                       (top / "core_id").read_text().strip()))
        except OSError:
            cores.add(("?", str(cpu)))
    return {"cpus": len(order), "physical_cores": len(cores), "order": order}


def run_one(threads: int, cpus: list[int], args: argparse.Namespace, out: pathlib.Path
            ) -> dict[str, Any]:
    """``jaxconv bench models`` on the first ``threads`` of ``cpus``; its JSON result."""
    cmd = [sys.executable, "-m", "benchmarks.models", "--parts", "steps", "inference",
           "--models", *args.steps_models, "--modes", "usual", "--runs", "1", "--lax-runs", "0",
           "--reps", str(args.reps), "--contenders", "accelerate", "torch",
           "--inference-models", *args.inference_models, "--inference-batches",
           *map(str, args.batches), "--inference-rounds", str(args.rounds),
           "--inference-contenders", *args.inference_contenders, "--out", str(out)]
    mask = sorted(cpus[:threads])
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    # the child confines itself, then becomes the benchmark (no preexec_fn: a fork of this
    # process, whose JAX may be running, is what JAX warns of)
    confine = (f"import os, sys; os.sched_setaffinity(0, {mask}); "
               "os.execv(sys.executable, sys.argv[1:])")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", confine, *cmd], check=True, env=env,
                   cwd=pathlib.Path(__file__).parents[1])
    data: dict[str, Any] = json.loads(out.read_text())
    data["threads"], data["cpus"], data["seconds"] = threads, mask, time.perf_counter() - t0
    print(f"{threads} threads: {data['seconds']:.0f} s", file=sys.stderr, flush=True)
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", nargs="+", type=int)
    ap.add_argument("--inference-models", nargs="+", default=["resnet50", "mobilenet_v2"])
    ap.add_argument("--inference-contenders", nargs="+",
                    default=["accelerate", "torch", "openvino"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--steps-models", nargs="+", default=["resnet18"])
    ap.add_argument("--rounds", type=int, default=3, help="inference rounds of 20 calls")
    ap.add_argument("--reps", type=int, default=3, help="training-step repetitions")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args(argv)
    cpus = cpus_by_core()
    threads = args.threads or [n for n in (2, 4, 8, 16, 32, 64) if n <= len(cpus)]
    if max(threads) > len(cpus):
        ap.error(f"--threads: at most the {len(cpus)} CPUs this process may run on, got "
                 f"{max(threads)}")
    result: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.scaling", *(argv or sys.argv[1:])]),
        "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
                    "usable_cpus": usable_cpus(), "topology": topology(),
                    "commit": machine.commit()},
        "runs": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in threads:  # each thread count written as it ends (a run cut short keeps them)
            result["runs"].append(run_one(n, cpus, args, pathlib.Path(tmp) / f"{n}.json"))
            args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
