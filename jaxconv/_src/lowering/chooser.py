"""The chooser: the one place that decides how each kernel call runs, as a resolved :class:`Plan`.

For a kernel, a problem, the backend its program is lowered for and the call's dtypes,
:func:`plan` decides

* the method: ``"auto"`` by the backend's table (``tables.py``, data read here alone); on one
  CPU device the table's method is the rule, and the candidates that may replace it
  (:func:`candidates`: XLA's own program for a small problem, Winograd's tiles against oneDNN's
  direct kernel) are handed to ``measured.py``, which times them once per machine and keeps
  the verdict. A forced method is checked, and replaced by the backend's XLA formulation
  where the program cannot hold it (a custom call lowered for another platform, in an export,
  or in a partitioned program that it cannot run per shard in), or by the default leaf where
  oneDNN does not take the operands. ``lowering="direct"`` and ``JAXCONV_WINOGRAD=0`` are
  ``"auto"`` without Winograd (:func:`winograd_allowed`; docs/precision.md, "Winograd");
* its parameters: Winograd's tile, the products' fence (``common.product``), the thread count
  a per-shard call takes (set per device's blocks by ``spmd.py``);
* whether it runs per device's blocks (a program XLA's partitioner splits across devices);
* its fallback: the leaf that computes a device's blocks the method does not take;
* why (``Plan.why``): the string ``jaxconv.explain`` prints.

The same module answers the other choices between jaxconv's kernels and XLA's: whether a
matrix product runs on oneDNN (:func:`product_on_onednn`, for ``matmul.py`` and
``accelerate``), which calls of ``lax.conv_general_dilated`` jaxconv hands to lax
(:func:`lax_computes`, for ``lax_conv.py`` and ``accelerate``), and when the process's
allocator keeps freed memory (:func:`keep_freed_memory`, the one caller of ``host_memory``'s
setting). Whether oneDNN computes a call is asked of one function, ``onednn.applies``.
``execute.py`` runs a plan; a combinator's sub-problems get plans of their own
(``Plan.sub_plan``: a leaf method each, a table never picking a combinator for one group).
``tests/lowering/test_chooser.py`` asserts that no other module reads the tables, times a
choice or sets the allocator.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import jaxpr_as_fun, jaxprs_in_params
from jaxlib import version as jaxlib_version

from jaxconv._src import host_memory
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering import max_pool, measured, onednn, tables, taps, winograd
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

#: the backends with a rule table, and the platforms each covers (``tables.py``)
BACKENDS, PLATFORMS = tables.BACKENDS, tables.PLATFORMS

#: the Winograd methods (``lowering/winograd.py``)
WINOGRAD_METHODS = ("winograd", "winograd_2x2", "winograd_3x3", "winograd_4x4")

#: the lowering values that choose (every other is a method, forced): ``"direct"`` is
#: ``"auto"`` without Winograd
CHOOSING = ("auto", "direct")

#: XLA's own program for each kernel: what ``jax.vjp`` of ``lax.conv_general_dilated`` runs
XLA_OWN = {Kernel.FORWARD: "conv", Kernel.DATA: "vjp", Kernel.WEIGHT: "vjp"}

#: the largest problem (multiply-adds) whose choice is timed: about a millisecond on the CPUs of
#: docs/performance.md, so that both programs are timed in a few milliseconds
MEASURE_MAX_MACS = 2 ** 25

#: the largest problem whose Winograd is timed against oneDNN (about 20 ms a run on the Zen 4
#: of docs/lowerings.md); larger ones keep Winograd, which won every such problem measured
#: there (not measured on Intel CPUs)
WINOGRAD_MEASURE_MAX_MACS = 2 ** 32


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(part) for part in v.split(".")[:3] if part.isdigit())


def partitioner_workaround(jaxlib: str = jaxlib_version.__version__) -> bool:
    """Whether ``jaxlib`` takes the strided weight gradients of partitioned CPU programs away
    from XLA's partitioner: from the earliest jaxlib the bug was seen on, until one is verified
    fixed."""
    first = min(_version(v) for v in PARTITIONER_BUG_SEEN_ON)
    return _version(jaxlib) >= first and jaxlib not in PARTITIONER_FIXED_IN


@functools.cache
def winograd_allowed() -> bool:
    """Whether ``lowering="auto"`` may run Winograd in this process: unless
    ``JAXCONV_WINOGRAD=0`` (read once; docs/precision.md, "Winograd")."""
    return os.environ.get("JAXCONV_WINOGRAD", "1") != "0"


def _highest(precision: Precision) -> bool:
    """Whether ``precision`` asks for full float32 arithmetic (HIGHEST, for either operand)."""
    if precision is None:
        return False
    found = precision if isinstance(precision, tuple) else (precision,)
    return any(lax.Precision(q) == lax.Precision.HIGHEST for q in found if q is not None)


# ------------------------------------------------------------------------ the tables' method

def choose(kernel: Kernel, p: ConvProblem, backend: str, *, onednn_ok: bool | None = None) -> str:
    """The backend table's method for ``kernel`` of ``p`` (``onednn_ok``: whether oneDNN may
    be picked; None: where it applies to the problem)."""
    if onednn_ok is None:
        onednn_ok = onednn.applies(kernel, p) is None
    return tables.METHOD[kernel](p, backend, onednn_ok)


def cpu_table_method(kernel: Kernel, p: ConvProblem, dtype: Any, precision: Precision = None,
                     preferred_element_type: DType = None, *, direct: bool = False) -> str:
    """The CPU table's method for ``kernel`` of ``p`` on one device, before any timing: the
    rule whose challengers :func:`candidates` lists. Winograd is left to oneDNN's direct
    kernel for the dtypes and precisions ``"auto"`` does not take it for, and with
    ``direct`` (``lowering="direct"``, ``JAXCONV_WINOGRAD=0``)."""
    ok = onednn.applies(kernel, p, dtype, preferred_element_type) is None
    method = choose(kernel, p, "cpu", onednn_ok=ok)
    if method == "winograd" and (direct or not winograd_allowed()
                                 or not winograd.pays_for(dtype) or _highest(precision)):
        method = "onednn"
    return method


def xla_own_applies(kernel: Kernel, p: ConvProblem) -> bool:
    """Whether XLA's own program for ``kernel`` (:data:`XLA_OWN`) computes ``p``."""
    return METHODS[XLA_OWN[kernel]].why_not(kernel, p) is None


