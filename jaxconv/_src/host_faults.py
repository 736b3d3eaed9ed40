"""Minor page faults per step, and why: what ``jaxconv check`` and ``explain(measure=True)`` say
of host memory beyond its mode (:mod:`jaxconv._src.host_memory`).

A step that reuses freed memory faults (almost) nothing after its first call; one whose
temporaries are fresh pages faults each of them in and the kernel zeroes it (a 64 MiB block:
16,384 faults, docs/training.md "Host memory"). The count is ``getrusage``'s minor faults of
the whole process around a call (every thread's), after a few calls that are not counted
(the heap settles: a call's block may be taken before the last one's is freed). The reason
comes from the mode and from the size of glibc's heap (``mallinfo2``) sampled before and
after each call: a heap that shrank was trimmed, one that grew did not find the memory it
needed free; neither, and the pages were returned and taken again within the call.
"""

from __future__ import annotations

import ctypes
import dataclasses
import resource
import statistics
from collections.abc import Callable
from typing import Any

from jaxconv._src import host_memory

#: from this much fresh memory a step (bytes of faulted pages), the faults are "high"
HIGH_BYTES = 4 << 20

_PAGE = resource.getpagesize()


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2() -> Any:
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    fn.restype = _Mallinfo2
    return fn


#: glibc's ``mallinfo2``, looked up once (a lookup allocates: the samples must not)
_MALLINFO2 = _mallinfo2()


def _heap() -> int | None:
    """The bytes of glibc's heaps now (``sbrk``-ed, all arenas); None without ``mallinfo2``
    (glibc before 2.33, or another allocator)."""
    return None if _MALLINFO2 is None else int(_MALLINFO2().arena)


def minor_faults() -> int:
    """The process's minor page faults so far (every thread's; ``getrusage``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@dataclasses.dataclass(frozen=True)
class StepFaults:
    """A step's minor page faults per call after its first, and what glibc's heap did."""

    per_step: float  #: the median over the measured calls
    mode: str  #: :func:`host_memory.mode` ("kept", "late", "default", "n/a")
    heap_grew: int = 0  #: bytes the heap grew over the measured calls (net)
    heap_shrank: bool = False  #: the heap was smaller at a sample than before it (trimmed)

    @property
    def high(self) -> bool:
        """At least :data:`HIGH_BYTES` of fresh pages a step."""
        return self.per_step * _PAGE >= HIGH_BYTES

    def why(self) -> str:
        """The reason for the faults, from the mode and the heap's samples."""
        if self.mode == "late":
            return host_memory.late_message()
        if self.mode == "default":  # the defaults' own line (an environment that keeps nothing)
            return str(host_memory.line("cpu", {})).removeprefix("host memory: ")
        if self.heap_shrank:
            return ("glibc's heap shrank between samples: it was trimmed (malloc_trim called, or "
                    "M_TRIM_THRESHOLD set again after jaxconv set it to never)")
        if self.heap_grew >= self.per_step * _PAGE / 2:
            return (f"glibc's heap grew {self.heap_grew / 2**20:.0f} MiB over the calls: the "
                    "step's blocks did not fit in the memory freed before it (it settles after "
                    "a few steps unless memory held across steps keeps splitting the free space)")
        return ("glibc's heap ended each call as large as it began: the pages were returned "
                "and taken again within the call, by a trim of the heap's top inside it "
                "(malloc_trim, or M_TRIM_THRESHOLD set again after jaxconv set it to never), "
                "by glibc's mmap of a large block (M_MMAP_MAX set again), or by a library that "
                "maps memory itself, outside glibc's heap")

    def line(self) -> str:
        """One line for ``jaxconv check`` and ``explain``: the count, and the reason where it
        is high."""
        head = (f"host memory: {self.per_step:,.0f} minor page faults a step "
                f"({self.per_step * _PAGE / 2**20:.1f} MiB of fresh pages)")
        if not self.high:
            return head + ": freed memory is reused"
        kept = " though freed memory is kept" if self.mode == "kept" else ""
        return f"{head}{kept}: {self.why()}"


def step_faults(call: Callable[[], Any], calls: int = 5, warm: int = 3) -> StepFaults:
    """Runs ``call`` (which waits for its result) ``warm`` times, then ``calls`` times counting
    each call's minor page faults and sampling glibc's heap around it.

    Args:
      call: one step, blocking (``lambda: jax.block_until_ready(step(*args))``).
      calls: the measured calls.
      warm: the calls before them, not counted (compilation, the heap settling).

    Returns:
      A :class:`StepFaults`; ``.line()`` says it in one line.
    """
    for _ in range(warm):
        call()
    faults, samples = [], []
    for _ in range(calls):
        before, heap = minor_faults(), _heap()
        call()
        faults.append(minor_faults() - before)
        samples += [heap, _heap()]
    heaps = [h for h in samples if h is not None]
    shrank = any(b < max(heaps[:i + 1]) for i, b in enumerate(heaps))
    return StepFaults(per_step=float(statistics.median(faults)), mode=host_memory.mode(),
                      heap_grew=max(heaps[-1] - heaps[0], 0) if heaps else 0,
                      heap_shrank=shrank)


def probe(calls: int = 5) -> StepFaults:
    """The faults of a small program with a 64 MiB temporary (``jaxconv check``): above
    glibc's default ``mmap`` threshold, so that only kept memory reuses it."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((4096, 4096), jnp.float32)  # sin(x) is a 64 MiB temporary of each call
    v = jnp.ones((4096, 1), jnp.float32)
    f = jax.jit(lambda x, v: jnp.sin(x) @ v)
    return step_faults(lambda: f(x, v).block_until_ready(), calls)
