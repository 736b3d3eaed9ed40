"""The policy: one decision per kernel call, made once and returned as a :class:`Plan`.

For a kernel, a problem, the backend its program is lowered for and the call's dtypes,
:func:`plan` decides

* the method: ``"auto"`` by the backend's table (``backends.py``), on one CPU device checked
  against XLA's own program by timing where the problem is small (``measured.py``); a forced
  method checked, and replaced by the backend's XLA formulation where the program cannot hold
  it (a custom call lowered for another platform, in an export, or in a partitioned program
  that it cannot run per shard in), or by the default leaf where oneDNN does not take the
  operands;
* whether it runs per device's blocks (``spmd.py``: a program XLA's partitioner splits across
  devices; each device's thread count is set there, from how many devices share the cores);
* whether its matrix products are fenced (``common.product``).

Whether oneDNN computes a call is asked of one function, ``onednn.applies``. ``execute.py``
runs the plan; a combinator's sub-problems get plans of their own (``Plan.sub_plan``: a leaf
method each, a table never picking a combinator for one group).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax
from jaxlib import version as jaxlib_version

from jaxconv._src import backends
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import DType, Kernel, Precision
from jaxconv._src.lowering import measured, onednn, winograd
from jaxconv._src.lowering.execute import Plan, execute
from jaxconv._src.lowering.methods import METHODS, default_leaf, methods

#: The jaxlib versions on which XLA's SPMD partitioner was seen to miscompute a strided weight
#: gradient split across 8 CPU devices (a 3x3 kernel, stride 2 or 3, pads 1: 0.2-1.0 off, as
#: jax.vjp's own; docs/distributed.md), and from which the workaround below applies: such a
#: problem runs as oneDNN's call per device's blocks even where oneDNN would not pay. A jaxlib
#: verified fixed (tests/distributed/sharded_ops.py without the workaround) goes in
#: PARTITIONER_FIXED_IN.
PARTITIONER_BUG_SEEN_ON = ("0.10.2",)
PARTITIONER_FIXED_IN: tuple[str, ...] = ()


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(part) for part in v.split(".")[:3] if part.isdigit())


def partitioner_workaround(jaxlib: str = jaxlib_version.__version__) -> bool:
    """Whether ``jaxlib`` takes the strided weight gradients of partitioned CPU programs away
    from XLA's partitioner: from the earliest jaxlib the bug was seen on, until one is verified
    fixed."""
    first = min(_version(v) for v in PARTITIONER_BUG_SEEN_ON)
    return _version(jaxlib) >= first and jaxlib not in PARTITIONER_FIXED_IN


#: the Winograd methods (``lowering/winograd.py``)
WINOGRAD_METHODS = ("winograd", "winograd_2x2", "winograd_3x3", "winograd_4x4")


def _highest(precision: Precision) -> bool:
    """Whether ``precision`` asks for full float32 arithmetic (HIGHEST, for either operand)."""
    if precision is None:
        return False
    found = precision if isinstance(precision, tuple) else (precision,)
    return any(lax.Precision(q) == lax.Precision.HIGHEST for q in found if q is not None)


def choose(kernel: Kernel, p: ConvProblem, backend: str, *, onednn_ok: bool | None = None) -> str:
    """The backend table's method for ``kernel`` of ``p`` (``onednn_ok``: whether oneDNN may
    be picked; None: where it applies to the problem)."""
    return backends.METHOD[kernel](p, backend, onednn_ok)


def one_device_method(kernel: Kernel, p: ConvProblem, backend: str, dtype: Any,
                      precision: Precision = None, preferred_element_type: DType = None) -> str:
    """What ``lowering="auto"`` runs for ``kernel`` on one device of ``backend``: the table's
    method, on the CPU checked against XLA's own program by timing where the problem is small
    (Winograd against oneDNN's direct kernel: ``measured.py``)."""
    if backend != "cpu":
        return choose(kernel, p, backend, onednn_ok=False)
    method = cpu_table_method(kernel, p, dtype, precision, preferred_element_type)
    return measured.pick(kernel, p, method, dtype, precision, preferred_element_type,
                         run=_run_forced, xla_applies=xla_own_applies(kernel, p))


def chosen_by(kernel: Kernel, p: ConvProblem, backend: str, dtype: Any,
              precision: Precision = None, preferred_element_type: DType = None) -> str:
    """Where :func:`one_device_method`'s answer came from, for ``jaxconv.explain``: "rule"
    (the table, nothing timed), else "measured" (timed in this process) or "cache" (an earlier
    process's timing), with the fastest challenger's lead over the rule's method and the lead
    it needed (``measured.Decision``)."""
    if backend != "cpu":
        return "rule"
    method = cpu_table_method(kernel, p, dtype, precision, preferred_element_type)
    d = measured.decision(kernel, p, method, dtype, precision, preferred_element_type)
    if d is None:
        return "rule"
    return f"{d.source}: {d.lead:+.0%} vs {d.need:.0%} needed"


def cpu_table_method(kernel: Kernel, p: ConvProblem, dtype: Any, precision: Precision = None,
                     preferred_element_type: DType = None) -> str:
    """The CPU table's method for ``kernel`` of ``p`` on one device, before any timing (the
    method ``measured.timed`` reads the candidates of)."""
    ok = onednn.applies(kernel, p, dtype, preferred_element_type) is None
    method = choose(kernel, p, "cpu", onednn_ok=ok)
    if method == "winograd" and (not winograd.pays_for(dtype) or _highest(precision)):
        method = "onednn"  # the dtypes and precisions "auto" leaves to the direct kernel
    return method


def xla_own_applies(kernel: Kernel, p: ConvProblem) -> bool:
    """Whether XLA's own program for ``kernel`` (``measured.XLA_OWN``) computes ``p``."""
    return METHODS[measured.XLA_OWN[kernel]].why_not(kernel, p) is None


def _run_forced(kernel: Kernel, a: Any, b: Any, *, p: ConvProblem, method: str, backend: str,
                precision: Precision = None, preferred_element_type: DType = None) -> Any:
    """``kernel`` by a forced ``method``: what ``measured`` compiles and times."""
    return execute(plan(kernel, p, method=method, backend=backend, dtype=a.dtype,
                        precision=precision, preferred_element_type=preferred_element_type),
                   a, b, p)


def plan(kernel: Kernel, p: ConvProblem, *, method: str, backend: str | None, dtype: Any,
         precision: Precision = None, preferred_element_type: DType = None,
         partitioned: bool = False, portable: bool = False) -> Plan:
    """The plan of ``kernel`` on ``p`` by ``method`` (``"auto"``: the backend's table).

    ``partitioned``: in a program XLA's SPMD partitioner splits across devices (a custom call
    then runs per device's blocks where its method can, else the backend's XLA formulation);
    ``portable``: no custom call at all (an export).

    Raises:
      ValueError: ``method`` is not a method of ``kernel`` (or ``"auto"`` without a backend).
    """
    ok = (backend == "cpu" and not portable
          and onednn.applies(kernel, p, dtype, preferred_element_type) is None)
    if method == "auto":
        if backend is None:
            raise ValueError("lowering: method 'auto' needs a backend to choose for")
        if partitioned or portable:
            method = choose(kernel, p, backend, onednn_ok=False)
            if partitioned and not portable:
                one_device = choose(kernel, p, backend, onednn_ok=ok)
                if one_device in WINOGRAD_METHODS:  # no per-shard form: oneDNN's per shard
                    one_device = "onednn"
                if METHODS[one_device].per_shard:  # the one-device choice, per batch shard
                    method = one_device
                elif (kernel is Kernel.WEIGHT and ok and any(s > 1 for s in p.strides)
                      and partitioner_workaround()):
                    method = "onednn"
        else:
            method = one_device_method(kernel, p, backend, dtype, precision,
                                       preferred_element_type)
        why = METHODS[method].why_not(kernel, p) if method in METHODS else None
        if why is not None:  # a table bug (tests/test_lowering_registry.py), never a user's
            raise RuntimeError(f"jaxconv: the {backend} table picked {why}")
    if method not in METHODS or kernel not in METHODS[method].kernels:
        raise ValueError(f"lowering: method must be 'auto' or one of {list(methods(kernel))}, "
                         f"got {method!r}")
    record = METHODS[method]
    if backend is not None and record.platforms is not None and (
            backend not in record.platforms or portable or (partitioned and not record.per_shard)):
        method = choose(kernel, p, backend, onednn_ok=False)
    elif method in WINOGRAD_METHODS and (
            winograd.dtype_why(dtype, preferred_element_type) or _highest(precision)
            or METHODS[method].why_not(kernel, p)):
        # Winograd rounds more than direct arithmetic: Precision.HIGHEST, and operands it does
        # not take (float64, float16, two dtypes), get the direct convolution (oneDNN's where it
        # applies); so does a problem a batching rule made grouped (vmap over the filter).
        # ("auto" leaves bfloat16 to oneDNN in one_device_method.)
        method = "onednn" if ok else default_leaf(kernel)
    elif method == "onednn" and onednn.applies(kernel, p, dtype, preferred_element_type):
        method = default_leaf(kernel)  # operands the handler does not take
    record = METHODS[method]
    if method == "onednn":  # earlier processes' layout verdicts, before the first call
        measured.load_layouts()
    sub_plan = None
    if record.combinator:  # each one-group sub-problem: the same backend's table, or one convolution
        def sub_plan(sub_kernel: Kernel, sub: ConvProblem) -> Plan:
            return plan(sub_kernel, sub, method="auto" if backend is not None else
                        default_leaf(sub_kernel), backend=backend, dtype=dtype,
                        precision=precision, preferred_element_type=preferred_element_type,
                        partitioned=partitioned, portable=portable)
    return Plan(kernel, method, backend, per_shard=partitioned and record.per_shard,
                fence=backend in record.fenced_on, dtype=None if dtype is None else np.dtype(dtype),
                precision=precision, preferred_element_type=preferred_element_type,
                sub_plan=sub_plan)