# ---------------------------------------------------------------- what a timing may replace

# What "auto" may run on one CPU device, per problem class: the candidates it times. Each
# class's candidates are checked against PyTorch on problems of that class, pads past the
# kernel and strided remainders included (tests/lowering/test_candidates.py); a method wrong
# for a class must not be one of its candidates (docs/lowerings.md, "What auto may run").
CANDIDATE_CLASSES = {
    "winograd": "the table's Winograd (3x3, stride 1): the tiles its accuracy rule allows and "
                "oneDNN's direct kernel, up to WINOGRAD_MEASURE_MAX_MACS, and up to "
                "MEASURE_MAX_MACS XLA's own program (XLA_OWN) where it applies",
    "small": "any other table method, up to MEASURE_MAX_MACS (that read data: _work): it and "
             "XLA's own program "
             "(XLA_OWN: the forward's one convolution, the gradients' jax.vjp program), and "
             "\"dot\" where it is one product (products_challenge)",
    "table": "the table's method alone: XLA's own program, a larger problem, or XLA's program "
             "not applying",
}
# On 16-bit operands where the table's method is oneDNN's, the "small" and "table" classes
# also time oneDNN's float32 kernel on the operands widened (``onednn_f32``:
# widened_challenges).


def candidate_class(kernel: Kernel, p: ConvProblem, method: str, *, xla_applies: bool) -> str:
    """Which of :data:`CANDIDATE_CLASSES` a call whose CPU table picked ``method`` is in."""
    if method == "winograd":  # the table picks it only where oneDNN applies
        return "winograd" if tables.macs(p) <= WINOGRAD_MEASURE_MAX_MACS else "table"
    if not xla_applies or method == XLA_OWN[kernel] or _work(kernel, p) > MEASURE_MAX_MACS:
        return "table"
    return "small"


def _work(kernel: Kernel, p: ConvProblem) -> float:
    """The multiply-adds of ``kernel`` of ``p`` that read data: ``tables.macs``, but for the
    forward of one input position, whose output positions each read one tap at most (its other
    taps read padding: a generator's first layer at batch 8, 1e8 multiply-adds nominal, 6.6e6
    read)."""
    macs = tables.macs(p)
    return macs / math.prod(p.kernel) if kernel is Kernel.FORWARD and p.one_input_position \
        else macs


def candidates(kernel: Kernel, p: ConvProblem, method: str, dtype: Any, *,
               xla_applies: bool) -> tuple[str, ...]:
    """The methods ``"auto"`` times for ``kernel`` of ``p`` where the CPU table picked
    ``method`` (:data:`CANDIDATE_CLASSES`); one method: nothing is timed."""
    klass = candidate_class(kernel, p, method, xla_applies=xla_applies)
    if klass == "winograd":  # XLA's own too where it is small (the MNIST CNN's 3x3 32 -> 64 at
        # 14x14, batch 1: 0.05 ms against Winograd's 0.18 on the 2-core Xeon)
        own = (XLA_OWN[kernel],) if xla_applies and tables.macs(p) <= MEASURE_MAX_MACS else ()
        return (*(f"winograd_{m}x{m}" for m in winograd.timed_tiles(kernel, p, dtype)),
                "onednn", *own)
    names: tuple[str, ...] = (method, XLA_OWN[kernel]) if klass == "small" else (method,)
    if klass == "small" and method != "dot" and products_challenge(kernel, p, dtype):
        names = (*names, "dot")
    return (*names, "onednn_f32") if widened_challenges(kernel, p, method, dtype) else names


