"""The narrowing rewrite: a float32 value rounded to bfloat16 for jaxconv's kernels, by integer
operations (``rounding.py``).

A mixed-precision program casts its float32 parameters to bfloat16 at every call (flax's
``dtype=jnp.bfloat16`` with float32 ``param_dtype``) and the convolutions and products read the
bfloat16 copies. Under ``accelerate`` those readers are jaxconv's kernels (custom calls, into
which XLA fuses nothing), so each cast is a loop of its own, and XLA:CPU's ``convert`` to
bfloat16 is slow; the rounding by integer operations (``rounding.py``, with the figures) gives
XLA's values bit for bit in a third to a half of the time.

It takes a ``convert_element_type`` from float32 to bfloat16 whose readers are all
convolutions or matrix products (what jaxconv's kernels read); a cast an element-wise
consumer reads stays XLA's, fused into that consumer's loop. A convert of a value that is a
16-bit value widened (a fused chain's result that float32 readers read too:
``rewrites/fused.py``, ``Scope.narrow``) back to its dtype, whatever reads it, is that value.
Measured on XLA:CPU only; other backends run the same program (the same values), not timed.
A cast of a constant of the program (a served model's variable, closed over) is rounded once,
when the program is traced: its readers read a bfloat16 constant, which a fused chain's
convolution packs (docs/onednn.md, "Packed filters").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope, constant
from jaxconv._src.rounding import round_to_bfloat16

#: the equations that read a cast's result where the cast is rounded by integer operations
KERNEL_READERS = frozenset({"conv_general_dilated", "dot_general"})


class NarrowingConvert(Rewrite):
    """A float32 -> bfloat16 cast that only convolutions and products read, as
    :func:`round_to_bfloat16`; a convert back of a widened 16-bit value, as that value
    (module docstring)."""

    name = "narrowing convert"
    primitives = frozenset({"convert_element_type"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        (x,), (out,) = eqn.invars, eqn.outvars
        if (not isinstance(x, Literal) and x in scope.narrow
                and np.dtype(eqn.params["new_dtype"]) == scope.narrow[x].dtype):
            return Match(self, eqn, (x,), "widened", label="the 16-bit value it widens")
        if (isinstance(x, Literal) or np.dtype(x.aval.dtype) != np.float32
                or np.dtype(eqn.params["new_dtype"]) != np.dtype(jnp.bfloat16)
                or eqn.params.get("sharding") is not None):
            return "no narrowing"
        readers = scope.analysis.reading.get(out, [])
        if (not readers or out in scope.analysis.results
                or any(r.primitive.name not in KERNEL_READERS for r in readers)):
            return "no narrowing"
        once = " (a constant: once, when traced)" if constant(scope.env.get(x)) else ""
        return Match(self, eqn, (x,), label="rounded by integer operations" + once)

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        if match.detail == "widened":
            return [scope.narrow[match.reads[0]]]
        if constant(values[0]):  # a served model's variable: its kernels read a constant
            with jax.ensure_compile_time_eval():
                return [round_to_bfloat16(values[0])]
        return [round_to_bfloat16(values[0])]
