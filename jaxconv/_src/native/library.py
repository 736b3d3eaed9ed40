"""The oneDNN lowering's compiled handler: where it is built, and loading it (never raising).

``jaxconv build-onednn`` (:mod:`jaxconv._src.native.build`) compiles the handler's sources
(:data:`SOURCES`, in ``runtime/``, ``onednn/`` and ``winograd/``) against the oneDNN of the ``onednn`` extra into :func:`artefact`, a
path keyed by the handler's sources,
jaxlib's version and the oneDNN it was built against, so that a changed source or toolchain is
never loaded stale. :func:`status` loads it once (oneDNN itself first, from the prefix it was
built against), registers its three FFI targets for the ``cpu`` platform only, and reports what
it found; every failure becomes the reason ``jaxconv check`` prints and the ``onednn`` method's
message gives, never an exception.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import os
import pathlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

from jaxlib import version as jaxlib_version

from jaxconv._src.geometry import ConvProblem

#: the handler's C++ sources and headers, one file per concern, in four folders: ``runtime/``
#: (the FFI entry, the one OpenMP team, threads, working memory), ``onednn/`` (the oneDNN
#: binding), ``winograd/`` (Winograd's transforms, drivers, products and choices) and
#: ``pooling/`` (a max pool's forward with its argmax)
SOURCE_DIRS = tuple(pathlib.Path(__file__).with_name(d)
                    for d in ("runtime", "onednn", "winograd", "pooling"))
SOURCES = tuple(sorted(p for d in SOURCE_DIRS for p in d.glob("*.cc")))
HEADERS = tuple(sorted(p for d in SOURCE_DIRS for p in d.glob("*.h")))
#: the FFI targets, one per kernel, and the forward with its element-wise chain fused
#: (``lowering/fused.py``; registered for the cpu platform only)
TARGETS = {"forward": "jaxconv_onednn_forward", "data": "jaxconv_onednn_data",
           "weight": "jaxconv_onednn_weight", "fused": "jaxconv_onednn_fused"}
#: the Winograd lowering's FFI targets (``native/winograd/winograd.h``; the data gradient is a forward)
WINOGRAD_TARGETS = {"forward": "jaxconv_winograd_forward", "weight": "jaxconv_winograd_weight"}
#: dense matrix products on oneDNN's matmul (``native/onednn/matmul.h``; ``jaxconv/_src/matmul.py``)
MATMUL_TARGET = "jaxconv_onednn_matmul"
#: a 2D max pool's forward and argmax (``native/pooling/max_pool.h``; ``jaxconv/_src/pooling.py``)
MAX_POOL_TARGET = "jaxconv_max_pool"
#: oneDNN's CPU ISAs (dnnl_cpu_isa_t) by the value the handler reports
_ISA = {0x1: "SSE4.1", 0x3: "AVX", 0x7: "AVX2", 0xf: "AVX2-VNNI", 0x1f: "AVX2-VNNI-2",
        0x27: "AVX-512", 0x67: "AVX-512 VNNI", 0xe7: "AVX-512 BF16", 0x1ef: "AVX-512 FP16",
        0xfef: "AVX-512 AMX", 0x1fef: "AVX-512 AMX FP16"}
HOW = 'pip install -e ".[onednn]" && jaxconv build-onednn'


def prefix() -> pathlib.Path:
    """Where the ``onednn`` extra's wheels put oneDNN (``lib/``, ``include/``): the
    environment's prefix, or ``JAXCONV_ONEDNN_PREFIX``."""
    return pathlib.Path(os.environ.get("JAXCONV_ONEDNN_PREFIX", sys.prefix))


def cache_dir() -> pathlib.Path:
    """Where built handlers go: ``JAXCONV_CACHE_DIR``, else ``~/.cache/jaxconv``."""
    default = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    return pathlib.Path(os.environ.get("JAXCONV_CACHE_DIR", default / "jaxconv"))


def library_file(root: pathlib.Path) -> pathlib.Path | None:
    """oneDNN's shared library under ``root`` (``lib/libdnnl.so.3``), or None."""
    for name in ("libdnnl.so.3", "libdnnl.so"):
        if (root / "lib" / name).exists():
            return root / "lib" / name
    return None