def products_challenge(kernel: Kernel, p: ConvProblem, dtype: Any) -> bool:
    """Whether ``"dot"`` challenges the table's method for ``kernel`` of ``p`` on ``dtype``
    operands: float32, where it is one matrix product that reads the filter as it lies
    (``taps.one_product``: the forward of one input position, a generator's first layer; the
    data gradient of few input channels, its last; a kernel of one window over the input).
    Not on 16-bit operands: there its product and the converts around it lost in the program
    what they won timed alone (DCGAN's generator, 2-core Xeon: docs/lowerings.md, "One
    product")."""
    return (np.dtype(dtype) == np.float32 and kernel in (Kernel.FORWARD, Kernel.DATA)
            and taps.one_product(kernel, p) and math.prod(p.kernel) > 1
            and METHODS["dot"].why_not(kernel, p) is None)


def widened_challenges(kernel: Kernel, p: ConvProblem, method: str, dtype: Any) -> bool:
    """Whether oneDNN's float32 kernel on the widened operands (``onednn_f32``) challenges the
    table's oneDNN for ``kernel`` of ``p`` on 16-bit operands: up to
    :data:`WINOGRAD_MEASURE_MAX_MACS` (docs/lowerings.md, "Timed choices": on a 2-core Xeon
    without AMX oneDNN's bfloat16 kernels ran slower than its float32 ones)."""
    return (method == "onednn" and dtype is not None
            and np.dtype(dtype) in onednn.WIDENED_DTYPES
            and tables.macs(p) <= WINOGRAD_MEASURE_MAX_MACS
            and onednn.widened_applies(kernel, p, dtype) is None)


def rule(kernel: Kernel, p: ConvProblem, method: str, dtype: Any) -> str:
    """What runs without timing (``JAXCONV_MEASURE=0``, a problem past the caps) where the CPU
    table picked ``method``: ``method`` itself, but for Winograd on bfloat16 operands oneDNN's
    direct kernel (``measured.WINOGRAD_BFLOAT16_MARGIN``)."""
    if method == "winograd" and np.dtype(dtype) == jnp.bfloat16:
        return "onednn"
    return method


def _contest(kernel: Kernel, p: ConvProblem, method: str, dtype: Any, precision: Precision,
             preferred_element_type: DType, packed: bool = False) -> measured.Contest:
    """The rule's method for ``kernel`` of ``p`` and the candidates that may replace it, each a
    function of the two operands (its plan, executed), for ``measured.pick``; ``packed``: a
    forward or a data gradient whose filter is a constant of the program, which oneDNN's
    candidates time packed (docs/onednn.md, "Packed filters")."""
    names = candidates(kernel, p, method, dtype, xla_applies=xla_own_applies(kernel, p))
    packs = [m for m in names if m in ("onednn", "onednn_f32")] if (
        packed and kernel in (Kernel.FORWARD, Kernel.DATA)) else []

    def pack(b: np.ndarray) -> Any:  # the bytes the call reads, or the filter where it is not
        got, _ = onednn.pack_filter(kernel, b, p)
        return b if got is None else got

    def call(m: str) -> Callable[[Array, Array], Array]:
        # onednn_f32 is timed as oneDNN's float32 kernel on float32 operands: in a program the
        # widening and the rounding back are elementwise casts that XLA fuses into the
        # operations producing the operands and consuming the result (flax's mixed precision
        # casts float32 parameters to bfloat16: the two casts are one pass); timed with its
        # casts, it lost layers that it wins in a program (docs/lowerings.md, "Timed choices")
        widened = m == "onednn_f32"

        def run(a: Array, b: Array) -> Array:  # planned where it is traced (timed), not before
            if b.dtype == np.uint8:  # a packed filter: the kernel's call reads it
                return (onednn.fused_forward(a, b, (), p, ()) if kernel is Kernel.FORWARD
                        else onednn.packed_data(a, b, p))
            forced = plan(kernel, p, method=m, backend="cpu",
                          dtype=np.float32 if widened else dtype, precision=precision,
                          preferred_element_type=None if widened else preferred_element_type)
            return execute(forced, a, b, p)
        return run
    side = winograd.fewest_products_tile(kernel, p, dtype) if method == "winograd" else None
    return measured.Contest(
        kernel, p, method, np.dtype(dtype), precision, preferred_element_type,
        rule=rule(kernel, p, method, dtype), calls={m: call(m) for m in names},
        fewest=None if side is None else f"winograd_{side}x{side}",
        operand_dtypes={"onednn_f32": np.dtype(np.float32)} if "onednn_f32" in names else {},
        prepare=dict.fromkeys(packs, pack))


