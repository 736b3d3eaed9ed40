"""The registry's face: the methods (``methods.py``), the dispatch every kernel call goes
through (:func:`run`: the chooser's plan, executed), and the ops' ``lowering=`` paragraphs.

:data:`METHODS` holds one :class:`~jaxconv._src.lowering.method.Method` per name the ops'
``lowering=`` accepts. Everything else reads it: the values each op accepts and the
messages for the others (``options.check_lowering``), the ``lowering=`` paragraph of each
op's docstring (:func:`document_lowering`), the primitive's lowering (:func:`run`), and the
tests (the lowering matrix, and a check that the public ``Literal`` types list the same
names). Adding a lowering: one module with its record, one entry in ``methods.py``, one rule
per backend table in ``tables.py`` (docs/lowerings.md).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any, TypeVar

import jax.numpy as jnp

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import chooser
from jaxconv._src.lowering.execute import execute
from jaxconv._src.lowering.methods import LOWERING_TYPES, METHODS, methods, why_not

__all__ = ["LOWERING_TYPES", "METHODS", "choose", "data_grad", "document_lowering", "forward",
           "methods", "run", "weight_grad", "why_not"]


def choose(kernel: Kernel, p: ConvProblem, backend: str, *, partitioned: bool = False) -> str:
    """The method ``lowering="auto"`` picks for ``kernel`` on ``p`` on ``backend``'s table (a
    partitioned or exported program: never a custom call; ``chooser.plan`` decides the
    rest)."""
    return chooser.choose(kernel, p, backend, onednn_ok=False if partitioned else None)


def run(kernel: Kernel, a: Array, b: Array, p: ConvProblem, *, method: str, backend: str | None,
        precision: Precision = None, preferred_element_type: DType = None,
        partitioned: bool = False, portable: bool = False) -> Array:
    """``kernel`` on (a, b) by ``method`` (``"auto"``: the table of ``backend``): the chooser's
    plan (``chooser.py``), executed.

    ``partitioned``: in a program XLA's SPMD partitioner splits across devices, where a custom
    call runs per device's blocks if its method can (``Method.per_shard``, ``spmd.py``), else the
    backend's XLA formulation; ``portable``: no custom call at all (an export). The backend is
    chosen once, by the primitive's lowering for the platform the program is lowered for
    (``primitive.py``), and passed down.

    A zero-size problem (an empty result, or every entry a sum over an empty set: zero
    channels, batch, input or output extent) is zeros, whatever the method: no method is
    written for zero-size operands, and none needs to be.
    """
    if backend is not None:
        chooser.keep_freed_memory(backend)  # jaxconv's CPU kernel will run
    out_shape = kernel.out_shape(p)
    if 0 in a.shape or 0 in b.shape or 0 in out_shape:
        dtype = preferred_element_type if preferred_element_type is not None else a.dtype
        return jnp.zeros(out_shape, dtype)
    same = a.dtype if a.dtype == b.dtype else None  # mixed operands: no library takes them
    return execute(chooser.plan(kernel, p, method=method, backend=backend, dtype=same,
                               precision=precision, preferred_element_type=preferred_element_type,
                               partitioned=partitioned, portable=portable), a, b, p)


def forward(x: Array, w: Array, p: ConvProblem, *, method: str, backend: str | None = None,
            precision: Precision = None, preferred_element_type: DType = None) -> Array:
    """y from x and W (:func:`run` of ``Kernel.FORWARD``)."""
    return run(Kernel.FORWARD, x, w, p, method=method, backend=backend, precision=precision,
               preferred_element_type=preferred_element_type)


def data_grad(dy: Array, w: Array, p: ConvProblem, *, method: str, backend: str | None = None,
              precision: Precision = None, preferred_element_type: DType = None) -> Array:
    """dx from dy and W (:func:`run` of ``Kernel.DATA``)."""
    return run(Kernel.DATA, dy, w, p, method=method, backend=backend, precision=precision,
               preferred_element_type=preferred_element_type)


def weight_grad(x: Array, dy: Array, p: ConvProblem, *, method: str, backend: str | None = None,
                precision: Precision = None, preferred_element_type: DType = None) -> Array:
    """dW from x and dy (:func:`run` of ``Kernel.WEIGHT``)."""
    return run(Kernel.WEIGHT, x, dy, p, method=method, backend=backend, precision=precision,
               preferred_element_type=preferred_element_type)


# ---------------------------------------------------------------------------------- docs

#: where an op's docstring says ``lowering: {LOWERING}``, :func:`document_lowering` writes
#: the paragraph of its kernel's methods
PLACEHOLDER = "{LOWERING}"
_F = TypeVar("_F", bound=Callable[..., Any])


def lowering_paragraph(kernel: Kernel) -> str:
    """The text of the ``lowering=`` argument of an op that runs ``kernel`` (one line)."""
    names = [f'``"{m}"`` ({METHODS[m].summary})' for m in methods(kernel)]
    listed = ", ".join(names[:-1]) + " or " + names[-1]
    return (f'the {kernel.label} formulation: ``"auto"`` (default: chosen per problem and per '
            f'backend, see docs/lowerings.md), ``"direct"`` (the same without Winograd, whose '
            f"results are not bit-identical to a direct convolution's: docs/precision.md), "
            f"{listed}. A static argument: it changes the compiled program.")


def document_lowering(kernel: Kernel) -> Callable[[_F], _F]:
    """Writes the ``lowering=`` paragraph of ``kernel`` into the docstring's placeholder."""
    def decorate(fn: _F) -> _F:
        doc = fn.__doc__ or ""
        lines = doc.splitlines()
        for i, line in enumerate(lines):
            if line.rstrip().endswith(PLACEHOLDER):
                head = line.rstrip()[: -len(PLACEHOLDER)]
                indent = " " * (len(head) - len(head.lstrip()) + 2)
                text = textwrap.fill(head + lowering_paragraph(kernel), width=92,
                                     subsequent_indent=indent, break_on_hyphens=False,
                                     break_long_words=False)
                lines[i] = text
                fn.__doc__ = "\n".join(lines) + ("\n" if doc.endswith("\n") else "")
                return fn
        raise ValueError(f"document_lowering: {fn.__name__}'s docstring has no line ending "
                         f"in {PLACEHOLDER}")
    return decorate