def artefact(root: pathlib.Path | None = None) -> pathlib.Path:
    """The path of the handler built from this source, for this jaxlib and this oneDNN."""
    root = prefix() if root is None else root
    lib = library_file(root)
    key = hashlib.sha256()
    for path in SOURCES + HEADERS:
        key.update(path.name.encode())
        key.update(path.read_bytes())
    key.update(jaxlib_version.__version__.encode())
    key.update(str(lib.resolve() if lib else root).encode())
    return cache_dir() / f"libjaxconv_onednn-{key.hexdigest()[:16]}.so"


@dataclasses.dataclass(frozen=True)
class Status:
    """What loading the handler found."""

    available: bool
    #: why not (when not available), else the library loaded
    detail: str
    version: str = ""
    isa: str = ""
    #: the dtypes (numpy names) oneDNN creates all three kernels for on this CPU: float32, and
    #: bfloat16 / float16 where the ISA has them (probed once at load, not guessed from the ISA)
    dtypes: tuple[str, ...] = ()

    @property
    def avx512(self) -> bool:
        """Whether oneDNN runs its AVX-512 kernels here (the CPU table's rules differ)."""
        return self.isa.startswith("AVX-512")

    def line(self) -> str:
        """One line for ``jaxconv check``."""
        if self.available:
            return (f"CPU lowering 'onednn': oneDNN {self.version} ({self.isa}; "
                    f"{', '.join(self.dtypes)}) through XLA's FFI, {self.detail}")
        return f"CPU lowering 'onednn': not available ({self.detail}); XLA's formulations only"


_LOCK = threading.Lock()
_HANDLES: list[ctypes.CDLL] = []


@functools.cache
def status() -> Status:
    """Loads the handler once and registers its FFI targets; the outcome, never an exception."""
    with _LOCK:
        try:
            return _load()
        except Exception as e:  # noqa: BLE001 - any failure means "not available", said once
            return Status(False, f"loading failed: {type(e).__name__}: {e}")


def _load() -> Status:
    import jax

    if os.environ.get("JAXCONV_ONEDNN", "1") == "0":  # read once per process, as the library
        return Status(False, "switched off by JAXCONV_ONEDNN=0")
    root = prefix()
    lib = library_file(root)
    if lib is None:
        return Status(False, f"oneDNN not found under {root}/lib (install: {HOW})")
    path = artefact(root)
    if not path.exists():
        return Status(False, "the handler is not built for this source, jaxlib and oneDNN "
                             "(run: jaxconv build-onednn)")
    _HANDLES.append(ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL))
    handler = ctypes.CDLL(str(path))
    _HANDLES.append(handler)
    version = (ctypes.c_int * 3)()
    isa = handler.jaxconv_onednn_version(version)
    for name in (*TARGETS.values(), *WINOGRAD_TARGETS.values(), MATMUL_TARGET,
                 MAX_POOL_TARGET):
        capsule = jax.ffi.pycapsule(getattr(handler, name))  # type: ignore[no-untyped-call]
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    dtypes = tuple(name for code, name in enumerate(("float32", "bfloat16", "float16"))
                   if handler.jaxconv_onednn_supports(code))
    return Status(True, str(path), ".".join(str(v) for v in version),
                  _ISA.get(isa, f"ISA {isa:#x}"), dtypes)


def why_not(p: ConvProblem) -> str | None:
    """Why the handler does not take ``p`` (not loaded; negative pads that crop more than the
    input), or None. Negative pads reach it as crops of x (``lowering/onednn.py``); other limits
    (dtypes) are the caller's there."""
    found = status()
    if not found.available:
        return f"is not available: {found.detail}"
    if any(i + min(b, 0) + min(e, 0) < 0
           for i, b, e in zip(p.input_size, p.pads_begin, p.pads_end)):
        return (f"needs negative pads (crops) within the input, got pads_begin "
                f"{list(p.pads_begin)}, pads_end {list(p.pads_end)}")
    return None