def _one_device(kernel: Kernel, p: ConvProblem, backend: str, dtype: Any, precision: Precision,
                preferred_element_type: DType, direct: bool, packed: bool = False
                ) -> tuple[str, str]:
    """What ``lowering="auto"`` (``direct``: ``"direct"``) runs for ``kernel`` on one device of
    ``backend``, and why: the table's method (``"rule"``), on the CPU the winner of its
    candidates where ``measured.py`` timed them (``"measured: ..."``, ``"cache: ..."``: the
    challenger's lead over the rule's method and the lead it needed); ``packed``: the kernel's
    filter is a constant of the program (:func:`_contest`)."""
    if backend != "cpu":
        return choose(kernel, p, backend, onednn_ok=False), "rule"
    method = cpu_table_method(kernel, p, dtype, precision, preferred_element_type, direct=direct)
    contest = _contest(kernel, p, method, dtype, precision, preferred_element_type, packed)
    chosen = measured.pick(contest)
    d = measured.decision(kernel, p, method, dtype, precision, preferred_element_type,
                          contest.packed)
    return chosen, "rule" if d is None else f"{d.source}: {d.lead:+.0%} vs {d.need:.0%} needed"


def one_device_method(kernel: Kernel, p: ConvProblem, backend: str, dtype: Any,
                      precision: Precision = None, preferred_element_type: DType = None,
                      *, direct: bool = False) -> str:
    """What ``lowering="auto"`` (``direct``: ``"direct"``) runs for ``kernel`` on one device of
    ``backend``: the table's method, on the CPU the winner of its candidates where
    ``measured.py`` timed them."""
    return _one_device(kernel, p, backend, dtype, precision, preferred_element_type, direct)[0]


# ----------------------------------------------------------------------------------- the plan

def plan(kernel: Kernel, p: ConvProblem, *, method: str, backend: str | None, dtype: Any,
         precision: Precision = None, preferred_element_type: DType = None,
         partitioned: bool = False, portable: bool = False, packed: bool = False) -> Plan:
    """The plan of ``kernel`` on ``p`` by ``method`` (``"auto"``: the backend's table;
    ``"direct"``: the same without Winograd).

    ``partitioned``: in a program XLA's SPMD partitioner splits across devices (a custom call
    then runs per device's blocks where its method can, else the backend's XLA formulation);
    ``portable``: no custom call at all (an export); ``packed``: a forward or a data
    gradient whose filter is a constant of the program, so that oneDNN's candidates are timed
    on it packed (docs/onednn.md, "Packed filters").

    Raises:
      ValueError: ``method`` is not a method of ``kernel`` (or ``"auto"`` without a backend).
    """
    refused = onednn.applies(kernel, p, dtype, preferred_element_type)  # None: it takes them
    ok = backend == "cpu" and not portable and refused is None
    asked, why = method, "forced"
    if method in CHOOSING:
        if backend is None:
            raise ValueError(f"lowering: method {method!r} needs a backend to choose for")
        method, why = _auto(kernel, p, backend, dtype, precision, preferred_element_type,
                            partitioned=partitioned, portable=portable, onednn_ok=ok,
                            direct=method == "direct", packed=packed)
        bug = METHODS[method].why_not(kernel, p) if method in METHODS else None
        if bug is not None:  # a table bug (tests/lowering/test_registry.py), never a user's
            raise RuntimeError(f"jaxconv: the {backend} table picked {bug}")
    if method not in METHODS or kernel not in METHODS[method].kernels:
        raise ValueError(f"lowering: method must be 'auto', 'direct' or one of "
                         f"{list(methods(kernel))}, got {method!r}")
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
        # ("auto" leaves bfloat16 to oneDNN in cpu_table_method.)
        method = "onednn" if ok else default_leaf(kernel)
    elif method in ("onednn", "onednn_f32") and (refuses := METHODS[method].refuses) and refuses(
            kernel, p, dtype, preferred_element_type) is not None:
        method = default_leaf(kernel)  # operands the handler does not take
    if asked not in CHOOSING and method != asked:
        why = f"forced {asked}, which this call cannot run"
    record = METHODS[method]
    if method == "onednn":  # earlier processes' layout verdicts, before the first call
        measured.load_layouts()
    params: dict[str, Any] = {}
    if method == "winograd":  # the tile that multiplies least
        params["tile"] = winograd.fewest_products_tile(kernel, p, dtype)
    if record.fenced_on:
        params["fence"] = backend in record.fenced_on
    if record.per_shard:
        params["threads"] = 0  # the handler's rule; spmd.call sets it per device's blocks
    sub_plan = None
    if record.combinator:  # each one-group sub-problem: the same backend's table, or one convolution
        def sub_plan(sub_kernel: Kernel, sub: ConvProblem) -> Plan:
            return plan(sub_kernel, sub, method="auto" if backend is not None else
                        default_leaf(sub_kernel), backend=backend, dtype=dtype,
                        precision=precision, preferred_element_type=preferred_element_type,
                        partitioned=partitioned, portable=portable)
    return Plan(kernel, method, backend, per_shard=partitioned and record.per_shard,
                params=tuple(sorted(params.items())),
                fallback=default_leaf(kernel) if record.refuses is not None else None, why=why,
                dtype=None if dtype is None else np.dtype(dtype),
                precision=precision, preferred_element_type=preferred_element_type,
                sub_plan=sub_plan)


