"""The registry of lowering methods, and the dispatch every kernel call goes through.

:data:`METHODS` holds one :class:`~jaxconv._src.lowering.method.Method` per name the ops'
``lowering=`` accepts. Everything else reads it: the values each op accepts and the
messages for the others (``options.check_lowering``), the ``lowering=`` paragraph of each
op's docstring (:func:`document_lowering`), the primitive's lowering (:func:`run`), and the
tests (the lowering matrix, and a check that the public ``Literal`` types list the same
names). Adding a lowering: one module with its record, one entry here, one rule per backend
table in ``backends.py`` (docs/lowerings.md).
"""

from __future__ import annotations

import textwrap
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import jax.numpy as jnp

from jaxconv._src import backends
from jaxconv._src import typing as public
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, CombinatorFn, DType, Kernel, Precision
from jaxconv._src.lowering import (
    convolution,
    grouped,
    measured,
    onednn,
    phases,
    shifted,
    spmd,
    taps,
)
from jaxconv._src.lowering.method import Method

#: every lowering method, by name
METHODS: dict[str, Method] = {m.name: m for m in (
    convolution.CONV,
    convolution.FEATURE_GROUP,
    convolution.GRID,
    phases.PHASES,
    shifted.SHIFTED,
    taps.DOT,
    convolution.VJP,
    onednn.ONEDNN,
    grouped.PER_GROUP,
    grouped.BLOCK_DIAGONAL,
)}

#: the public type of each kernel's ``lowering=`` argument (its values, in their documented order)
LOWERING_TYPES = {Kernel.FORWARD: public.ForwardLowering, Kernel.DATA: public.DataGradLowering,
                  Kernel.WEIGHT: public.WeightGradLowering}


def methods(kernel: Kernel) -> tuple[str, ...]:
    """The methods that implement ``kernel``, in the order of its public ``Literal`` type."""
    names = [m for m in METHODS if kernel in METHODS[m].kernels]
    order = [v for v in typing.get_args(LOWERING_TYPES[kernel]) if v in names]
    return (*order, *(m for m in names if m not in order))


def why_not(method: str, kernel: Kernel, p: ConvProblem) -> str | None:
    """Why ``method`` cannot compute ``kernel`` for ``p`` (a registered name), or None."""
    return METHODS[method].why_not(kernel, p)


def choose(kernel: Kernel, p: ConvProblem, backend: str, *, partitioned: bool = False) -> str:
    """The method ``lowering="auto"`` picks for ``kernel`` on ``p`` on ``backend``; in a program
    XLA's SPMD partitioner splits across devices (``partitioned``), never a custom call: the
    partitioner cannot see inside one and would gather its operands onto every device. (An
    export is lowered as ``partitioned`` too: its artifact may run where no handler is.)"""
    return backends.METHOD[kernel](p, backend, not partitioned)


def one_device_method(kernel: Kernel, p: ConvProblem, backend: str, dtype: Any,
                      precision: Precision = None, preferred_element_type: DType = None) -> str:
    """What ``lowering="auto"`` runs for ``kernel`` on one device of ``backend``: the table's
    method (:func:`choose`), on the CPU checked against XLA's own program by timing on this
    machine where the problem is small (``measured.py``)."""
    method = choose(kernel, p, backend)
    if backend != "cpu":
        return method
    return measured.pick(kernel, p, method, dtype, precision, preferred_element_type, run=run,
                         xla_applies=why_not(measured.XLA_OWN[kernel], kernel, p) is None)