def check_filter_move(blocks: str, o: int, i: int, taps: tuple[int, ...],
                      dtype: str = "float32") -> bool | None:
    """The handler's own move of an ``o`` x ``i`` filter with spatial extents ``taps`` between
    the caller's XIO layout and a oneDNN blocked one, against oneDNN's reorder of the same
    values. ``blocks`` names the blocked layout's inner blocks as oneDNN's format tags do:
    O x I tiles with I innermost ("16a16b", "32a32b": the transpose from XIO, a forward's or
    data gradient's input) or O innermost ("16b16a", "16b32a", "16b64a": the copy into XIO, a
    weight gradient's output), I blocked alone ("16b", "32b", "48b", "64b"), pairs of I
    innermost ("16a2b", "32a2b", "48a2b", "64a2b", "8b16a2b": bfloat16 forwards') or pairs of
    O innermost ("32b2a", "48b2a", "64b2a", "8a16b2a": bfloat16 data gradients'). ``dtype`` is
    "float32" or "bfloat16". Whether the two agree bit for bit, or None where the move does not
    apply (channels that do not fill the tiles; float32 with one channel dim blocked alone;
    pairs on float32; a bfloat16 weight gradient's copy; a move into the blocked layout on a
    CPU without AVX-512) or the library is not loaded. For the tests.

    Raises:
      ValueError: ``blocks`` or ``dtype`` is not one of those.
    """
    element = _move_element("check_filter_move", blocks, dtype)
    if not status().available:
        return None
    fn = _HANDLES[-1].jaxconv_onednn_check_filter_move
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int]
    got = fn(blocks.encode(), o, i, (ctypes.c_int64 * max(1, len(taps)))(*taps), len(taps),
             element)
    return None if got < 0 else bool(got)


def time_filter_move(blocks: str, o: int, i: int, taps: tuple[int, ...],
                     dtype: str = "float32", reps: int = 20,
                     read_after: bool = False) -> tuple[float, float] | None:
    """The seconds of the handler's own move of the filter ``check_filter_move`` describes and
    of oneDNN's reorder of it: the best of ``reps`` calls each, interleaved, the source written
    afresh before each call (as XLA writes a filter before the call that reads it), and with
    ``read_after`` each followed by one thread's read of the whole result inside the timing (as
    the next operation reads it); None where the move does not apply or the library is not
    loaded. For ``benchmarks/filter_moves.py``.

    Raises:
      ValueError: ``blocks`` or ``dtype`` is not one that ``check_filter_move`` takes.
    """
    element = _move_element("time_filter_move", blocks, dtype)
    if not status().available:
        return None
    fn = _HANDLES[-1].jaxconv_onednn_time_filter_move
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    seconds = (ctypes.c_double * 2)()
    got = fn(blocks.encode(), o, i, (ctypes.c_int64 * max(1, len(taps)))(*taps), len(taps),
             element, reps, int(read_after), seconds)
    return None if got < 0 else (seconds[0], seconds[1])


#: the blocked layouts the filter-move diagnostics take, by oneDNN's inner-block names
MOVE_LAYOUTS = ("16a16b", "32a32b", "16b", "32b", "48b", "64b", "16b16a", "16b32a", "16b64a",
                "16a2b", "32a2b", "48a2b", "64a2b", "8b16a2b", "32b2a", "48b2a", "64b2a",
                "8a16b2a")