def _auto(kernel: Kernel, p: ConvProblem, backend: str, dtype: Any, precision: Precision,
          preferred_element_type: DType, *, partitioned: bool, portable: bool, onednn_ok: bool,
          direct: bool, packed: bool = False) -> tuple[str, str]:
    """The method ``"auto"`` (``direct``: ``"direct"``) runs for ``kernel`` of ``p``, and why."""
    if not (partitioned or portable):
        return _one_device(kernel, p, backend, dtype, precision, preferred_element_type, direct,
                           packed)
    method = choose(kernel, p, backend, onednn_ok=False)
    if partitioned and not portable:
        one_device = choose(kernel, p, backend, onednn_ok=onednn_ok)
        if one_device in WINOGRAD_METHODS:  # no per-shard form: oneDNN's per shard
            one_device = "onednn"
        if METHODS[one_device].per_shard:  # the one-device choice, per batch shard
            method = one_device
        elif (kernel is Kernel.WEIGHT and onednn_ok and any(s > 1 for s in p.strides)
              and partitioner_workaround()):
            method = "onednn"
    return method, "rule"


# ------------------------------------------------------ a transposed convolution as written

#: a written transposed convolution runs as written, untimed, where its filter holds more than
#: this many times the elements of its input and output together: DCGAN's generator on the
#: 2-core Zen 4 VM, batch 1 and 8, where XLA's as written was faster at 2.7 and 10 times (1.2 ms
#: against 4 for the 8 MiB filter at batch 1) and jaxconv's at 1.3 times and below (2.75 ms
#: against 3.6 at batch 8; not measured on Intel CPUs, where the timing decides);
#: docs/lowerings.md, "Timed choices"
WRITTEN_FILTER_RATIO = 2

def as_written(kernel: Kernel, p: ConvProblem, dtype: Any, precision: Precision,
               preferred_element_type: DType, *, shapes: tuple[tuple[int, ...], tuple[int, ...]],
               ours: Callable[[Array, Array], Array],
               written: Callable[[Array, Array], Array], mirrored: bool = False,
               packed: bool = False) -> bool:
    """Whether a convolution the program wrote with input dilation (a transposed convolution
    with its own filter, flax's ``ConvTranspose``) runs as written (``written``, XLA's) rather
    than as jaxconv's ``kernel`` of ``p`` (``ours``: its filter reversed and role-swapped in
    XLA first, or where ``mirrored``, its activations reversed and the filter read in place:
    ``accelerate/rewrites/mirrored.py``; where ``packed``, the filter a constant of the
    program reversed and packed once: docs/onednn.md, "Packed filters"; then the kernel's own
    choice): each a function of the equation's two operands (of ``shapes``),
    timed in that context on one CPU device, once per problem and machine, where the program's
    backend is the CPU (``measured.pick``). The rule, untimed: as written where the filter
    holds more than :data:`WRITTEN_FILTER_RATIO` times the bytes of the two activations and
    jaxconv's form is neither mirrored nor packed (a
    filter-heavy layer at a small batch spends more on moving its filter than on its products:
    DCGAN's 4 x 4 512 -> 256 at 4 x 4, an 8 MiB filter reversed by XLA, then reordered by
    oneDNN), else jaxconv's kernel. Mirrored, the filter is read in place: DCGAN's 512 -> 256
    layer at 4 x 4, batch 1, as written 0.91-1.16 ms, mirrored on oneDNN's convolution 1.08,
    on its tap products 0.45-0.57 (2-core Zen 4 VM; docs/lowerings.md, "Timed choices")."""
    if jax.default_backend() != "cpu":
        return False
    filter_heavy = (math.prod(p.filter_shape)
                    > WRITTEN_FILTER_RATIO * (math.prod(p.x_shape) + math.prod(p.y_shape)))
    rule = "lax" if filter_heavy and not (mirrored or packed) else "jaxconv"
    # the rule and the form of ours in the cache's key: a verdict per rule and form
    form = "packed, " if packed else "mirrored, " if mirrored else ""
    contest = measured.Contest(kernel, p, f"as written ({form}{rule})", np.dtype(dtype), precision,
                               preferred_element_type, rule=rule,
                               calls={"jaxconv": ours, "lax": written}, shapes=shapes)
    return measured.pick(contest) == "lax"


