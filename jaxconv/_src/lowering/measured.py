"""Timed choices: the candidates the chooser hands over, timed once per machine, and the cache
of verdicts.

The CPU table (``tables.py``) is a set of rules measured on some CPUs; on another, a small
problem's chosen formulation can run a few microseconds behind XLA's own convolution, and
Winograd's transforms may cost more than the products they save. So the chooser
(``chooser.py``: ``candidates``, which problems and which methods) hands this module a
:class:`Contest`: the rule's method and the candidates that may replace it, each a function of
the two operands. :func:`pick` compiles each alone on random operands of the problem's shapes
and dtype, times them interleaved (:func:`_sample_times`), and takes a challenger only where it
leads beyond noise (below). The verdict is cached in the process and on disk
(``~/.cache/jaxconv/measured-*.json``, :func:`machine`), so that a later process on the same
machine compiles the same program without timing again.

Every timed choice is a challenge to the rule's method (what runs with ``JAXCONV_MEASURE=0``):
each candidate's times are samples of interleaved rounds, and a challenger replaces the rule's
method only where its median is lower by more than both candidates' noise (each one's
interquartile half-range over its median) plus a margin (:func:`_beats`:
:data:`CHALLENGER_MARGIN`, :data:`WINOGRAD_TILE_MARGIN` between Winograd's tiles, where the
tile that multiplies least is the rule among them, :data:`WINOGRAD_BFLOAT16_MARGIN` for
Winograd on bfloat16, where oneDNN's direct kernel is the rule); otherwise the rule stands, so
that two candidates within noise give every process the same program. Each choice is kept as a
:class:`Decision` (its candidates' times, noise, the lead it needed and its source: timed
now, or read from the cache), which :func:`decisions` lists and ``jaxconv.explain`` shows.
The disk cache is per machine (CPU model, ISA, thread count), jax, jaxconv and handler build
(oneDNN's version included); it also keeps the handler's layout trials (:func:`save_layouts`,
:func:`load_layouts`). ``jaxconv tune`` fills it for a program, ``jaxconv tune --clear``
empties it (:func:`clear`).

``JAXCONV_MEASURE=0`` in the environment (read once per process) runs the rule's method
everywhere and times nothing (the test suite sets it: its thousands of tiny problems would
each be timed).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import pathlib
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision

#: how much faster (a fraction of the rule's median), beyond both candidates' noise, a
#: challenger must time to replace the rule's method (:func:`_beats`)
CHALLENGER_MARGIN = 0.03

#: how much faster (a fraction of its median) another tile must time than the one that
#: multiplies least to be taken instead, beyond both tiles' noise: on a noisy machine the
#: windows of timing put the 2x2 tile ahead of the 4x4 one by up to 11% where the 4x4 one is
#: the faster (a 2-core Zen 4; not measured on Intel CPUs, where a lead beyond the margin
#: still decides: docs/lowerings.md, "Winograd")
WINOGRAD_TILE_MARGIN = 0.15

#: how much faster than oneDNN's direct kernel (a fraction of oneDNN's median), beyond both
#: candidates' noise, Winograd must time on bfloat16 operands to be taken: it computes in
#: float32, at half the rate of oneDNN's bfloat16 kernels on AVX-512 BF16, and at ResNet-18's
#: 14x14 and 7x7 layers the two are close and either can lead a window of the timing. A
#: machine's cached verdicts took the 4x4 tile for all six of those kernels; with oneDNN's for
#: them, the bfloat16 step ran 1-1.5% faster (a 2-core Zen 4; not measured on Intel CPUs:
#: docs/lowerings.md, "Winograd"). So on bfloat16 the rule is oneDNN's direct kernel
#: (``chooser.rule``), and Winograd the challenger.
WINOGRAD_BFLOAT16_MARGIN = 0.10

#: each program runs at least this many times, and more until both have run this long (s);
#: Winograd's candidates (milliseconds each) until they have run _WINOGRAD_SECONDS: over a
#: tenth of a second, a noisy machine's pauses once took the median of 7 rounds to oneDNN
_MIN_ROUNDS, _MAX_ROUNDS, _MIN_SECONDS, _WINOGRAD_SECONDS = 7, 41, 0.02, 0.3
#: a whole program's rounds (:func:`pick_program`): at least this long and at most this many;
#: the more rounds, the closer their paired lead is measured (docs/lowerings.md, "Timed
#: choices")
_PROGRAM_SECONDS, _PROGRAM_ROUNDS = 0.3, 400

#: how the candidates are timed, part of the disk cache's key (a change times again). Each
#: timed call follows an untimed call of the same program: timed call by call in turn, a
#: candidate ran in the wake of the other's threads. After a call on oneDNN's OpenMP team
#: (Winograd's, a weight gradient) its idle workers spin for milliseconds, and a call that
#: splits its batch over XLA's pool then had its second chunk started on the caller's own core
#: (the MNIST CNN's bfloat16 3x3 32 -> 64 forward at 14x14 on a 2-core Zen 4: 4.0 ms after
#: Winograd's calls, 2.0 after its own; Winograd's 2.6 won, and in the training step oneDNN's
#: ran in 2.05: docs/lowerings.md, "Winograd")
_TIMING = ("each timed call after an untimed one of its own; samples of interleaved rounds; "
           "every operand on the device")
#: how a verdict is drawn from the times, also part of the disk cache's key
_RULE = (f"the rule unless beaten beyond both noises by {CHALLENGER_MARGIN:.0%}; tiles "
         f"{WINOGRAD_TILE_MARGIN:.0%}; bfloat16 Winograd {WINOGRAD_BFLOAT16_MARGIN:.0%}; "
         f"16-bit oneDNN challenged by its float32 kernel, timed on float32 operands; whole "
         f"programs by their rounds' median ratio, beyond twice its standard error, each "
         f"challenger against the program that holds")

_LOCK = threading.RLock()  # a combinator's timing lowers (and may time) its sub-problems
_VERDICTS: dict[str, str] = {}
_DECISIONS: dict[str, Decision] = {}
_LOG = logging.getLogger("jaxconv.measured")


@dataclasses.dataclass(frozen=True)
class Decision:
    """One timed choice of ``lowering="auto"``: what ran, against what, and why.

    ``rule`` is the method the rules run (``JAXCONV_MEASURE=0``), ``verdict`` the one taken;
    ``times_ms`` each candidate's median and ``noise`` its interquartile half-range over its
    median; ``lead`` how much faster (a fraction of the incumbent's median) the deciding
    challenger timed than the incumbent it faced (the rule's method, or for Winograd the tile
    that replaced the rule's), and ``need`` the lead it had to beat (its margin plus both
    noises); ``source`` ``"measured"`` (timed in this process) or ``"cache"`` (read from the
    disk cache)."""

    kernel: str
    problem: str
    dtype: str
    rule: str
    verdict: str
    source: str
    times_ms: dict[str, float]
    noise: dict[str, float]
    lead: float
    need: float

    def line(self) -> str:
        """One line: the verdict, its source, and the lead against the need."""
        times = ", ".join(f"{m} {t:.3g} ms \u00b1{self.noise.get(m, 0):.0%}"
                          for m, t in self.times_ms.items())
        return (f"{self.kernel} {self.problem} {self.dtype}: {self.verdict} ({self.source}; "
                f"rule {self.rule}; the challenger {self.lead:+.0%} faster, needed "
                f"{self.need:.0%}; {times})")


@functools.cache
def enabled() -> bool:
    return os.environ.get("JAXCONV_MEASURE", "1") != "0"


def _cpu() -> tuple[str, str]:
    """The CPU's model name and the ISA flags that decide which kernels oneDNN and Winograd
    run (a VM may hide some of a model's)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:  # the first processor's fields
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    have = set(fields.get("flags", "").split())
    return (fields.get("model name") or platform.processor() or platform.machine(),
            " ".join(f for f in _ISA_FLAGS if f in have))


#: the ISA flags of the cache's key
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: ``taskset``, a container's
    cpuset), which XLA's pool and OpenMP size themselves by; ``os.cpu_count()`` where the
    platform has no mask."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """What the disk cache's verdicts hold for: the CPU, its ISA, the threads this process
    may run on, and the versions of jax, jaxconv and the handler (its build names oneDNN's)."""
    from jaxconv._src import version
    from jaxconv._src.native import library
    cpu, isa = _cpu()
    threads = usable_cpus()
    try:  # the handler's build (its sources, jaxlib, oneDNN): a new kernel is timed again
        handler = library.artefact().name
    except OSError:
        handler = ""
    found = library.status()
    return {"cpu": cpu, "isa": isa, "threads": threads, "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
            "jax": jax.__version__, "jaxconv": version.__version__, "handler": handler,
            "onednn": found.version if found.available else "", "timing": _TIMING,
            "rule": _RULE}


@functools.cache
def _cache_file() -> pathlib.Path:
    from jaxconv._src.native import library
    key = json.dumps(machine(), sort_keys=True)
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    return library.cache_dir() / f"measured-{tag}.json"


@functools.cache
def _disk() -> dict[str, Any]:
    """The disk cache: ``{"machine": ..., "methods": {key: record}, "layouts": {key: line}}``."""
    try:
        data = json.loads(_cache_file().read_text())
        return {"machine": data["machine"], "methods": dict(data["methods"]),
                "layouts": dict(data["layouts"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {"machine": machine(), "methods": {}, "layouts": {}}


def _write() -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_disk(), sort_keys=True, indent=0))
        tmp.replace(path)  # atomic: a concurrent writer's entries may be lost, never mixed
    except OSError:
        pass  # a read-only home: the process's own cache still holds it


def _store(key: str, record: dict[str, Any]) -> None:
    _disk()["methods"][key] = record
    _write()


def cached() -> dict[str, Any]:
    """This machine's disk cache as read now: ``machine``, ``methods`` (each verdict's record:
    ``kernel``, ``problem``, ``rule``, ``verdict``, ``lead``, ``need``, ``times_ms``,
    ``noise``) and ``layouts`` (the handler's: ``layout``, ``impl``, ``kernel``, ``x``, ``w``,
    ``threading``, ``trial_ms``, ``noise``)."""
    with _LOCK:
        _disk.cache_clear()
        data = _disk()
        return {"machine": dict(data["machine"]), "methods": dict(data["methods"]),
                "layouts": dict(data["layouts"])}


def cache_path() -> pathlib.Path:
    """This machine's disk cache of measured choices (``~/.cache/jaxconv/measured-*.json``)."""
    return _cache_file()


def clear() -> list[pathlib.Path]:
    """Removes every machine's disk cache of measured choices and forgets this process's
    verdicts (a program compiled later times again); the removed files."""
    from jaxconv._src.native import library
    removed = []
    for path in sorted({_cache_file(), *library.cache_dir().glob("measured-*.json")}):
        if not path.exists():
            continue
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass
    with _LOCK:
        _VERDICTS.clear()
        _DECISIONS.clear()
        _disk.cache_clear()
    library.forget()
    return removed


@functools.cache
def load_layouts() -> int:
    """Hands the handler this machine's layout verdicts from the disk cache, once per process
    (where measuring is on; off, the handler's trial is off too and keeps the caller's
    layouts), and stores this process's new ones at its exit (:func:`save_layouts`); the
    number handed. Called where a call is first planned on oneDNN (``chooser.plan``)."""
    from jaxconv._src.native import library
    if not library.status().available or not enabled():
        return 0  # the handler reads JAXCONV_MEASURE itself: off, no trial
    atexit.register(save_layouts)
    with _LOCK:
        known = {key: (r["layout"], r["impl"]) for key, r in _disk()["layouts"].items()
                 if isinstance(r, dict) and "layout" in r and "impl" in r}
    return library.remember(known)


def save_layouts() -> int:
    """Stores the layout verdicts of this process's trials (``library.choices()``, source
    "trial") in the disk cache, so that a later process on this machine and build takes them
    without a trial; the number added."""
    from jaxconv._src.native import library
    new = {}
    for c in library.choices():
        if c["source"] != "trial":
            continue
        kept = c["candidates"][0]
        new[c["key"]] = {"layout": kept["layout"], "impl": kept["impl"], "kernel": c["kernel"],
                         "x": list(c["x"]), "w": list(c["w"]), "threading": c["threading"],
                         "trial_ms": {f"{r['layout']} {r['impl']}": r["trial_ms"]
                                      for r in c["candidates"]},
                         "noise": {f"{r['layout']} {r['impl']}": r["noise"]
                                   for r in c["candidates"]}}
    with _LOCK:
        added = {k: v for k, v in new.items() if k not in _disk()["layouts"]}
        if added:
            _disk.cache_clear()  # another process may have written meanwhile
            _disk()["layouts"].update(added)
            _write()
    return len(added)


def decisions() -> list[Decision]:
    """The timed choices of this process's programs so far (each problem once), in order."""
    with _LOCK:
        return list(_DECISIONS.values())


def decision(kernel: Kernel, p: ConvProblem, method: str, dtype: Any, precision: Precision,
             preferred_element_type: DType, packed: bool = False) -> Decision | None:
    """The :class:`Decision` of ``kernel`` of ``p`` whose CPU table picked ``method`` (with a
    constant filter, ``packed``), where one was made in this process, else None (nothing
    timed: the rule's method)."""
    with _LOCK:
        return _DECISIONS.get(_key(kernel, p, method, dtype, precision, preferred_element_type,
                                   packed))


def _key(kernel: Kernel, p: ConvProblem, method: str, dtype: Any, precision: Precision,
         preferred_element_type: DType, packed: bool = False) -> str:
    fields = {f: getattr(p, f) for f in p.__dataclass_fields__ if f != "op"}
    return repr((str(kernel), method, str(np.dtype(dtype)), str(precision),
                 str(preferred_element_type), sorted(fields.items(), key=lambda kv: kv[0]),
                 *(("packed filter",) if packed else ())))


@dataclasses.dataclass(frozen=True)
class Contest:
    """What the chooser (``chooser.py``) hands :func:`pick`: one kernel call whose CPU table
    picked ``method``, the method that runs untimed (``rule``), and the candidates that may
    replace it, each a function of the two operands (``calls``, the rule's among them where it
    is timed); ``fewest``: for Winograd, the tile that multiplies least (the rule among the
    tiles); ``shapes``: the two operands' shapes where the calls take them otherwise than the
    kernel does (an equation's, in its own layouts)."""

    kernel: Kernel
    p: ConvProblem
    method: str
    dtype: np.dtype
    precision: Precision
    preferred_element_type: DType
    rule: str
    calls: dict[str, Callable[[Array, Array], Array]]
    fewest: str | None = None
    shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    #: the operands' dtype of the candidates timed on other operands than ``dtype``'s (a
    #: widened kernel, whose casts a program fuses into its neighbours: ``chooser._contest``)
    operand_dtypes: dict[str, np.dtype] = dataclasses.field(default_factory=dict)
    #: a forward or a data gradient whose filter is a constant of the program: the candidates
    #: that pack it (the second operand, a host array, as those candidates' calls take it,
    #: prepared once before they are timed) time their calls on it packed; its verdict is its
    #: own (:attr:`packed`; docs/onednn.md, "Packed filters")
    prepare: dict[str, Callable[[np.ndarray], Any]] = dataclasses.field(default_factory=dict)

    @property
    def packed(self) -> bool:
        """Whether candidates time the filter packed (a verdict of its own)."""
        return bool(self.prepare)


def pick(contest: Contest) -> str:
    """The method that runs for ``contest``: its rule, unless a challenger among its
    candidates timed faster beyond noise on this machine (:func:`_verdict`), once per problem
    and machine (the module docstring). One candidate, or measuring off: the rule."""
    c = contest
    if len(c.calls) < 2 or not enabled():
        return c.rule
    key = _key(c.kernel, c.p, c.method, c.dtype, c.precision, c.preferred_element_type,
               c.packed)

    def measure() -> dict[str, Any]:
        return _verdict(_sample_times(c, _WINOGRAD_SECONDS if c.fewest is not None else
                                      2 * _MIN_SECONDS), c)
    return _settled(key, (*c.calls, c.method), measure,
                    (str(c.kernel), _describe(c.p) + (", filter packed" if c.packed else ""),
                     str(c.dtype)))


def _settled(key: str, choices: Sequence[str], measure: Callable[[], dict[str, Any]],
             header: tuple[str, str, str]) -> str:
    """The verdict under ``key``: this process's, else the disk cache's where it names one of
    ``choices``, else the record ``measure()`` times, stored; kept with its :class:`Decision`
    (``header``: its kernel, problem and dtype as shown), which every :func:`collecting` block
    sees."""
    with _LOCK:
        if key not in _VERDICTS:
            record = _disk()["methods"].get(key)
            source = "cache"
            if not isinstance(record, dict) or record.get("verdict") not in choices:
                record = measure()
                _store(key, record)
                source = "measured"
            _VERDICTS[key] = record["verdict"]
            _DECISIONS[key] = Decision(
                *header, record["rule"], record["verdict"], source, dict(record["times_ms"]),
                dict(record["noise"]), float(record["lead"]), float(record["need"]))
            _LOG.info("%s", _DECISIONS[key].line())
        for seen in _COLLECTORS:
            seen.append(_DECISIONS[key])
        return _VERDICTS[key]


def _describe(p: ConvProblem) -> str:
    return (f"x{list(p.x_shape)} w{list(p.filter_shape)} strides {list(p.strides)}"
            + (f" groups {p.groups}" if p.groups != 1 else ""))


def _noise(samples: list[float]) -> float:
    """A candidate's noise: its samples' interquartile half-range over their median."""
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / 2 / statistics.median(samples)


def _beats(challenger: list[float], incumbent: list[float], margin: float) -> tuple[float, float]:
    """How much faster ``challenger``'s median is than ``incumbent``'s (a fraction of the
    incumbent's), and the lead it needs to replace it: ``margin`` plus both noises
    (:func:`_noise`). It wins where the first exceeds the second."""
    lead = 1 - statistics.median(challenger) / statistics.median(incumbent)
    return lead, margin + _noise(challenger) + _noise(incumbent)


def _beats_paired(challenger: list[float], incumbent: list[float], margin: float
                  ) -> tuple[float, float]:
    """As :func:`_beats`, for two programs timed in the same rounds (sample ``i`` of each
    from round ``i``): the lead is one less the median of the rounds' ratios, and the lead it
    needs ``margin`` plus twice the standard error of that median (its interquartile range's
    normal estimate over the square root of the rounds), so that a drift of the machine over
    the rounds, which moves both programs, is not counted as noise of either, and more rounds
    measure the lead more closely."""
    ratios = [c / i for c, i in zip(challenger, incumbent)]
    middle = statistics.median(ratios)
    if len(ratios) < 4:
        return 1 - middle, margin + 1.0
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    # the median's standard error: sqrt(pi / 2) sigma / sqrt(n), sigma ~ IQR / 1.349
    error = math.sqrt(math.pi / 2) * (q3 - q1) / 1.349 / math.sqrt(len(ratios)) / middle
    return 1 - middle, margin + 2 * error


def _verdict(samples: dict[str, list[float]], c: Contest) -> dict[str, Any]:
    """The verdict on ``c``, from each candidate's timed ``samples`` (s): the rule's method
    (``c.rule``) unless a challenger beats it
    (:func:`_beats`). For Winograd: of the tiles, the one that multiplies least unless another
    beats it by :data:`WINOGRAD_TILE_MARGIN`; on float32 that tile is the rule, which oneDNN's
    direct kernel must beat by :data:`CHALLENGER_MARGIN`; on bfloat16 oneDNN's is the rule,
    which the tile must beat by :data:`WINOGRAD_BFLOAT16_MARGIN`; then XLA's own program, where
    it is timed, must beat that verdict by :data:`CHALLENGER_MARGIN`. For the others XLA's own
    program must beat the table's method by :data:`CHALLENGER_MARGIN`. A record for the disk
    cache (:class:`Decision`'s fields)."""
    incumbent = verdict = c.rule
    if c.fewest is not None:
        tile = fewest = c.fewest
        best = -1.0
        for m in samples:  # another tile: a clear lead beyond both noises
            if m.startswith("winograd_") and m != fewest:
                got, needed = _beats(samples[m], samples[fewest], WINOGRAD_TILE_MARGIN)
                if got > needed and got > best:
                    best, tile = got, m
        if incumbent == "onednn":
            lead, need = _beats(samples[tile], samples["onednn"], WINOGRAD_BFLOAT16_MARGIN)
            verdict = tile if lead > need else "onednn"
        else:
            lead, need = _beats(samples["onednn"], samples[tile], CHALLENGER_MARGIN)
            verdict = "onednn" if lead > need else tile
        for own in (m for m in samples if not m.startswith("winograd_")
                    and m not in ("onednn", "onednn_f32")):  # XLA's own, small problems
            held = verdict if verdict in samples else fewest
            got, needed = _beats(samples[own], samples[held], CHALLENGER_MARGIN)
            if got > needed:
                verdict, lead, need = own, got, needed
        if verdict == fewest and incumbent != "onednn":
            verdict = incumbent  # "winograd": the tile that multiplies least
    else:  # the challenger that leads most beyond what it needs
        lead, need = max((_beats(samples[m], samples[incumbent], CHALLENGER_MARGIN)
                          for m in samples if m != incumbent), key=lambda ln: ln[0] - ln[1])
        if lead > need:
            verdict = min((m for m in samples if m != incumbent),
                          key=lambda m: statistics.median(samples[m]))
    return _record(str(c.kernel), _describe(c.p), incumbent, verdict, lead, need, samples)


def _record(kernel: str, problem: str, rule: str, verdict: str, lead: float, need: float,
            samples: dict[str, list[float]]) -> dict[str, Any]:
    """A verdict's record for the disk cache (:class:`Decision`'s fields), each candidate's
    median and noise from its ``samples`` (s)."""
    return {"kernel": kernel, "problem": problem, "rule": rule, "verdict": verdict,
            "lead": round(lead, 4), "need": round(need, 4),
            "times_ms": {m: round(statistics.median(v) * 1e3, 4) for m, v in samples.items()},
            "noise": {m: round(_noise(v), 4) for m, v in samples.items()}}


def _sample_times(c: Contest, seconds: float) -> dict[str, list[float]]:
    """Each candidate's times (s) for ``c``, compiled alone and interleaved, one sample a
    round, over at least _MIN_ROUNDS rounds and ``seconds``."""
    p, methods = c.p, tuple(c.calls)
    shapes = c.shapes or {Kernel.FORWARD: (p.x_shape, p.filter_shape),
                          Kernel.DATA: (p.y_shape, p.filter_shape),
                          Kernel.WEIGHT: (p.x_shape, p.y_shape)}[c.kernel]
    rng = np.random.default_rng(0)
    cpu = jax.devices("cpu")[0]
    with jax.ensure_compile_time_eval():  # run now, also from inside a program's lowering
        drawn = [rng.standard_normal(s) for s in shapes]
        dtypes = {m: c.operand_dtypes.get(m, c.dtype) for m in methods}
        by_dtype = {dt: tuple(jax.device_put(v.astype(dt), cpu) for v in drawn)
                    for dt in set(dtypes.values())}
        operands = {m: by_dtype[dt] for m, dt in dtypes.items()}
        # a packed filter: once, before the calls, and on the device as the other operands
        # (a host array is copied in at every timed call, which lost layers to XLA's
        # convolution: docs/lowerings.md, "Timed choices")
        for m, prepare in c.prepare.items():
            a, b = operands[m]
            operands[m] = (a, jax.device_put(prepare(np.asarray(b)), cpu))
        return _interleaved(c.calls, operands, seconds)


def _interleaved(calls: dict[str, Callable[..., Any]], operands: dict[str, tuple[Any, ...]],
                 seconds: float, max_rounds: int = _MAX_ROUNDS) -> dict[str, list[float]]:
    """Each of ``calls`` compiled alone on its ``operands`` and timed interleaved, one sample
    a round (sample ``i`` of each from round ``i``), over at least _MIN_ROUNDS rounds and
    ``seconds``, at most ``max_rounds``: the times (s)."""
    methods = tuple(calls)
    with jax.ensure_compile_time_eval():  # run now, also from inside a program's lowering
        compiled = {}
        for m in methods:
            fn = jax.jit(calls[m]).lower(*operands[m]).compile()
            jax.block_until_ready(fn(*operands[m]))  # type: ignore[no-untyped-call]
            compiled[m] = fn
        samples: dict[str, list[float]] = {m: [] for m in methods}
        start = time.perf_counter()
        for r in range(max_rounds):
            for m, timed in _round(methods, r):
                t = time.perf_counter()
                jax.block_until_ready(compiled[m](*operands[m]))  # type: ignore[no-untyped-call]
                if timed:
                    samples[m].append(time.perf_counter() - t)
            if r + 1 >= _MIN_ROUNDS and time.perf_counter() - start >= seconds:
                break
    return samples


#: the lists :func:`collecting` fills with the decisions it sees
_COLLECTORS: list[list[Decision]] = []


@contextlib.contextmanager
def collecting() -> Iterator[list[Decision]]:
    """The timed decisions (:func:`pick`, :func:`pick_program`) taken or reused inside the
    block, in order (``jaxconv.explain`` shows the whole programs')."""
    seen: list[Decision] = []
    _COLLECTORS.append(seen)
    try:
        yield seen
    finally:
        _COLLECTORS.remove(seen)


def pick_program(description: str, text: str, calls: dict[str, Callable[..., Any]],
                 avals: Sequence[Any], rule: str, kind: str = "program") -> str:
    """Which of whole programs runs (``calls``: ``rule``'s, then its challengers in order),
    each a function of operands of ``avals``: each challenger in turn replaces the program
    that holds (first ``rule``'s) where it timed faster than it by :data:`CHALLENGER_MARGIN`
    beyond twice the standard error of the lead, round by round (:func:`_beats_paired`; the
    record's lead is the last challenger's), once per program and machine (its key:
    ``text``, the program as written, hashed with the candidates' names), as for a kernel's
    candidates (:func:`pick`; the chooser's ``whole_program``, and ``product_why_not`` with
    ``kind`` "product": a matrix product's two programs). Operands: floats drawn at random,
    integers and booleans zero (an index in range). Measuring off: ``rule``."""
    if not enabled():
        return rule
    key = f"{kind} " + hashlib.sha256(f"{text}|{sorted(calls)}".encode()).hexdigest()

    def measure() -> dict[str, Any]:
        rng = np.random.default_rng(0)
        with jax.ensure_compile_time_eval():
            drawn = tuple(jax.device_put(
                rng.standard_normal(a.shape).astype(a.dtype)
                if jnp.issubdtype(a.dtype, jnp.inexact) else np.zeros(a.shape, a.dtype),
                jax.devices("cpu")[0]) for a in avals)
        samples = _interleaved(calls, dict.fromkeys(calls, drawn), _PROGRAM_SECONDS,
                               _PROGRAM_ROUNDS)
        held, lead, need = rule, 0.0, 0.0
        for challenger in (m for m in calls if m != rule):
            lead, need = _beats_paired(samples[challenger], samples[held], CHALLENGER_MARGIN)
            if lead > need:
                held = challenger
        return _record(kind, description, rule, held, lead, need, samples)
    return _settled(key, tuple(calls), measure, (kind, description, ""))


def _round(methods: tuple[str, ...], r: int) -> list[tuple[str, bool]]:
    """Round ``r``'s calls, (method, timed): the methods in turn, reversed every other round,
    each timed call after an untimed one of the same method (:data:`_TIMING`)."""
    return [(m, timed) for m in (methods if r % 2 == 0 else methods[::-1])
            for timed in (False, True)]