def _move_element(name: str, blocks: str, dtype: str) -> int:
    """The element size of ``dtype`` for a filter move's diagnostics, after checking both."""
    if blocks not in MOVE_LAYOUTS:
        raise ValueError(f"{name}: blocks must be one of {MOVE_LAYOUTS}, got {blocks!r}")
    element = {"float32": 4, "bfloat16": 2}.get(dtype)
    if element is None:
        raise ValueError(f"{name}: dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    return element


def handler() -> ctypes.CDLL | None:
    """The loaded handler library (its C functions: ``native/onednn/diagnostics.cc``), or None where it
    is not loaded. The tests call the handler's pure decisions through it."""
    return _HANDLES[-1] if status().available else None


def cache_stats() -> dict[str, int]:
    """The primitive cache: entries, capacity, hits, misses, and over the process the reference
    implementations left out of the first-call trials (``reference_skipped``) and those timed
    (``reference_trials``: only where nothing else implements a problem), and the calls that
    moved the filter into oneDNN's blocked layout by jaxconv's own transpose
    (``filter_transposes``) and the weight gradients copied out of it by jaxconv's own copy
    (``filter_copies``), and the calls that read a packed filter as it is (``packed_reads``)
    or reordered it into their primitive's layout (``packed_reorders``: :func:`pack_filter`),
    and the jobs of split calls that pool threads still waiting after the last one took
    without a wake-up (``lingered_jobs``: docs/onednn.md, "Threads"), and the Winograd
    forwards whose passes ran as parts on XLA's pool, not on the OpenMP team
    (``winograd_pool_calls``: the same section); zeros when not loaded."""
    names = ("entries", "capacity", "hits", "misses", "reference_skipped", "reference_trials",
             "filter_transposes", "filter_copies", "packed_reads", "packed_reorders",
             "lingered_jobs", "winograd_pool_calls")
    if not status().available:
        return dict.fromkeys(names, 0)
    out = (ctypes.c_int64 * len(names))()
    _HANDLES[-1].jaxconv_onednn_cache_stats(out)
    return dict(zip(names, (int(v) for v in out)))


def choices() -> list[dict[str, Any]]:
    """What the handler chose for each problem in its primitive cache, most recently used
    first: ``kernel`` ("forward", "data" or "weight"), the buffers' ``x``, ``y`` and ``w``
    shapes, ``strides``, ``dilations``, ``groups``, ``threading`` ("openmp": one call on
    oneDNN's team; "single": one thread's, a chunk of the batch on XLA's pool or a whole small
    call on the calling thread), ``source`` ("trial": timed by this process's first call;
    "cache": an earlier process's verdict, :func:`remember`; "rule": the trial off,
    ``JAXCONV_MEASURE=0``, the caller's layouts; "alone": one candidate, or one too large to
    time; "packed": a call reading its filter packed, on the layouts chosen when it was
    packed), ``key`` (the problem as :func:`remember` names it) and ``candidates``: each
    implementation's activation layouts ("caller", "any", "blocked", "caller_filter": the
    caller's filter too, or "taps": a data gradient's tap products), oneDNN's impl name,
    its best first-call trial time in ms and its ``noise`` (how far the median of its timed
    runs lies above the best, a fraction of the median; None where it was not timed), the
    kept one first. Empty when not loaded. For diagnosing a layout choice, as
    ``ONEDNN_VERBOSE`` shows the calls."""
    if not status().available:
        return []
    fn = _HANDLES[-1].jaxconv_onednn_choices
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    fn.restype = ctypes.c_int64
    while True:
        size = fn(None, 0) + 1
        buf = ctypes.create_string_buffer(size + 4096)  # room for entries added meanwhile
        if fn(buf, len(buf)) < len(buf):
            break

    def shape(text: str) -> tuple[int, ...]:
        return tuple(int(v) for v in text.split(",") if v)

    found = []
    for line in buf.value.decode().splitlines():
        (kernel, x, y, w, strides, dilations, groups, threading, source, key,
         *candidates) = line.split("\t")
        rows: list[dict[str, Any]] = []
        for c in candidates:
            where, rest = c.split(" ", 1)
            impl, ms, noise = rest.rsplit(" ", 2)
            rows.append({"layout": where, "impl": impl,
                         "trial_ms": None if ms == "-" else float(ms),
                         "noise": None if noise == "-" else float(noise)})
        found.append({"kernel": kernel, "x": shape(x), "y": shape(y), "w": shape(w),
                      "strides": shape(strides), "dilations": shape(dilations),
                      "groups": int(groups), "threading": threading, "source": source,
                      "key": key, "candidates": rows})
    return found


#: the activation layouts of a candidate, as the handler numbers them (descriptors.h)
LAYOUTS = ("caller", "any", "blocked", "caller_filter", "taps")


def remember(verdicts: dict[str, tuple[str, str]]) -> int:
    """Hands the handler earlier processes' layout verdicts (``{key: (layout, impl)}``, as
    :func:`choices` names them): a problem's first call then creates that primitive without a
    trial, where oneDNN still implements it so. The number taken; 0 when not loaded."""
    if not status().available or not verdicts:
        return 0
    lines = "".join(f"{key}\t{LAYOUTS.index(layout)}\t{impl}\n"
                    for key, (layout, impl) in verdicts.items()
                    if layout in LAYOUTS and "\t" not in key + impl and "\n" not in key + impl)
    fn = _HANDLES[-1].jaxconv_onednn_remember
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = ctypes.c_int64
    return int(fn(lines.encode()))


def forget() -> None:
    """Forgets the remembered verdicts and drops the cached primitives: each problem's next
    first call chooses again."""
    if status().available:
        _HANDLES[-1].jaxconv_onednn_forget()


def set_trial(on: bool) -> None:
    """Whether first calls run the layout trial (off: the caller's layouts where oneDNN
    implements them, untimed; the default: unless ``JAXCONV_MEASURE=0``)."""
    if status().available:
        fn = _HANDLES[-1].jaxconv_onednn_set_trial
        fn.argtypes = [ctypes.c_int]
        fn(1 if on else 0)


def set_cache_capacity(entries: int) -> None:
    """Bounds the primitive cache (least recently used entries go first)."""
    if status().available:
        _HANDLES[-1].jaxconv_onednn_set_cache_capacity(ctypes.c_int64(entries))


@contextlib.contextmanager
def planned_pool_threads(threads: int) -> Iterator[None]:
    """Inside it, calls plan their chunks for ``threads`` threads of XLA's pool and run them
    on the pool there is: a machine with more cores than this one, for the tests of its splits
    (docs/onednn.md, "Threads"). The results are the same; only their chunks differ."""
    if not status().available:
        yield
        return
    plan = _HANDLES[-1].jaxconv_onednn_plan_for_pool_threads
    plan(ctypes.c_int64(threads))
    try:
        yield
    finally:
        plan(ctypes.c_int64(0))


@contextlib.contextmanager
def lingering(microseconds: float) -> Iterator[None]:
    """Inside it, the pool threads that ran a split call's chunks wait ``microseconds`` for the
    next one's (0: not at all) instead of the rule's ``kLinger``: the in-process A/B of
    ``benchmarks/onednn_linger.py`` (docs/onednn.md, "Threads"). The results are the same;
    only which threads run the chunks, and when, differ."""
    if not status().available:
        yield
        return
    set_linger = _HANDLES[-1].jaxconv_onednn_set_linger
    set_linger(ctypes.c_int64(round(microseconds * 1000)))
    try:
        yield
    finally:
        set_linger(ctypes.c_int64(-1))


@contextlib.contextmanager
def winograd_on_pool(on: bool) -> Iterator[None]:
    """Inside it, every Winograd forward runs its passes as parts on XLA's pool (``on``) or on
    the OpenMP team (not ``on``) instead of as the rule decides (``WinogradOnPool``:
    docs/onednn.md, "Threads"): the in-process A/B of ``benchmarks/winograd_pool.py``. The
    results are the same; only which threads run the passes differ."""
    if not status().available:
        yield
        return
    set_mode = _HANDLES[-1].jaxconv_onednn_set_winograd_pool
    set_mode(ctypes.c_int(1 if on else 0))
    try:
        yield
    finally:
        set_mode(ctypes.c_int(-1))


#: the kernels and the dtypes a filter is packed for, as ``jaxconv_onednn_pack_filter``
#: numbers them
_PACK_KERNELS = ("forward", "data")
_PACK_DTYPES = ("float32", "bfloat16", "float16")


def pack_filter(w: Any, *, kernel: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...],
                data_axes: tuple[int, ...], filter_axes: tuple[int, ...],
                strides: tuple[int, ...], dilations: tuple[int, ...],
                pads_begin: tuple[int, ...], pads_end: tuple[int, ...], groups: int,
                post_kinds: Any = (), post_algs: Any = (), post_alphas: Any = (),
                post_betas: Any = ()) -> tuple[Any, str]:
    """The filter ``w`` (a host array in the caller's layout) packed for ``kernel``
    (``"forward"`` or ``"data"``) of the problem the handler's attributes name
    (``native/onednn/packed.h``; ``x_shape`` and ``y_shape`` the forward's), whose call
    computes the post-ops the ``post_*`` attributes name as the fused call's do (none: a plain
    call): a uint8 array (its header, then the filter in its primitive's layout) and "", or
    None and why not."""
    import numpy as np  # noqa: PLC0415 - only where a filter is packed

    if not status().available:
        return None, "jaxconv's handler is not loaded"
    w = np.ascontiguousarray(w)
    if w.dtype.name not in _PACK_DTYPES:
        return None, f"packs {', '.join(_PACK_DTYPES)} filters, got {w.dtype}"
    fn = _HANDLES[-1].jaxconv_onednn_pack_filter
    i64 = ctypes.POINTER(ctypes.c_int64)
    f32 = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, *[i64] * 9, ctypes.c_int64,
                   ctypes.c_int64, i64, i64, f32, f32,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p,
                   ctypes.c_int64]
    fn.restype = ctypes.c_int64
    rank = w.ndim
    lists = [(ctypes.c_int64 * max(1, len(v)))(*v) for v in (
        x_shape, y_shape, w.shape, data_axes, filter_axes, strides, dilations, pads_begin,
        pads_end)]
    posts = len(post_kinds)
    if not len(post_algs) == len(post_alphas) == len(post_betas) == posts:
        raise ValueError(f"pack_filter: the post-op attributes must have one length, got "
                         f"{posts}, {len(post_algs)}, {len(post_alphas)}, {len(post_betas)}")
    post = [(ctypes.c_int64 * max(1, posts))(*map(int, post_kinds)),
            (ctypes.c_int64 * max(1, posts))(*map(int, post_algs)),
            (ctypes.c_float * max(1, posts))(*map(float, post_alphas)),
            (ctypes.c_float * max(1, posts))(*map(float, post_betas))]
    error = ctypes.create_string_buffer(512)

    def call(out: Any, size: int) -> int:
        return int(fn(_PACK_KERNELS.index(kernel), _PACK_DTYPES.index(w.dtype.name), rank,
                      *lists, groups, posts, *post, w.ctypes.data, out, size, error,
                      len(error)))
    need = call(None, 0)
    if need < 0:
        return None, error.value.decode(errors="replace")
    out = np.empty(need, np.uint8)
    if call(out.ctypes.data, need) != need:
        return None, error.value.decode(errors="replace")
    return out, ""