#: the most multiply-adds (its convolutions' and products', as written) of a program whose
#: accelerated form is timed against the program as written (:func:`whole_program`):
#: a few milliseconds a run on the CPUs of docs/performance.md
PROGRAM_MEASURE_MAX_MACS = 2 ** 27

#: the primitives whose values depend on their operands' values in ways random operands do
#: not stand for (a loop's trip count, a branch): a program holding one is not timed whole
_DATA_DEPENDENT = frozenset({"while", "cond"})


def _program_macs(jaxpr: Any) -> float | None:
    """The multiply-adds of ``jaxpr``'s convolutions and products (nested jaxprs included), or
    None where it holds a primitive of :data:`_DATA_DEPENDENT`."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _DATA_DEPENDENT:
            return None
        if name == "conv_general_dilated":
            rhs = eqn.invars[1].aval
            total += math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs.shape) / max(
                1, rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]])
        elif name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval
            total += math.prod(eqn.outvars[0].aval.shape) * math.prod(
                lhs.shape[a] for a in contract)
        for sub in jaxprs_in_params(eqn.params):
            inner = _program_macs(sub)
            if inner is None:
                return None
            total += inner
    return total


def _holds_jaxconv(jaxpr: Any) -> bool:
    return any(eqn.primitive.name.startswith("jaxconv")
               or any(_holds_jaxconv(sub) for sub in jaxprs_in_params(eqn.params))
               for eqn in jaxpr.eqns)


def _holds_winograd(jaxpr: Any) -> bool:
    """Whether a convolution of ``jaxpr`` (an accelerated program; nested jaxprs included)
    asks for ``"auto"`` where the CPU table's method is Winograd."""
    for eqn in jaxpr.eqns:
        params = eqn.params
        if (eqn.primitive.name in ("jaxconv_conv", "jaxconv_fused")
                and params.get("method") == "auto"
                and cpu_table_method(params["kernel"], params["p"], eqn.invars[0].aval.dtype,
                                     params["precision"], params["preferred_element_type"])
                == "winograd"):
            return True
        if any(_holds_winograd(sub) for sub in jaxprs_in_params(params)):
            return True
    return False


def whole_program(written: Any, ours: Callable[..., Any],
                  without_winograd: Callable[..., Any] | None = None) -> Any:
    """The program that runs for a function ``accelerate`` transforms, where they were timed
    whole: ``written`` (its closed jaxpr), its accelerated form (``ours``, a function of the
    same operands, traced) or that form without Winograd (``without_winograd``: ``lowering=
    "direct"``'s, timed where a convolution of ``ours`` has Winograd as its table's method);
    None where nothing was timed (``ours`` runs). Timed once per program and machine, where
    the programs run on the CPU, the program multiplies and adds at most
    :data:`PROGRAM_MEASURE_MAX_MACS` times, holds no loop or branch that depends on its
    operands' values, and its accelerated form holds jaxconv's kernels
    (``measured.pick_program``: the accelerated program is the rule; the form without
    Winograd challenges it, then the program as written the one that held). Each kernel's
    own choice is timed alone, where XLA fuses the program's convolutions with their
    neighbours, at a small size into one fusion for a whole CNN (the MNIST CNN's batch-8
    forward took 0.46 ms as XLA:CPU's one fusion against 0.77 accelerated on the 2-core Xeon
    of docs/performance.md), and where a kernel's calls cost the calls after them what it
    does not time alone (a Winograd forward on oneDNN's OpenMP team, before it ran on XLA's
    pool, left the team's workers spinning on the cores the next calls split over the pool:
    the MNIST CNN's batch-1 forward 0.14 ms accelerated, 0.12 without Winograd, 0.20 as
    written, on the 2-core Zen 4 VM; docs/lowerings.md, "Timed choices")."""
    if (jax.default_backend() != "cpu" or not measured.enabled() or written.effects
            or any(isinstance(c, jax.core.Tracer) for c in written.consts)):
        return None  # (a constant of an enclosing trace cannot be timed alone)
    macs = _program_macs(written.jaxpr)
    if macs is None or macs > PROGRAM_MEASURE_MAX_MACS:
        return None
    avals = written.in_avals
    with jax.ensure_compile_time_eval():
        accelerated = jax.make_jaxpr(ours)(*avals)
    if not _holds_jaxconv(accelerated.jaxpr) or any(
            isinstance(c, jax.core.Tracer) for c in accelerated.consts):
        return None
    forms = {"jaxconv": accelerated}
    if without_winograd is not None and _holds_winograd(accelerated.jaxpr):
        with jax.ensure_compile_time_eval():
            forms["direct"] = jax.make_jaxpr(without_winograd)(*avals)
    text = f"{written.jaxpr}|{[(a.shape, str(a.dtype)) for a in written.in_avals]}|" + \
        str([(np.shape(c), str(getattr(c, "dtype", type(c).__name__))) for c in written.consts])
    description = f"of {len(written.jaxpr.eqns)} equations, {macs:.3g} multiply-adds"
    calls = {**{m: jaxpr_as_fun(f) for m, f in forms.items()}, "lax": jaxpr_as_fun(written)}
    chosen = measured.pick_program(description, text, calls, avals, rule="jaxconv")
    return written if chosen == "lax" else forms[chosen]


