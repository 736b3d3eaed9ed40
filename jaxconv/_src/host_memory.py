"""Whether this process's allocator keeps the memory XLA:CPU frees, and a way to make it.

XLA:CPU allocates the temporaries of each execution of a compiled program as one block and
frees it at the end. With glibc's default settings a block above 32 MiB (a training step's,
usually) comes from a fresh ``mmap`` every call, so every page of it is faulted in and zeroed
again (docs/performance.md, "Host memory"), and a thread other than the main one may allocate
from an arena of its own, which maps large blocks afresh whatever the other settings say.

``import jaxconv`` keeps freed memory (:func:`keep_at_import`): before JAX's CPU client
exists, it applies :func:`keep_freed_memory`: glibc keeps large freed blocks in the main heap
and never gives them back (a finite trim threshold is reached once enough is free at the
heap's top, with another library's buffers for instance, and the next step faults it all in
again), and JAX runs each CPU computation on the calling thread, whose heap that is. (glibc's
settings alone at the import, dispatch left asynchronous, left a 25 MiB block faulted in
afresh on most MobileNetV2 steps measured: docs/performance.md, "Host memory".) Where jaxconv
is imported after JAX's first computation, the first jaxconv CPU kernel or ``accelerate``
warns once (:class:`LateImportWarning`). :data:`RECOMMENDED` is the environment's form.
:func:`line` says which case the process is in, for ``jaxconv check`` and ``explain``;
:mod:`jaxconv._src.host_faults` counts a step's page faults and says why they are high.
"""

from __future__ import annotations

import ctypes
import os
import platform
import warnings
from collections.abc import Mapping

#: the settings that keep freed memory in the process (glibc's names, environment and tunables)
_ENV = {"MALLOC_ARENA_MAX": "arena_max", "MALLOC_MMAP_MAX_": "mmap_max",
        "MALLOC_TRIM_THRESHOLD_": "trim_threshold"}

#: glibc's trim threshold that means "never trim" (``SIZE_MAX``: what ``mallopt`` stores for -1)
NEVER_TRIM = (1 << 64) - 1

RECOMMENDED = ("MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 "
               f"MALLOC_TRIM_THRESHOLD_={NEVER_TRIM} MALLOC_TOP_PAD_=268435456")

#: a trim threshold from this size on is never reached (x86-64's and AArch64's user address
#: space is at most 2**47 bytes; the heap's free top cannot be larger)
_UNREACHABLE = 1 << 47


#: whether :func:`keep_freed_memory` took effect in this process
_KEPT_BY_CALL = False
#: how jaxconv's default found the process: None (nothing done: not glibc, opted out, kept by
#: the environment, or JAX not on the CPU), "import" (:func:`keep_at_import` applied, before
#: JAX's backends existed), "early" (applied by :func:`keep_by_default` before they existed),
#: "late" (after: glibc's settings applied, XLA:CPU's worker threads keep their own arenas)
_DEFAULT: str | None = None
#: whether :func:`keep_at_import` found JAX's backends already created (imported late)
_IMPORTED_LATE = False
#: whether the late-import warning was given (once per process)
_WARNED = False

#: the one way to opt out of jaxconv's default (set it to 0 before importing jaxconv)
OPT_OUT = "JAXCONV_KEEP_FREED_MEMORY"

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8

#: what importing jaxconv after JAX's first computation costs, measured
#: (docs/performance.md, "Host memory": the usual script per import order)
LATE_COST = ("each step's temporaries are fresh pages, faulted in and zeroed: MobileNetV2's "
             "training step, batch 8, up to 1.6x slower on a 2-core AMD EPYC")


class LateImportWarning(RuntimeWarning):
    """jaxconv was imported after JAX's first computation: XLA:CPU's worker threads allocate
    each execution's temporaries afresh (docs/training.md, "Host memory")."""


def _glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _settings(env: Mapping[str, str]) -> dict[str, str]:
    """glibc's malloc settings from ``env``: the ``MALLOC_*`` variables and ``GLIBC_TUNABLES``
    (the same settings by their tunable names; a tunable given both ways counts as the
    tunable says)."""
    out = {name: env[var] for var, name in _ENV.items() if var in env}
    for item in env.get("GLIBC_TUNABLES", "").split(":"):
        key, _, value = item.partition("=")
        if key.startswith("glibc.malloc."):
            out[key.removeprefix("glibc.malloc.")] = value
    return out


def _int(value: str | None) -> int | None:
    try:
        return int(value, 0) if value is not None else None
    except ValueError:
        return None