def run(kernel: Kernel, a: Array, b: Array, p: ConvProblem, *, method: str, backend: str | None,
        precision: Precision = None, preferred_element_type: DType = None,
        partitioned: bool = False, portable: bool = False) -> Array:
    """``kernel`` on (a, b) by ``method`` (``"auto"``: the table of ``backend``).

    ``partitioned``: in a program XLA's SPMD partitioner splits across devices, where a custom
    call runs per device's blocks if its method can (``Method.per_shard``, ``spmd.py``), else the
    backend's XLA formulation; ``portable``: no custom call at all (an export).

    The backend is chosen once, by the primitive's lowering for the platform the program
    is lowered for (``autodiff.py``), and passed down: a combinator's sub-problems get the
    leaf formulation the same backend's table picks for them.

    A zero-size problem (an empty result, or every entry a sum over an empty set: zero
    channels, batch, input or output extent) is zeros, whatever the method: no method is
    written for zero-size operands, and none needs to be.
    """
    out_shape = kernel.out_shape(p)
    if 0 in a.shape or 0 in b.shape or 0 in out_shape:
        dtype = preferred_element_type if preferred_element_type is not None else a.dtype
        return jnp.zeros(out_shape, dtype)
    if method == "auto":
        if backend is None:
            raise ValueError("lowering: method 'auto' needs a backend to choose for")
        if not (partitioned or portable):
            method = one_device_method(kernel, p, backend, a.dtype, precision,
                                       preferred_element_type)
        else:
            method = choose(kernel, p, backend, partitioned=True)
        if partitioned and not portable:  # the one-device choice, if it runs per batch shard
            one_device = choose(kernel, p, backend)
            method = one_device if METHODS[one_device].per_shard else method
            if (kernel is Kernel.WEIGHT and backend == "cpu" and any(s > 1 for s in p.strides)
                    and not METHODS[method].per_shard and why_not("onednn", kernel, p) is None):
                # oneDNN per device's blocks by jaxconv's rule even where it would not pay: on
                # 8 CPU devices XLA's partitioner (jaxlib 0.10.2) computed a strided weight
                # gradient with rows split wrong (a 3x3 kernel, stride 2 or 3, pads 1: 0.2-1.0
                # off; jax.vjp's too; docs/distributed.md)
                method = "onednn"
        why = why_not(method, kernel, p)
        if why is not None:  # a table bug (tests/test_lowering_registry.py), never a user's
            raise RuntimeError(f"jaxconv: the {backend} table picked {why}")
    if method not in METHODS or kernel not in METHODS[method].kernels:
        raise ValueError(f"lowering: method must be 'auto' or one of {list(methods(kernel))}, "
                         f"got {method!r}")
    record = METHODS[method]
    if backend is not None and record.platforms is not None and (
            backend not in record.platforms or portable
            or (partitioned and not record.per_shard)):
        # a custom call of other platforms (lowering="onednn" lowered for a GPU), in an export,
        # or in a program partitioned across devices that it cannot run per shard in: this
        # backend's own XLA formulation
        return run(kernel, a, b, p, method=choose(kernel, p, backend, partitioned=True),
                   backend=backend, precision=precision,
                   preferred_element_type=preferred_element_type, partitioned=partitioned,
                   portable=portable)
    fn = record.kernels[kernel]
    if not record.combinator:
        def compute(sa: Array, sb: Array, sub: ConvProblem, threads: int = 0) -> Array:
            # a per-shard method takes the threads its call may use (spmd.py); a fenced one,
            # whether this backend's program fences its products (common.product)
            extra: dict[str, Any] = {"threads": threads} if record.per_shard else {}
            if record.fenced_on:
                extra["fence"] = backend in record.fenced_on
            out = typing.cast(Any, fn)(sa, sb, sub, precision, preferred_element_type, **extra)
            if out is None and record.declines:  # operands it does not take: the default leaf
                return run(kernel, sa, sb, sub, method=default_leaf(kernel), backend=None,
                           precision=precision, preferred_element_type=preferred_element_type)
            return typing.cast(Array, out)
        if partitioned and record.per_shard:  # on each device's slice of the batch
            return spmd.call(kernel, a, b, p, compute)
        return compute(a, b, p)

    def leaf(sub_kernel: Kernel, sa: Array, sb: Array, sub: ConvProblem) -> Array:
        # the backend's table for the one-group sub-problem (a combinator does not apply to it:
        # the check above); with no backend (a direct call, a forced combinator) one convolution
        sub_method = "auto" if backend is not None else default_leaf(sub_kernel)
        return run(sub_kernel, sa, sb, sub, method=sub_method, backend=backend,
                   precision=precision, preferred_element_type=preferred_element_type,
                   partitioned=partitioned, portable=portable)

    return typing.cast(CombinatorFn, fn)(a, b, p, leaf=leaf)


def default_leaf(kernel: Kernel) -> str:
    """The leaf of a forced combinator where no backend's table is known: one convolution."""
    return "grid" if kernel is Kernel.DATA else "conv"


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
            f"backend, see docs/performance.md), {listed}. A static argument: it changes the "
            f"compiled program.")


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