# ------------------------------------------------------------ the other kernels' choices

def product_why_not(a: Any, b: Any, dimension_numbers: Any,
                    preferred_element_type: DType) -> str | None:
    """Why ``dot_general(a, b, dimension_numbers)`` (abstract values) of a program on one device
    does not run on oneDNN's matmul (``onednn.product_applies``), or None where it does: what
    ``accelerate`` reports for a product it leaves as written. A float32 product runs there on
    the CPU where it timed faster than XLA's on this machine (:func:`_float32_product`)."""
    why = onednn.product_applies(a, b, dimension_numbers, preferred_element_type)
    if why is None and np.dtype(a.dtype) == np.float32:
        if jax.default_backend() != "cpu":
            return (f"a float32 product runs on oneDNN on the CPU only, got default backend "
                    f"{jax.default_backend()}")
        why = _float32_product(a, b, dimension_numbers, preferred_element_type)
    return why


def product_on_onednn(a: Any, b: Any, dimension_numbers: Any, preferred_element_type: DType,
                      *, partitioned: bool = False, exported: bool = False) -> bool:
    """Whether ``dot_general(a, b, dimension_numbers)`` (abstract values), lowered for the CPU,
    runs on oneDNN's matmul (``matmul.py``): in a program on one device that is not exported,
    where :func:`product_why_not` gives no reason against it (the answer ``accelerate`` had
    when it bound the product). A program that will run it keeps freed memory."""
    ours = (not partitioned and not exported
            and product_why_not(a, b, dimension_numbers, preferred_element_type) is None)
    if ours:
        keep_freed_memory("cpu")
    return ours


#: the float32 products' contest, part of its key (a change times again)
_FLOAT32_PRODUCT = "XLA's dot_general against the handler's sgemm in parts on XLA's pool"


def _float32_product(a: Any, b: Any, dimension_numbers: Any,
                     preferred_element_type: DType) -> str | None:
    """Why a float32 product (``onednn.product_applies`` holds) stays XLA's, or None where
    oneDNN's timed faster. XLA's product is the rule; the handler's (its sgemm in parts of
    the result on XLA's pool: ``native/onednn/matmul.h``) replaces it where it times faster
    by ``measured.CHALLENGER_MARGIN`` beyond noise, once per shape and machine
    (``measured.pick_program``). A serving batch's dense layer reads its weights once and XLA
    runs it on one thread: 1 x 1280 x 1000 took 157 us in XLA, 105 us as two parts; the MNIST
    CNN's 1 x 3136 x 256, 170 against 67 (2-core Xeon; docs/onednn.md, "Matrix products")."""
    (ca, cb), _ = dimension_numbers
    contracting = (int(ca[0]), int(cb[0]))

    def xla(x: Array, y: Array) -> Array:
        out: Array = jax.lax.dot_general(x, y, dimension_numbers,
                                         preferred_element_type=preferred_element_type)
        return out

    def ours(x: Array, y: Array) -> Array:
        return onednn.matmul_call(x, y, contracting, preferred_element_type)

    description = (f"float32 {list(a.shape)} x {list(b.shape)}, contracting "
                   f"{list(contracting)}")
    text = repr((_FLOAT32_PRODUCT, tuple(a.shape), tuple(b.shape), contracting,
                 str(preferred_element_type)))
    verdict = measured.pick_program(description, text, {"xla": xla, "onednn": ours},
                                    (a, b), rule="xla", kind="product")
    if verdict == "onednn":
        return None
    if not measured.enabled():
        return ("timed choices are off (JAXCONV_MEASURE=0): a float32 product stays XLA's, "
                "the rule")
    return "XLA's float32 product timed at least as fast on this machine"


#: the max pools' contest, part of its key (a change times again)
_MAX_POOL = ("XLA's forward and argmax against the handler's one pass in parts on XLA's pool, "
             "each with the gradient's scatter")