def keeps_freed_memory(env: Mapping[str, str] | None = None) -> bool:
    """Whether glibc, as ``env`` configures it, keeps a large freed block for the next call:
    one arena (a worker thread's own arena maps large blocks afresh whatever the other
    settings), no ``mmap`` for large blocks, and no trim (a finite threshold is reached once
    enough is freed at the heap's top, a step's temporaries with another library's buffers:
    glibc then returns it, and the next step faults it all back in)."""
    s = _settings(os.environ if env is None else env)
    trim = _int(s.get("trim_threshold"))
    return (_int(s.get("arena_max")) == 1 and _int(s.get("mmap_max")) == 0
            and trim is not None and trim >= _UNREACHABLE)


def _mallopt_keep() -> bool:
    """glibc keeps freed memory: one arena (threads created from now on allocate from the main
    heap), large blocks from the heap (no ``mmap``), never a trim (-1: glibc stores
    ``SIZE_MAX``; the largest positive threshold, 2 GiB, was reached by a MobileNetV2 step
    beside a torch step in one process: 563,000 faults a step), 256 MiB of headroom at the
    top. True where every setting took (``mallopt`` returns 1 on success)."""
    libc = ctypes.CDLL(None)
    settings = [(_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1),
                (_M_TOP_PAD, 1 << 28)]
    return all([libc.mallopt(param, value) for param, value in settings])


def keep_freed_memory() -> bool:
    """Makes this process keep the memory XLA:CPU frees, so that the next execution reuses it.

    ``import jaxconv`` already does so on the CPU (:func:`keep_at_import`, docs/training.md,
    "Host memory"); this is the explicit form, which also works with
    ``JAXCONV_KEEP_FREED_MEMORY=0`` set. Call it before JAX computes anything. It turns off
    JAX's asynchronous dispatch on the CPU (``jax_cpu_enable_async_dispatch``: each
    computation then runs on the thread that calls it, and from Python's main thread its
    temporaries come from glibc's main heap; computations across several devices are
    dispatched as before), and sets glibc's ``M_ARENA_MAX`` to 1, ``M_MMAP_MAX`` to 0 (large
    blocks come from the heap), ``M_TRIM_THRESHOLD`` to never and ``M_TOP_PAD`` to 256 MiB
    (freed memory stays in the process, however much is freed). The process's resident
    memory then stays at its peak for the rest of its life. Starting Python with :data:`RECOMMENDED` in the environment does the same and keeps
    asynchronous dispatch.

    Returns:
      True where the settings were applied (Linux with glibc), False elsewhere (nothing done).

    Raises:
      RuntimeError: JAX's backends already exist (their dispatch mode is fixed when they are
        created); call it before the first computation.

    Example:
      >>> import jaxconv
      >>> jaxconv.keep_freed_memory()  # doctest: +SKIP
      True
    """
    global _KEPT_BY_CALL
    from jax._src import xla_bridge

    if not _glibc():
        return False
    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "keep_freed_memory: JAX's backends already exist (asynchronous dispatch is fixed "
            "when the CPU client is created); call it before the first computation, or start "
            "Python with " + RECOMMENDED)
    if not _keep():
        return False
    _KEPT_BY_CALL = True
    return True


def _keep() -> bool:
    """glibc's settings (:func:`_mallopt_keep`) and synchronous CPU dispatch; before JAX's
    backends exist. True where the settings took."""
    import jax

    if not _mallopt_keep():
        return False
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # type: ignore[no-untyped-call]
    return True


def _opted_out(env: Mapping[str, str]) -> bool:
    return env.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off")


def _cpu_is_default() -> bool:
    """Whether JAX will run on the CPU, told without creating a backend: ``JAX_PLATFORMS``
    names the CPU first, or no accelerator plugin is installed."""
    import importlib.util

    import jax

    platforms = jax.config.jax_platforms  # type: ignore[attr-defined]
    if platforms:
        return str(platforms).split(",")[0].strip() == "cpu"
    plugins = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin",
               "libtpu")
    return not any(importlib.util.find_spec(name) is not None for name in plugins)


def _nothing_to_do(env: Mapping[str, str]) -> bool:
    return (_DEFAULT is not None or _KEPT_BY_CALL or not _glibc() or _opted_out(env)
            or keeps_freed_memory(env))


