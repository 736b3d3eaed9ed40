"""Whether this process's allocator keeps the memory XLA:CPU frees: a line for ``jaxconv check``.

XLA:CPU allocates the temporaries of each execution of a compiled program as one block and
frees it at the end. With glibc's default settings a block above 32 MiB (a training step's,
usually) comes from a fresh ``mmap`` every call, so every page of it is faulted in and zeroed
again: half of a small CPU training step (docs/performance.md, "Training steps"). glibc reads
its settings at start-up, from the environment; jaxconv does not change them (they are the
whole process's), it only says which case this process is in.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping

#: the settings that keep freed memory in the process (glibc's names, environment and tunables)
_ENV = {"MALLOC_ARENA_MAX": "arena_max", "MALLOC_MMAP_MAX_": "mmap_max",
        "MALLOC_TRIM_THRESHOLD_": "trim_threshold"}

RECOMMENDED = ("MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4000000000 "
               "MALLOC_TOP_PAD_=268435456")


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


def line(backend: str, env: Mapping[str, str] | None = None) -> str | None:
    """One line for ``jaxconv check`` on CPU under glibc; None elsewhere (nothing to say)."""
    if backend != "cpu" or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    if keeps_freed_memory(env):
        return "host memory: glibc keeps freed memory (XLA:CPU's temporaries are reused)"
    hugetlb = _settings(os.environ if env is None else env).get("hugetlb")
    extra = " (glibc.malloc.hugetlb set: fewer faults, still zeroed)" if hugetlb in ("1", "2") else ""
    return ("host memory: glibc's defaults" + extra + ": XLA:CPU's temporaries above 32 MiB are "
            "fresh pages every call; for CPU training start Python with " + RECOMMENDED
            + " (docs/performance.md, \"Training steps\")")