def max_pool_why_not(x: Any, p: Any, written: Callable[[Array], tuple[Array, Array]],
                     gradient: Callable[[Array, Array], Array]) -> str | None:
    """Why the forward and argmax of max pool ``p`` of ``x`` (an abstract value), in a program
    on one CPU device that is not exported, stay ``written`` (XLA's selects, ``pooling.py``)
    rather than the handler's one pass (``lowering/max_pool.py``), or None where the handler
    computes them. XLA's program is the rule; the handler's replaces it where it times faster by
    ``measured.CHALLENGER_MARGIN`` beyond noise, once per shape and machine
    (``measured.pick_program``). Each is timed as a training step runs it, the argmax read by
    ``gradient(ct, arg)`` (the scatter of a cotangent): XLA fuses its argmax into that loop,
    computing it again for every tap that reads it. XLA:CPU computes the argmax's compares and
    selects an element at a time (ResNet's stem pool at batch 8, 112 x 112 x 64, forward and
    backward: 10.8 ms with XLA's argmax, 4.1 with the handler's; 2-core Zen 4, docs/onednn.md,
    "Max pool")."""
    why = max_pool.handler_applies(x.dtype, p)
    if why is not None:
        return why
    if jax.default_backend() != "cpu":
        return f"the handler pools on the CPU only, got default backend {jax.default_backend()}"

    def timed(forward: Callable[[Array], tuple[Array, Array]]) -> Callable[..., Any]:
        def run(v: Array, ct: Array) -> tuple[Array, Array]:
            y, arg = forward(v)
            return y, gradient(ct, arg)
        return run
    description = (f"{np.dtype(x.dtype).name} {list(x.shape)}, window {list(p.window)}, "
                   f"strides {list(p.strides)}, pads {[list(q) for q in p.pads]}")
    text = repr((_MAX_POOL, tuple(x.shape), str(np.dtype(x.dtype)), p))
    ct = jax.ShapeDtypeStruct(p.shape(x.shape, p.output_size), x.dtype)  # type: ignore[no-untyped-call]
    calls = {"xla": timed(written), "handler": timed(lambda v: max_pool.max_pool_call(v, p))}
    verdict = measured.pick_program(description, text, calls, (x, ct), rule="xla", kind="pool")
    if verdict == "handler":
        return None
    if not measured.enabled():
        return ("timed choices are off (JAXCONV_MEASURE=0): a max pool's argmax stays XLA's, "
                "the rule")
    return "XLA's argmax timed at least as fast on this machine"


def max_pool_on_handler(x: Any, p: Any, written: Callable[[Array], tuple[Array, Array]],
                        gradient: Callable[[Array, Array], Array], *, partitioned: bool = False,
                        exported: bool = False) -> bool:
    """Whether the forward and argmax of max pool ``p`` of ``x`` (an abstract value), lowered
    for the CPU, run on the handler: in a program on one device that is not exported, where
    :func:`max_pool_why_not` gives no reason against it."""
    return (not partitioned and not exported
            and max_pool_why_not(x, p, written, gradient) is None)


def keep_freed_memory(backend: str = "cpu") -> None:
    """Where one of jaxconv's CPU kernels will run (``accelerate``, a kernel call lowered by
    ``registry.run``, a oneDNN product), the allocator keeps the memory XLA:CPU
    frees (``host_memory.keep_by_default``: once per process, and a warning where jaxconv was
    imported after the program's first computation; docs/training.md, "Host memory")."""
    if backend == "cpu":
        host_memory.keep_by_default()


#: The calls of ``jaxconv.conv_general_dilated`` that lax computes itself (same value, lax's
#: derivatives), as the reasons the code gives and the docs list (docs/migration.md, "Computed
#: by jaxconv, handed to lax"; a test keeps the two equal). Every other call runs jaxconv's
#: forward kernel.
HANDED_TO_LAX: dict[str, str] = {
    "operands not real floating point": "complex, integer and bool operands",
    "not 1 to 3 spatial axes": "0 spatial axes (lax computes a matrix product) or more than 3",
    "input dilation": "`lhs_dilation` > 1 (a transposed convolution: `jaxconv.conv_transpose` "
                      "has jaxconv's derivatives)",
    "batch_group_count > 1": "`batch_group_count` > 1",
    "out_sharding": "an `out_sharding` (explicit sharding mode)",
    "a zero-size extent": "a zero-size batch, channel or spatial extent, or an empty output",
}


def lax_computes(n: int, extents: Sequence[int], *, out_sharding: Any = None,
                 lhs_dilation: Sequence[int] = (), batch_groups: int = 1) -> str | None:
    """Why lax computes a call of real floating operands with ``n`` spatial axes and the
    operands' and result's ``extents`` (a key of :data:`HANDED_TO_LAX`), or None where
    jaxconv's kernel does (``accelerate``'s patterns, which read input dilation and batch
    groups as autodiff's transposes, ask without them)."""
    reasons = [
        (not 1 <= n <= 3, "not 1 to 3 spatial axes"),
        (any(d > 1 for d in lhs_dilation), "input dilation"),
        (batch_groups > 1, "batch_group_count > 1"),
        (out_sharding is not None, "out_sharding"),
        (min(extents, default=1) <= 0, "a zero-size extent"),  # lhs, rhs or the result
    ]
    return next((why for hit, why in reasons if hit), None)