def see_pool_threads(threads: int) -> None:
    """The size of XLA's pool the next :func:`pack_filter` assumes, until a call sees the
    pool's own (for the tests: a filter packed for other threads than its calls run on)."""
    if status().available:
        fn = _HANDLES[-1].jaxconv_onednn_see_pool_threads
        fn.argtypes = [ctypes.c_int64]
        fn(threads)


def fma_peak_gflops(threads: int, seconds: float = 0.5) -> tuple[float, int] | None:
    """This machine's float32 peak, measured by the handler: ``threads`` threads each running
    independent vector FMAs on registers for ``seconds`` (AVX-512 where the CPU has it, else
    AVX2): GFLOP/s over all of them, and the vector's float32 lanes; None when not loaded or
    without AVX2 and FMA. It is cores x FMA units x lanes x 2 x the clock the cores really run
    at, which a virtual machine's ``/proc/cpuinfo`` does not tell."""
    if not status().available:
        return None
    fn = _HANDLES[-1].jaxconv_fma_peak_gflops
    fn.restype = ctypes.c_double
    lanes = ctypes.c_int(0)
    gflops = float(fn(ctypes.c_int(threads), ctypes.c_double(seconds), ctypes.byref(lanes)))
    return (gflops, lanes.value) if gflops > 0 else None


def winograd_isa() -> str | None:
    """The vector instructions the Winograd passes run (``"avx512"``, ``"avx2"``, ``"plain"``:
    the widest this CPU has, or a narrower one named by ``JAXCONV_WINOGRAD_ISA``), or None
    where the handler is not loaded."""
    if not status().available:
        return None
    return ("avx512", "avx2", "plain")[_HANDLES[-1].jaxconv_winograd_isa()]


def set_winograd_chunk_bytes(nbytes: int) -> None:
    """The size of the chunks of tiles the Winograd passes transform at a time where they run
    in stages (0: the default, ``kWinogradChunkBytes``); the tests make it small. The values
    are the same, up to the weight gradient's order of summation."""
    if status().available:
        _HANDLES[-1].jaxconv_winograd_set_chunk_bytes(ctypes.c_int64(nbytes))
