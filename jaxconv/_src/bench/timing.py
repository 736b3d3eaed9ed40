"""Timing and program identity for the benchmark runners (``run.py``, ``benchmarks/train_step.py``)."""

from __future__ import annotations

import math
import platform
import re
import time
from collections.abc import Callable
from typing import Any

import jax


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else ``platform.processor()``.

    Ratios against oneDNN depend on it (resnet_50's weight gradients, computed the same
    way in both runs: 1.39 of torch's time on a 2-core AMD EPYC, 1.96 on a 2-core Intel
    Xeon with AVX-512).
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _bind(jitted, args) -> Any:
    """``jitted(*args)`` as a callable without arguments; ``.program`` keeps both (for HLO)."""
    def call():
        return jitted(*args)
    call.program = (jitted, args)  # type: ignore[attr-defined]
    return call


_HLO_NOISE = re.compile(r"(, )?metadata=\{[^}]*\}|\.\d+\b")


def hlo_instructions(fn: Any) -> list[str]:
    """The optimized HLO of a bound jitted callable: instructions only, without names'
    numeric suffixes, source metadata or the module's debug tables."""
    jitted, args = fn.program
    lines = jitted.lower(*args).compile().as_text().splitlines()
    return [_HLO_NOISE.sub("", ln.strip()) for ln in lines
            if ln.strip().startswith(("%", "ROOT", "ENTRY", "}"))]


def same_program(a: Callable, b: Callable) -> bool:
    """Whether two bound jitted callables compile to the same optimized HLO."""
    return hlo_instructions(a) == hlo_instructions(b)


def _time(fn: Callable) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def _time_n(fn: Callable, n: int) -> float:
    """n back-to-back calls, then a wait for all of them: throughput, as in a training loop.

    The wait covers every array of every result (a training step returns a pytree): a
    sample that returned before its work finished would leave it queued, and the next
    contender's sample would time it.
    """
    t0 = time.perf_counter()
    outs = [fn() for _ in range(n)]
    jax.block_until_ready(outs)
    return time.perf_counter() - t0


def calls_per_sample(fn: Callable, target_s: float = 0.02, cap: int = 4096) -> int:
    """Back-to-back calls for a sample of at least ``target_s`` (doubling, as timeit.autorange).

    A count guessed from one call is wrong for tiny problems (one slow wake-up gives a
    handful of calls, and the sample then times the wake-up, not the program).
    """
    n = 1
    while n < cap and _time_n(fn, n) < target_s:
        n *= 2
    return n


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def settle(fn: Callable, calls: int) -> None:
    """Untimed calls of ``fn`` for about half a sample (``calls`` lasting >= 20 ms: >= 10 ms),
    before each of its samples: the previous contender's threads settle first.

    PyTorch's OpenMP workers (libgomp) spin for about 5 ms after each parallel region on a
    2-core AVX-512 Xeon VM (the process's CPU time during a sleep after a call), on the cores
    the next sample needs. With one untimed call as the lead-in, a jaxconv sample right after
    torch's shared the cores with that spinning: ResNet-18's 1x1 stride-2 data gradient 0.90-0.96
    ms against 0.78-0.81 with this lead-in (torch's own 0.85-0.89 either way) and its forward
    0.56-0.58 against 0.50-0.52 (torch 0.48-0.50). A training loop runs one framework: each
    contender is timed on cores its own threads hold.
    """
    _time_n(fn, max(1, calls // 2))


def interleaved(fns: dict[str, Callable], reps: int, seed: int = 0,
                faults: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each of ``fns``, ``reps`` samples each, interleaved: a fresh random
    order each repetition, each sample back-to-back calls for at least 20 ms after the
    untimed lead-in of :func:`settle`. ``faults``, where given, receives each sample's minor
    page faults per call (fresh memory: docs/training.md, "Host memory")."""
    import numpy as np

    from jaxconv._src.host_faults import minor_faults
    for fn in fns.values():  # compiled first: a first call that compiles lasts a sample, and
        _time_n(fn, 1)       # its count would be one call (latency, not throughput)
    calls = {k: calls_per_sample(fn) for k, fn in fns.items()}
    order = np.random.default_rng(seed)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k in order.permutation(list(fns)):
            settle(fns[k], calls[k])
            before = minor_faults()
            times[k].append(_time_n(fns[k], calls[k]) / calls[k])
            if faults is not None:
                faults.setdefault(k, []).append((minor_faults() - before) / calls[k])
    return times
