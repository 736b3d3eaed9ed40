"""``jaxconv.tune``: every timed choice of a program made now, and kept for later processes.

``lowering="auto"`` times some of its choices on the running machine (``lowering/measured.py``):
a small problem's method against XLA's own program when the program is lowered, Winograd's
tiles against oneDNN's direct kernel, and each oneDNN primitive's activation layouts at its
first call (the handler's layout trial). Each verdict goes to a disk cache per machine and
build, which later processes read instead of timing again. :func:`tune` makes all of them
for one call of a function, so that a training run starts with its program decided, and
returns what was decided; ``jaxconv tune`` does the same for a script, shows the cache and
clears it.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import jax

from jaxconv._src.lowering import measured


@dataclasses.dataclass
class Tuned:
    """What :func:`tune` decided: the process's timed method choices so far
    (``measured.Decision``), the oneDNN primitives' layout choices (``library.choices()``
    rows) and the cache file."""

    decisions: list[measured.Decision]
    layouts: list[dict[str, Any]]
    path: pathlib.Path

    def __str__(self) -> str:
        lines = [f"jaxconv.tune: {len(self.decisions)} timed method choices, "
                 f"{len(self.layouts)} oneDNN layout choices; cache {self.path}"]
        lines += [f"  {d.line()}" for d in self.decisions]
        sources: dict[str, int] = {}
        for c in self.layouts:
            sources[c["source"]] = sources.get(c["source"], 0) + 1
        if sources:
            lines.append("  layouts by source: " + ", ".join(f"{k} {v}" for k, v in
                                                             sorted(sources.items())))
        return "\n".join(lines)

    __repr__ = __str__


def tune(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Tuned:
    """Runs ``fn(*args, **kwargs)`` once so that every choice its program times is made now
    and stored for later processes on this machine (``lowering/measured.py``).

    The call compiles ``fn``'s program (each timed method choice is made as it is lowered)
    and runs it once on copies of the array arguments (a donating step leaves the caller's
    arrays intact), so that each oneDNN primitive's first call chooses its layouts; then the
    layout verdicts are stored. Later compilations of the same problems, in this process or
    another, take the stored verdicts without timing. ``JAXCONV_MEASURE=0`` times nothing:
    the rules' choices, and nothing stored.

    Args:
      fn: the function, jitted or not (a training step, ``model.apply``).
      *args: its arguments (arrays: their values are copied, not used).
      **kwargs: its keyword arguments.

    Returns:
      A :class:`Tuned`: the timed method choices with their times, the handler's layout
      choices and the cache file; printed, a summary.

    Raises:
      TypeError: ``fn`` is not callable.

    Example:
      >>> import jax, jax.numpy as jnp, jaxconv
      >>> f = jax.jit(lambda x, w: jaxconv.convolution(x, w, pads_begin=1, pads_end=1))
      >>> tuned = jaxconv.tune(f, jnp.ones((1, 8, 8, 3)), jnp.ones((3, 3, 3, 4)))
      >>> isinstance(tuned.decisions, list)
      True
    """
    if not callable(fn):
        raise TypeError(f"tune: fn must be callable, got {type(fn).__name__}")
    from jaxconv._src.native import library

    def copy(a: Any) -> Any:
        return a.copy() if isinstance(a, jax.Array) else a

    jax.block_until_ready(fn(*jax.tree_util.tree_map(copy, args),  # type: ignore[no-untyped-call]
                             **jax.tree_util.tree_map(copy, kwargs)))
    measured.save_layouts()
    return Tuned(measured.decisions(), library.choices(), measured.cache_path())
