"""The CPU table's choice checked against XLA's own program, by timing both on this machine.

The CPU table (``backends.py``) is a set of rules measured on some CPUs; on another, a small
problem's chosen formulation can run a few microseconds behind XLA's own convolution. So, for
a problem small enough to time in a few milliseconds (at most :data:`MEASURE_MAX_MACS`
multiply-adds), the first lowering of a kernel for the CPU times the table's method and XLA's
own program for that kernel (:data:`XLA_OWN`: the forward as one ``lax.conv_general_dilated``,
the gradients as the program ``jax.vjp`` emits), each compiled alone on random operands of the
problem's shapes and dtype, interleaved (:func:`_median_times`), and takes XLA's where its
median is lower. The verdict is cached in the process and on disk, per CPU model, jax version
and handler build (``~/.cache/jaxconv/measured-*.json``), so that a later process on the same
machine compiles the same program without timing again. Larger problems keep the table's
method: at their size the table's rules were measured on both Intel and AMD CPUs
(docs/performance.md).

Winograd (``"winograd"``, which the table picks for 3x3 stride-1 problems from
``backends.WINOGRAD_MIN_CHANNELS`` channels and ``WINOGRAD_MIN_POSITIONS`` output positions per
image) is timed the same way, each tile that its accuracy rule allows
(``winograd.timed_tiles``: ``"winograd_4x4"``, ``"winograd_3x3"`` where it multiplies less,
``"winograd_2x2"``) against oneDNN's direct kernel (``"onednn"``), up to
:data:`WINOGRAD_MEASURE_MAX_MACS`: whether the transforms cost less than the products they
save, and which tile wastes less at the output's edges, depend on the channels, the batch, the
output size and the machine's caches and memory (docs/lowerings.md, "Winograd"). The tile that
multiplies least (``winograd.fewest_products_tile``) is kept unless another tile timed faster
by more than :data:`WINOGRAD_TILE_MARGIN`, and on bfloat16 operands it is taken over oneDNN's
direct kernel only where it timed faster by :data:`WINOGRAD_BFLOAT16_MARGIN`
(:func:`_winograd_verdict`).

``JAXCONV_MEASURE=0`` in the environment (read once per process) keeps the table's method
everywhere (the test suite sets it: its thousands of tiny problems would each be timed).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import platform
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src import backends
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import DType, Kernel, Precision

#: XLA's own program for each kernel: what ``jax.vjp`` of ``lax.conv_general_dilated`` runs
XLA_OWN = {Kernel.FORWARD: "conv", Kernel.DATA: "vjp", Kernel.WEIGHT: "vjp"}

#: the largest problem (multiply-adds) whose choice is timed: about a millisecond on the CPUs of
#: docs/performance.md, so that both programs are timed in a few milliseconds
MEASURE_MAX_MACS = 2 ** 25

#: the largest problem whose Winograd is timed against oneDNN (about 20 ms a run on the Zen 4
#: of docs/lowerings.md); larger ones keep Winograd, which won every such problem measured
#: there (not measured on Intel CPUs)
WINOGRAD_MEASURE_MAX_MACS = 2 ** 32

#: how much faster (a fraction of its median) another tile must time than the one that
#: multiplies least to be taken instead: on a noisy machine the windows of timing put the 2x2
#: tile ahead of the 4x4 one by up to 11% where the 4x4 one is the faster (a 2-core Zen 4;
#: not measured on Intel CPUs, where a lead beyond the margin still decides: docs/lowerings.md,
#: "Winograd")
WINOGRAD_TILE_MARGIN = 0.15

#: how much faster than oneDNN's direct kernel (a fraction of oneDNN's median) Winograd must
#: time on bfloat16 operands to be taken: it computes in float32, at half the rate of oneDNN's
#: bfloat16 kernels on AVX-512 BF16, and at ResNet-18's 14x14 and 7x7 layers the two are
#: close and either can lead a window of the timing. A machine's cached verdicts took
#: the 4x4 tile for all six of those kernels; with oneDNN's for them, the bfloat16 step ran
#: 1-1.5% faster (a 2-core Zen 4; not measured on Intel CPUs: docs/lowerings.md, "Winograd")
WINOGRAD_BFLOAT16_MARGIN = 0.10

#: each program runs at least this many times, and more until both have run this long (s);
#: Winograd's candidates (milliseconds each) until they have run _WINOGRAD_SECONDS: over a
#: tenth of a second, a noisy machine's pauses once took the median of 7 rounds to oneDNN
_MIN_ROUNDS, _MAX_ROUNDS, _MIN_SECONDS, _WINOGRAD_SECONDS = 7, 41, 0.02, 0.3

#: how the candidates are timed, part of the disk cache's key (a change times again). Each
#: timed call follows an untimed call of the same program: timed call by call in turn, a
#: candidate ran in the wake of the other's threads. After a call on oneDNN's OpenMP team
#: (Winograd's, a weight gradient) its idle workers spin for milliseconds, and a call that
#: splits its batch over XLA's pool then had its second chunk started on the caller's own core
#: (the MNIST CNN's bfloat16 3x3 32 -> 64 forward at 14x14 on a 2-core Zen 4: 4.0 ms after
#: Winograd's calls, 2.0 after its own; Winograd's 2.6 won, and in the training step oneDNN's
#: ran in 2.05: docs/lowerings.md, "Winograd")
_TIMING = "each timed call after an untimed one of its own"
#: how a Winograd verdict is drawn from the times, also part of the disk cache's key
_WINOGRAD_RULE = (f"fewest products unless {WINOGRAD_TILE_MARGIN:.0%} slower; bfloat16 "
                  f"{WINOGRAD_BFLOAT16_MARGIN:.0%} ahead of oneDNN")

_LOCK = threading.RLock()  # a combinator's timing lowers (and may time) its sub-problems
_VERDICTS: dict[str, str] = {}


@functools.cache
def enabled() -> bool:
    return os.environ.get("JAXCONV_MEASURE", "1") != "0"


@functools.cache
def _cache_file() -> pathlib.Path:
    from jaxconv._src.onednn import library
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:  # the handler's build (its sources): a new kernel is timed again
        handler = library.artefact().name
    except OSError:
        handler = ""
    key = f"{cpu}|{jax.__version__}|{os.cpu_count()}|{handler}|{_TIMING}|{_WINOGRAD_RULE}"
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    return library.cache_dir() / f"measured-{tag}.json"


@functools.cache
def _disk() -> dict[str, str]:
    try:
        return dict(json.loads(_cache_file().read_text()))
    except (OSError, ValueError):
        return {}


def _store(key: str, verdict: str) -> None:
    data = {**_disk(), key: verdict}
    _disk()[key] = verdict
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        tmp.replace(path)  # atomic: a concurrent writer's entries may be lost, never mixed
    except OSError:
        pass  # a read-only home: the process's own cache still holds it


def _key(kernel: Kernel, p: ConvProblem, method: str, dtype: Any, precision: Precision,
         preferred_element_type: DType) -> str:
    fields = {f: getattr(p, f) for f in p.__dataclass_fields__ if f != "op"}
    return repr((str(kernel), method, str(np.dtype(dtype)), str(precision),
                 str(preferred_element_type), sorted(fields.items(), key=lambda kv: kv[0])))


# What "auto" may run on one CPU device, per problem class: the candidates it times. Each
# class's candidates are checked against PyTorch on problems of that class, pads past the
# kernel and strided remainders included (tests/test_lowering_candidates.py); a method wrong
# for a class must not be one of its candidates (docs/lowerings.md, "What auto may run").
CANDIDATE_CLASSES = {
    "winograd": "the table's Winograd (3x3, stride 1): the tiles its accuracy rule allows and "
                "oneDNN's direct kernel, up to WINOGRAD_MEASURE_MAX_MACS",
    "small": "any other table method, up to MEASURE_MAX_MACS: it and XLA's own program "
             "(XLA_OWN: the forward's one convolution, the gradients' jax.vjp program)",
    "table": "the table's method alone: XLA's own program, a larger problem, or XLA's program "
             "not applying",
}


def candidate_class(kernel: Kernel, p: ConvProblem, method: str, *, xla_applies: bool) -> str:
    """Which of :data:`CANDIDATE_CLASSES` a call whose CPU table picked ``method`` is in."""
    if method == "winograd":  # the table picks it only where oneDNN applies
        return "winograd" if backends.macs(p) <= WINOGRAD_MEASURE_MAX_MACS else "table"
    if not xla_applies or method == XLA_OWN[kernel] or backends.macs(p) > MEASURE_MAX_MACS:
        return "table"
    return "small"


def timed(kernel: Kernel, p: ConvProblem, method: str, dtype: Any, *,
          xla_applies: bool) -> tuple[str, ...]:
    """The methods ``"auto"`` times for ``kernel`` of ``p`` where the CPU table picked
    ``method`` (:data:`CANDIDATE_CLASSES`); one method: nothing is timed."""
    klass = candidate_class(kernel, p, method, xla_applies=xla_applies)
    if klass == "winograd":
        from jaxconv._src.lowering import winograd
        return (*(f"winograd_{m}x{m}" for m in winograd.timed_tiles(kernel, p, dtype)),
                "onednn")
    if klass == "small":
        return (method, XLA_OWN[kernel])
    return (method,)


def pick(kernel: Kernel, p: ConvProblem, method: str, dtype: Any, precision: Precision,
         preferred_element_type: DType, *, run: Callable[..., Any], xla_applies: bool) -> str:
    """``method`` (the CPU table's) or XLA's own program for ``kernel`` (where ``xla_applies``),
    whichever ran faster on this machine (timed once per problem: the module docstring);
    for ``"winograd"``, of the tiles that the accuracy rule allows (``winograd.tile``) the one
    that multiplies least unless another timed clearly faster (:func:`_winograd_verdict`),
    or oneDNN's direct kernel where it timed faster; ``run`` is the registry's dispatch
    (``registry.run``), which compiles each."""
    candidates = timed(kernel, p, method, dtype, xla_applies=xla_applies)
    if len(candidates) < 2 or not enabled():
        return method
    fewest = ""
    if method == "winograd":
        from jaxconv._src.lowering import winograd
        side = winograd.fewest_products_tile(kernel, p, dtype)
        fewest = f"winograd_{side}x{side}"
    key = _key(kernel, p, method, dtype, precision, preferred_element_type)
    with _LOCK:
        if key not in _VERDICTS:
            verdict = _disk().get(key)
            if verdict not in candidates:
                times = _median_times(kernel, p, candidates, dtype, precision,
                                      preferred_element_type, run,
                                      _WINOGRAD_SECONDS if method == "winograd" else
                                      2 * _MIN_SECONDS)
                margin = WINOGRAD_BFLOAT16_MARGIN if np.dtype(dtype) == jnp.bfloat16 else 0.0
                verdict = (_winograd_verdict(times, fewest, margin) if fewest else
                           min(candidates, key=lambda m: times[m]))  # a tie: the first
                _store(key, verdict)
            _VERDICTS[key] = verdict
        return _VERDICTS[key]


def _winograd_verdict(times: dict[str, float], fewest: str, onednn_margin: float = 0.0) -> str:
    """Of Winograd's timed tiles and ``"onednn"`` (``times``: their medians), the tile that
    multiplies least (``fewest``) or another that timed faster by more than
    :data:`WINOGRAD_TILE_MARGIN`; then that tile where it timed faster than oneDNN's direct
    kernel by at least ``onednn_margin`` (:data:`WINOGRAD_BFLOAT16_MARGIN` for bfloat16
    operands; 0: a tie is the tile's), else ``"onednn"``."""
    tile = min((m for m in times if m.startswith("winograd_")
                and times[m] < (1 - WINOGRAD_TILE_MARGIN) * times[fewest]),
               key=lambda m: times[m], default=fewest)
    return tile if times[tile] <= (1 - onednn_margin) * times["onednn"] else "onednn"


def _median_times(kernel: Kernel, p: ConvProblem, methods: tuple[str, ...], dtype: Any,
                  precision: Precision, preferred_element_type: DType,
                  run: Callable[..., Any], seconds: float) -> dict[str, float]:
    """Each method's median time (s) for ``kernel`` on ``p``, compiled alone and interleaved,
    over at least _MIN_ROUNDS rounds and ``seconds``."""
    shapes = {Kernel.FORWARD: (p.x_shape, p.filter_shape), Kernel.DATA: (p.y_shape, p.filter_shape),
              Kernel.WEIGHT: (p.x_shape, p.y_shape)}[kernel]
    rng = np.random.default_rng(0)
    with jax.ensure_compile_time_eval():  # run now, also from inside a program's lowering
        a, b = (jax.device_put(rng.standard_normal(s).astype(dtype), jax.devices("cpu")[0])
                for s in shapes)
        calls = {}
        for m in methods:
            fn = jax.jit(functools.partial(run, kernel, p=p, method=m, backend="cpu",
                                           precision=precision,
                                           preferred_element_type=preferred_element_type))
            compiled = fn.lower(a, b).compile()
            jax.block_until_ready(compiled(a, b))  # type: ignore[no-untyped-call]
            calls[m] = compiled
        samples: dict[str, list[float]] = {m: [] for m in methods}
        start = time.perf_counter()
        for r in range(_MAX_ROUNDS):
            for m, timed in _round(methods, r):
                t = time.perf_counter()
                jax.block_until_ready(calls[m](a, b))  # type: ignore[no-untyped-call]
                if timed:
                    samples[m].append(time.perf_counter() - t)
            if r + 1 >= _MIN_ROUNDS and time.perf_counter() - start >= seconds:
                break
    return {m: statistics.median(v) for m, v in samples.items()}


def _round(methods: tuple[str, ...], r: int) -> list[tuple[str, bool]]:
    """Round ``r``'s calls, (method, timed): the methods in turn, reversed every other round,
    each timed call after an untimed one of the same method (:data:`_TIMING`)."""
    return [(m, timed) for m in (methods if r % 2 == 0 else methods[::-1])
            for timed in (False, True)]