def keep_at_import(env: Mapping[str, str] | None = None) -> str | None:
    """jaxconv's default, applied by ``import jaxconv``: :func:`keep_freed_memory` where JAX will
    run on the CPU and its backends do not exist yet. Where they already exist it only records
    that jaxconv came late (:func:`keep_by_default` warns at the first CPU kernel). Nothing
    happens where glibc is not the allocator, the environment already keeps freed memory, or
    :data:`OPT_OUT` is 0.

    Returns:
      "import" where it applied the settings, else None.
    """
    global _IMPORTED_LATE
    from jax._src import xla_bridge

    env = os.environ if env is None else env
    if _nothing_to_do(env):
        return None
    if xla_bridge.backends_are_initialized():
        _IMPORTED_LATE = True
        return None
    return _keep_as_default("import")


def _keep_as_default(how: str) -> str | None:
    """:func:`_keep` where JAX will run on the CPU, recorded as jaxconv's default (``how``)."""
    global _DEFAULT
    if not _cpu_is_default() or not _keep():
        return None
    _DEFAULT = how
    return how


def keep_by_default(env: Mapping[str, str] | None = None) -> str | None:
    """jaxconv's default where its CPU kernels are about to run, unless opted out.

    Called by :func:`jaxconv.accelerate` (when JAX runs on the CPU) and by the lowering of
    jaxconv's kernels for the CPU. Where :func:`keep_at_import` applied it, nothing more.
    Before JAX's backends exist it applies :func:`keep_freed_memory` ("early"). After, it
    applies glibc's settings (freed memory of this thread's heap stays) and warns once
    (:class:`LateImportWarning`): XLA:CPU's worker threads keep allocating their temporaries
    afresh (docs/training.md, "Host memory").

    Returns:
      "early" or "late" (as above) where it acted, else None.
    """
    global _DEFAULT, _WARNED
    from jax._src import xla_bridge

    env = os.environ if env is None else env
    if _nothing_to_do(env):
        return None
    if not xla_bridge.backends_are_initialized():
        return _keep_as_default("early")
    if not _mallopt_keep():
        return None
    _DEFAULT = "late"
    if not _WARNED:
        _WARNED = True
        warnings.warn(late_message(), LateImportWarning, stacklevel=3)
    return _DEFAULT


def late_message() -> str:
    """What a late import costs and the one-line fix (the warning, ``check`` and ``explain``)."""
    return ("jaxconv was imported after JAX's first computation, so XLA:CPU's worker threads "
            f"allocate each execution's temporaries afresh ({LATE_COST}). Fix: import jaxconv "
            "before JAX computes anything (the top of the script, a notebook's first cell); or "
            f"start Python with {RECOMMENDED}; silence: {OPT_OUT}=0 (docs/training.md, "
            "\"Host memory\")")


def mode() -> str:
    """This process's host-memory mode, for ``explain``: "kept" (every execution's temporaries
    are reused), "late" (kept on this thread; XLA:CPU's worker threads allocate afresh),
    "default" (glibc's defaults) or "n/a" (not glibc)."""
    if not _glibc():
        return "n/a"
    if _KEPT_BY_CALL or _DEFAULT in ("import", "early") or keeps_freed_memory():
        return "kept"
    return "late" if _DEFAULT == "late" or _IMPORTED_LATE else "default"


def line(backend: str, env: Mapping[str, str] | None = None) -> str | None:
    """One line for ``jaxconv check`` and ``explain`` on CPU under glibc; None elsewhere."""
    if backend != "cpu" or not _glibc():
        return None
    if env is None:
        if _KEPT_BY_CALL:
            return ("host memory: kept by jaxconv.keep_freed_memory() (XLA:CPU's temporaries "
                    "are reused; synchronous dispatch)")
        if _DEFAULT in ("import", "early"):
            return (f"host memory: kept since jaxconv was imported (XLA:CPU's temporaries are "
                    f"reused; synchronous dispatch; opt out with {OPT_OUT}=0)")
        if _DEFAULT == "late" or (_IMPORTED_LATE and not _opted_out(os.environ)):
            return "host memory: " + late_message()
    if keeps_freed_memory(env):
        return "host memory: glibc keeps freed memory (XLA:CPU's temporaries are reused)"
    hugetlb = _settings(os.environ if env is None else env).get("hugetlb")
    extra = " (glibc.malloc.hugetlb set: fewer faults, still zeroed)" if hugetlb in ("1", "2") else ""
    return ("host memory: glibc's defaults" + extra + ": XLA:CPU's temporaries above 32 MiB are "
            "fresh pages every call; for CPU training import jaxconv before JAX's first "
            f"computation without {OPT_OUT}=0 (it keeps them), or start Python with "
            + RECOMMENDED + " (docs/training.md, \"Host memory\")")
