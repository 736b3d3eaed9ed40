"""Whether this process's allocator keeps the memory XLA:CPU frees, and a way to make it.

XLA:CPU allocates the temporaries of each execution of a compiled program as one block and
frees it at the end. With glibc's default settings a block above 32 MiB (a training step's,
usually) comes from a fresh ``mmap`` every call, so every page of it is faulted in and zeroed
again (docs/performance.md, "Host memory"). glibc reads
its settings from the environment at start-up (:data:`RECOMMENDED`); :func:`keep_freed_memory`
sets them from inside Python, before JAX's CPU client exists. :func:`line` says which case the
process is in, for ``jaxconv check``.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

#: the settings that keep freed memory in the process (glibc's names, environment and tunables)
_ENV = {"MALLOC_ARENA_MAX": "arena_max", "MALLOC_MMAP_MAX_": "mmap_max",
        "MALLOC_TRIM_THRESHOLD_": "trim_threshold"}

RECOMMENDED = ("MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4000000000 "
               "MALLOC_TOP_PAD_=268435456")


#: whether :func:`keep_freed_memory` took effect in this process
_KEPT_BY_CALL = False
#: how :func:`keep_by_default` found the process: None (not called yet, or nothing to do),
#: "early" (before JAX's backends existed: :func:`keep_freed_memory` applied), "late" (after:
#: glibc's settings applied, the CPU client's worker threads keep their own heaps)
_DEFAULT: str | None = None

#: the one way to opt out of :func:`keep_by_default` (set it to 0 before the first jaxconv call)
OPT_OUT = "JAXCONV_KEEP_FREED_MEMORY"

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4


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
    settings), no ``mmap`` for large blocks, and a trim threshold of at least 256 MiB."""
    s = _settings(os.environ if env is None else env)
    trim = _int(s.get("trim_threshold"))
    return (_int(s.get("arena_max")) == 1 and _int(s.get("mmap_max")) == 0
            and trim is not None and trim >= 1 << 28)


def keep_freed_memory() -> bool:
    """Makes this process keep the memory XLA:CPU frees, so that the next execution reuses it.

    For CPU training: a step's temporaries above 32 MiB are otherwise fresh pages every call,
    each faulted in and zeroed (docs/performance.md, "Host memory"). Call it first,
    before JAX computes anything on the CPU. It turns off JAX's asynchronous dispatch on the CPU
    (``jax_cpu_enable_async_dispatch``: each computation then runs on the thread that calls
    it, and from Python's main thread its temporaries come from glibc's main heap, which the
    settings below govern; a worker thread's heap maps large blocks afresh whatever they say;
    computations across several devices are dispatched as before), and sets glibc's
    ``M_MMAP_MAX`` to 0 (large blocks come from the heap), ``M_TRIM_THRESHOLD`` to 2 GiB and
    ``M_TOP_PAD`` to 256 MiB (freed memory stays in the process). The process's resident
    memory then stays at its peak. Starting Python with :data:`RECOMMENDED` in the environment
    does the same and keeps asynchronous dispatch.

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
    import jax

    libc = ctypes.CDLL(None)
    done = [libc.mallopt(_M_MMAP_MAX, 0), libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1),
            libc.mallopt(_M_TOP_PAD, 1 << 28)]
    if not all(done):  # mallopt returns 1 on success
        return False
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # type: ignore[no-untyped-call]
    _KEPT_BY_CALL = True
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


def keep_by_default(env: Mapping[str, str] | None = None) -> str | None:
    """Keeps freed memory where jaxconv's CPU kernels are about to run, unless opted out.

    Called by :func:`jaxconv.accelerate` (when JAX runs on the CPU) and by the lowering of
    jaxconv's kernels for the CPU; once per process. Before JAX's backends exist it is
    :func:`keep_freed_memory`; after, it applies glibc's settings (freed memory of this
    thread's heap stays), and the executions XLA:CPU dispatches to its worker threads keep
    allocating their temporaries afresh: ``jaxconv explain`` then says so
    (docs/training.md, "Host memory"). Nothing happens where glibc is not the allocator,
    where the process already keeps freed memory, or where :data:`OPT_OUT` is ``0``.

    Returns:
      "early" or "late" (as above) where it acted, else None.
    """
    global _DEFAULT
    from jax._src import xla_bridge

    env = os.environ if env is None else env
    if _DEFAULT is not None or _KEPT_BY_CALL or not _glibc() or _opted_out(env):
        return None
    if keeps_freed_memory(env):
        return None
    if not xla_bridge.backends_are_initialized():
        if not _cpu_is_default() or not keep_freed_memory():
            return None
        _DEFAULT = "early"
        return _DEFAULT
    libc = ctypes.CDLL(None)
    if not all([libc.mallopt(_M_MMAP_MAX, 0), libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1),
                libc.mallopt(_M_TOP_PAD, 1 << 28)]):
        return None
    _DEFAULT = "late"
    return _DEFAULT


def mode() -> str:
    """This process's host-memory mode, for ``explain``: "kept" (every execution's temporaries
    are reused), "late" (kept on this thread; XLA:CPU's worker threads allocate afresh),
    "default" (glibc's defaults) or "n/a" (not glibc)."""
    if not _glibc():
        return "n/a"
    if _KEPT_BY_CALL or keeps_freed_memory():
        return "kept"
    return "late" if _DEFAULT == "late" else "default"


def line(backend: str, env: Mapping[str, str] | None = None) -> str | None:
    """One line for ``jaxconv check`` on CPU under glibc; None elsewhere (nothing to say)."""
    if backend != "cpu" or not _glibc():
        return None
    if _DEFAULT == "early" and env is None:
        return (f"host memory: kept by jaxconv's default (XLA:CPU's temporaries are reused; opt "
                f"out with {OPT_OUT}=0)")
    if _KEPT_BY_CALL and env is None:
        return "host memory: kept by jaxconv.keep_freed_memory() (XLA:CPU's temporaries are reused)"
    if _DEFAULT == "late" and env is None:
        return ("host memory: kept on the main thread only: jaxconv's first CPU kernel came after "
                "JAX's first computation, and XLA:CPU's worker threads allocate their temporaries "
                "afresh; apply jaxconv.accelerate (or call jaxconv.keep_freed_memory()) before "
                "the first computation (docs/training.md, \"Host memory\")")
    if keeps_freed_memory(env):
        return "host memory: glibc keeps freed memory (XLA:CPU's temporaries are reused)"
    hugetlb = _settings(os.environ if env is None else env).get("hugetlb")
    extra = " (glibc.malloc.hugetlb set: fewer faults, still zeroed)" if hugetlb in ("1", "2") else ""
    return ("host memory: glibc's defaults" + extra + ": XLA:CPU's temporaries above 32 MiB are "
            "fresh pages every call; for CPU training apply jaxconv.accelerate before the first "
            "computation (it keeps them), call jaxconv.keep_freed_memory() first, or start "
            "Python with " + RECOMMENDED + " (docs/training.md, \"Host memory\")")
