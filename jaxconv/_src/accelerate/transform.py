"""``jaxconv.accelerate``: a function transformation that runs a program's convolutions and max
pools through jaxconv's kernels.

How: the function is traced to a jaxpr (as ``jax.make_jaxpr`` does, in the caller's trace:
under ``jit``, ``grad`` or ``vmap`` its arguments are that transformation's tracers), and the
jaxpr is evaluated again equation by equation, as ``jax.core.eval_jaxpr`` does, in two passes
(:data:`PASSES`). The first writes 16-bit arithmetic in float32 with explicit converts
(``widening.py``), with the rewrites that read the program as written (``rewrites.WIDEN``), and
is traced again; the second computes each equation a kernel rewrite matches
(``rewrites.KERNELS``, asked in order: ``match`` then ``emit``) by it, jaxconv's primitive
instead of lax's, in the caller's trace. Every other equation is bound as it was. Nested
jaxprs are rewritten where they hold an equation to rewrite:
a ``jit`` is inlined (the caller's ``jit`` compiles the whole); ``checkpoint``, ``scan``,
``while``, ``cond``, ``custom_jvp`` and ``custom_vjp`` keep their primitive with the rewritten
jaxpr (their custom rules stay as written); a nested jaxpr that cannot be traced again outside
its own context (a ``shard_map`` body's collectives) runs as it was.

Because the rewrite happens while the caller's transformation traces, the result composes as
JAX's own transformations do: ``jax.grad(accelerate(f))`` differentiates jaxconv's primitive
(its derivatives are jaxconv's kernels), ``accelerate(jax.grad(f))`` rewrites the transposes
autodiff wrote, ``jax.jit(accelerate(f))`` caches apart from ``jax.jit(f)`` (they are two
functions: no global mode, nothing a cache can miss).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax._src import (
    api_util,  # the debug info a retraced jaxpr carries (no public name)
    source_info_util,  # equations keep their source lines (no public name)
)
from jax._src import linear_util as lu  # wrapping a function for tracing (no public name)
from jax._src.interpreters import partial_eval as pe  # tracing a nested jaxpr again
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from jaxconv._src import lax_refs
from jaxconv._src.lowering import chooser
from jaxconv._src.accelerate import rewrites, widening
from jaxconv._src.accelerate.analysis import Analysis
from jaxconv._src.accelerate.rewrites import products

F = TypeVar("F", bound=Callable[..., Any])

#: the primitives whose equations a rewrite may compute otherwise where a nested jaxpr holds
#: them (its jaxpr is then evaluated again: :func:`_holds_target`)
_KERNELS = frozenset({"conv_general_dilated", "reduce_window_max", "select_and_scatter_add",
                      "select_and_gather_add", "reduce_window_sum"})

#: nested-jaxpr primitives that are inlined (their jaxpr param, a ClosedJaxpr)
_INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}


def _targets(eqn: Any) -> bool:
    """Whether ``eqn`` may run otherwise: a convolution, a pool or a window sum (:data:`_KERNELS`),
    a matrix product that runs on oneDNN (the product rewrite matches it), or 16-bit
    arithmetic (:func:`widening.targets`)."""
    if eqn.primitive.name == "dot_general":
        return products.why_not(eqn) is None
    return eqn.primitive.name in _KERNELS or widening.targets(eqn)


def _holds_target(jaxpr: Jaxpr) -> bool:
    """Whether ``jaxpr`` or a jaxpr nested in it has an equation to compute otherwise
    (:func:`_targets`)."""
    for eqn in jaxpr.eqns:
        if _targets(eqn):
            return True
        if any(_holds_target(sub) for sub in _subjaxprs(eqn.params)):
            return True
    return False


def _subjaxprs(params: dict[str, Any]) -> list[Jaxpr]:
    out = []
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, ClosedJaxpr):
                out.append(v.jaxpr)
            elif isinstance(v, Jaxpr):
                out.append(v)
    return out


#: what the rewrites made of each equation, where a caller asks (``jaxconv.explain``)
Record = dict[Any, rewrites.Decision]


@dataclasses.dataclass(frozen=True)
class Pass:
    """One evaluation of the program, traced again (the last: in the caller's trace)."""

    name: str
    #: the rewrites it asks, in order
    asks: tuple[rewrites.Rewrite, ...]
    #: 16-bit arithmetic in float32 (:mod:`widening`): its result holds explicit converts
    widen: bool = False
    #: the program XLA compiles: a convolution it binds as written has a negative pad cropped
    final: bool = False

    @functools.cached_property
    def by_primitive(self) -> dict[str, tuple[rewrites.Rewrite, ...]]:
        return {name: tuple(r for r in self.asks if name in r.primitives)
                for name in {n for r in self.asks for n in r.primitives}}


#: The passes, in order: 16-bit arithmetic in float32, its result a program with explicit
#: converts (with the rewrites that read the program as written: ``rewrites.WIDEN``); then the
#: kernels, on a program without 16-bit arithmetic to widen.
PASSES = (Pass("widen", rewrites.WIDEN, widen=True),
          Pass("kernels", rewrites.KERNELS, final=True))


@dataclasses.dataclass(frozen=True)
class _Run:
    """What one pass's evaluation carries into nested jaxprs."""

    pass_: Pass
    lowering: str
    record: Record | None


def passes(closed: ClosedJaxpr, lowering: str = "auto",
           record: Record | None = None) -> ClosedJaxpr:
    """``closed`` after every pass but the last (:data:`PASSES`), each traced again."""
    for p in PASSES[:-1]:
        out = _retrace(closed.jaxpr, closed.consts, _Run(p, lowering, record))
        assert out is not None  # a pass keeps the program's signature
        closed = ClosedJaxpr(*out)
    return closed


def evaluate(jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any], *,
             wide_results: bool = False, lowering: str = "auto",
             record: Record | None = None, run: _Run | None = None) -> list[Any]:
    """``jax.core.eval_jaxpr``, except that each equation a rewrite of the pass matches
    (``run.pass_``, the last of :data:`PASSES` by default; asked in order) is computed by the
    first that does, and in the widening pass 16-bit arithmetic runs in float32
    (:mod:`widening`). The results are the 16-bit values, or with ``wide_results`` (an inlined
    ``jit``'s, read by the caller's equations) as they are; ``lowering``: the method every
    convolution asks for (``"auto"`` or ``"direct"``); ``record``: filled with each asked
    equation's :class:`rewrites.Decision` (nested jaxprs' included)."""
    run = run or _Run(PASSES[-1], lowering, record)
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    def equation(eqn: Any, invals: list[Any]) -> list[Any]:
        outs = _equation(eqn, invals, run)
        return outs if eqn.primitive.multiple_results else [outs]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    scope = rewrites.Scope(Analysis.of(jaxpr), env, run.lowering, equation)
    for eqn in jaxpr.eqns:
        invals = None  # the operands, read where the equation runs as written (a rewrite may
        # read others: a spread sum reads what an uncomputed pad spreads)
        if run.pass_.widen and widening.targets(eqn):  # each 16-bit operand converted once
            invals = [widening.widened(read(v)) for v in eqn.invars]
            env.update((v, x) for v, x in zip(eqn.invars, invals) if not isinstance(v, Literal))
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with (source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
              eqn.ctx.manager):
            match = _match(eqn, scope, run)
            if match is not None:
                outs = match.rewrite.emit(match, [read(v) for v in match.reads], scope)
            else:
                outs = equation(eqn, invals if invals is not None
                                else [read(v) for v in eqn.invars])
        for var, value in zip(eqn.outvars, outs):
            if isinstance(value, widening.Wide) and var in scope.analysis.product_operands:
                value.product_reads = True
            env[var] = value
    results = [read(v) for v in jaxpr.outvars]
    return results if wide_results else [widening.narrow(v) for v in results]


def _match(eqn: Any, scope: rewrites.Scope, run: _Run) -> rewrites.Match | None:
    """The first rewrite's match of ``eqn``, or None (each asked rewrite's reason recorded)."""
    asked = run.pass_.by_primitive.get(eqn.primitive.name, ())
    reasons: list[tuple[str, str]] = []
    for rewrite in asked:
        found = rewrite.match(eqn, scope)
        if isinstance(found, rewrites.Match):
            if run.record is not None:
                run.record[eqn] = rewrites.Decision(eqn, rewrite.name, found.label,
                                                    tuple(reasons), found.detail)
            return found
        reasons.append((rewrite.name, found))
    if run.record is not None and asked:
        run.record[eqn] = rewrites.Decision(eqn, None, "", tuple(reasons))
    return None


def _bind(eqn: Any, invals: Sequence[Any], params: dict[str, Any] | None = None,
          crop: bool = True) -> Any:
    params = eqn.params if params is None else params
    if crop and eqn.primitive.name == "conv_general_dilated":  # a negative pad: a lax.slice
        lhs, params = lax_refs.crop_operands(invals[0], params)  # (lax_refs)
        invals = [lhs, *invals[1:]]
    bind_params = eqn.primitive.get_bind_params(params)
    return eqn.primitive.bind(*invals, **bind_params)


def _equation(eqn: Any, wide_invals: list[Any], run: _Run) -> Any:
    """``eqn`` as written on ``wide_invals`` (its operands, 16-bit ones maybe
    :class:`widening.Wide`): in the widening pass 16-bit arithmetic in float32 (and the pools
    and spread sums the kernels take, on the float32 values); an inlined ``jit``; a nested
    jaxpr evaluated again where it holds an equation to compute otherwise."""
    name = eqn.primitive.name
    bind = functools.partial(_bind, crop=run.pass_.final)
    if run.pass_.widen:
        outs = widening.run_wide(eqn, wide_invals, bind)
        if outs is not None:
            return outs if eqn.primitive.multiple_results else outs[0]
    subs = _subjaxprs(eqn.params)
    if name in _INLINED and subs and any(_holds_target(s) for s in subs):
        closed = eqn.params[_INLINED[name]]
        return evaluate(closed.jaxpr, closed.consts, wide_invals, wide_results=True, run=run)
    invals = [widening.narrow(v) for v in wide_invals]
    if not subs or not any(_holds_target(s) for s in subs):
        return bind(eqn, invals)
    try:
        params = _rewritten_params(eqn, run)
    except Exception:  # noqa: BLE001 - a body that only traces in its own context runs as it was
        return bind(eqn, invals)
    if params is None:
        return bind(eqn, invals)
    hoisted = params.pop("_hoisted", ())
    return bind(eqn, [*hoisted, *invals], params)


def _retrace(jaxpr: Jaxpr, consts: Sequence[Any], run: _Run) -> tuple[Jaxpr, list[Any]] | None:
    """``jaxpr`` evaluated by :func:`evaluate` and traced again on its own input types: the
    rewritten jaxpr and its constants; None where its output types changed (a nested jaxpr must
    keep its signature)."""
    in_avals = [v.aval for v in jaxpr.invars]
    fn = functools.partial(evaluate, jaxpr, consts, run=run)
    debug = jaxpr.debug_info or api_util.debug_info("accelerate", fn, in_avals, {})
    new, out_avals, new_consts = pe.trace_to_jaxpr_dynamic(
        lu.wrap_init(lambda *a: fn(a), debug_info=debug), in_avals)

    def kind(aval: Any) -> tuple[Any, ...]:
        return (aval.shape, aval.dtype, aval.weak_type)
    if [kind(a) for a in out_avals] != [kind(v.aval) for v in jaxpr.outvars]:
        return None
    return new, list(new_consts)


def _closed(value: ClosedJaxpr, run: _Run) -> ClosedJaxpr | None:
    out = _retrace(value.jaxpr, value.consts, run)
    return None if out is None else ClosedJaxpr(*out)


def _rewritten_params(eqn: Any, run: _Run) -> dict[str, Any] | None:
    """The equation's params with every nested jaxpr rewritten; an open jaxpr's new constants
    become leading inputs (``_hoisted``) where the primitive takes them (``checkpoint``),
    else the equation runs as written (None)."""
    params = dict(eqn.params)
    for key, value in eqn.params.items():
        if isinstance(value, ClosedJaxpr):
            closed = _closed(value, run)
            if closed is None:
                return None
            params[key] = closed
        elif isinstance(value, tuple) and value and all(isinstance(v, ClosedJaxpr) for v in value):
            news = [_closed(v, run) for v in value]
            if any(v is None for v in news):
                return None
            params[key] = tuple(news)
        elif isinstance(value, Jaxpr):
            out = _retrace(value, (), run)
            if out is None:
                return None
            new, consts = out
            if consts and eqn.primitive.name not in ("checkpoint", "remat2"):
                return None
            params[key] = pe.convert_constvars_jaxpr(new) if consts else new
            params["_hoisted"] = consts
    return params


def _is_array(value: Any) -> bool:
    """Whether a leaf is traced (an array or a tracer); any other leaf (a Python number, a
    string, a flag) stays a constant of the trace, as a ``static_argnums`` value would."""
    return isinstance(value, (jax.Array, np.ndarray, np.generic))


def accelerate(fun: F, *, lowering: str = "auto") -> F:
    """Runs every convolution and max pool that ``fun`` computes through jaxconv's kernels.

    A function transformation, like ``jax.grad``: ``jax.jit(jaxconv.accelerate(train_step))``
    compiles ``train_step`` with each ``lax.conv_general_dilated`` equation it traces (the
    model's forward convolutions and, where ``train_step`` calls ``jax.grad``, the data and
    weight gradients autodiff writes for them, in any dimension numbers, groups, strides,
    dilations, pads and floating dtypes) computed by jaxconv's forward, data-gradient and
    weight-gradient kernels, and each ``lax.reduce_window`` max pool (``flax.linen.max_pool``,
    ``equinox.nn.MaxPool2d``) and its gradient by :func:`jaxconv.max_pool`'s; each
    ``lax.reduce_window`` sum (``flax.linen.avg_pool`` and its transpose) runs as the sum of its
    taps (the transpose of a pool whose windows do not overlap: the cotangent repeated over
    each window). Arithmetic on bfloat16 and float16 (element-wise chains, sums, pools: a mixed-precision
    model's BatchNorm, activations and bias gradients) runs in float32 and rounds once, where a
    value leaves it for a convolution, a matrix product or a result (XLA:CPU rounds after every
    operation, and sums in 16 bits). A matrix product that a transpose reads (autodiff's
    gradient of a dense layer's kernel) is computed in the transposed layout; a product of two
    bfloat16 matrices runs on oneDNN's bfloat16 matmul where oneDNN computes bfloat16 natively
    (XLA:CPU computes it in float32), and one of two float32 matrices on oneDNN's sgemm in parts
    on XLA's pool where that timed faster on the machine (a served model's dense layer, which
    XLA:CPU runs on one thread; docs/onednn.md, "Matrix products"). A float32 sum of a
    product by a factor constant along the summed axes (autodiff's gradient of a BatchNorm's
    mean) is the factor times the sum, which XLA then shares with the program's sum of the
    same operand; a sum of an element-wise chain that other equations read too (a BatchNorm's
    statistics of a bfloat16 input) computes the chain again from its sources, which XLA then
    reads without writing the chain in full. The model's code does not change. An equation jaxconv
    has no kernel for runs exactly as before (:func:`jaxconv.explain` lists them, with the
    reason). The values are the unmodified
    function's, within the per-dtype tolerances of docs/precision.md (a max pool's gradient
    goes to the same first maximum; 16-bit results are at least as accurate as written).

    It composes with ``jit``, ``grad``, ``vmap``, ``jax.checkpoint``, sharded ``jit`` and
    ``shard_map`` (inside the mapped function) in any order; ``jax.export`` of an accelerated
    function is as portable as jaxconv's ops (docs/export.md). Like ``jax.jit``, it traces
    ``fun``: array arguments are traced; other arguments (Python numbers, flags, strings) are
    constants of the trace, as ``static_argnums`` makes them. ``flax.nnx`` objects among the
    arguments (a model, an optimizer) may be mutated in place, as under ``nnx.jit``:
    ``nnx.jit(jaxconv.accelerate(train_step))`` updates them. The memory XLA:CPU frees is kept
    where ``import jaxconv`` came before the program's first computation; where it came after,
    the first call warns once with the cost and the fix (docs/training.md, "Host memory"; opt
    out with ``JAXCONV_KEEP_FREED_MEMORY=0``).

    Args:
      fun: the function to accelerate (a training step, a loss, a model's apply).
      lowering: ``"auto"`` (default: each kernel's method chosen per problem and machine,
        Winograd included, docs/lowerings.md), or ``"direct"``: the same without Winograd,
        whose results are not bit-identical to a direct convolution's (docs/precision.md,
        "Winograd"). A static choice: the two are two functions, compiled apart.

    Returns:
      A function with ``fun``'s signature and values.

    Raises:
      TypeError: ``fun`` is not callable.
      ValueError: ``lowering`` is neither ``"auto"`` nor ``"direct"``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxconv
      >>> from jax import lax
      >>> def loss(w, x):
      ...     y = lax.conv_general_dilated(x, w, (2, 2), "SAME",
      ...                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))
      ...     return (y ** 2).sum()
      >>> x, w = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4)) / 27
      >>> g = jax.jit(jaxconv.accelerate(jax.grad(loss)))(w, x)
      >>> bool(jnp.allclose(g, jax.grad(loss)(w, x), rtol=1e-5))
      True
    """
    if not callable(fun):
        raise TypeError(f"accelerate: fun must be callable, got {type(fun).__name__}")
    if lowering not in ("auto", "direct"):
        raise ValueError(f"accelerate: lowering must be 'auto' or 'direct', got {lowering!r}")
    chooser.keep_freed_memory()  # kept at the import already, or the late import's warning

    def accelerated(*args: Any, **kwargs: Any) -> Any:
        kinds = _nnx_kinds()
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs),
                                                  is_leaf=lambda v: isinstance(v, kinds))
        objects = [i for i, v in enumerate(leaves) if isinstance(v, kinds)]
        if not objects:
            return _call(lambda a, k: fun(*a, **k), (args, kwargs), lowering)
        # flax.nnx objects are mutated in place: their state goes in as arrays, the state the
        # call leaves them in comes out and is written back into them (as nnx.jit does)
        nnx = sys.modules["flax.nnx"]
        graphdef, state = nnx.split([leaves[i] for i in objects])
        others = [None if i in objects else v for i, v in enumerate(leaves)]

        def call(state: Any, others: Any) -> Any:
            merged = nnx.merge(graphdef, state)
            full = list(others)
            for i, obj in zip(objects, merged):
                full[i] = obj
            a, k = jax.tree_util.tree_unflatten(tree, full)
            return fun(*a, **k), nnx.split(merged)[1]

        out, new_state = _call(call, (state, others), lowering)
        nnx.update([leaves[i] for i in objects], new_state)
        return out

    _named_like(accelerated, fun)
    return accelerated  # type: ignore[return-value]


def _named_like(wrapper: Callable[..., Any], fun: Callable[..., Any]) -> None:
    """``fun``'s name, docstring and signature on ``wrapper`` (what ``jax.jit`` reads for
    ``static_argnames``), without ``__wrapped__``: equinox takes a callable holding one for a
    JAX transformation stored in a module, and warns."""
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        if hasattr(fun, name):
            setattr(wrapper, name, getattr(fun, name))
    try:
        wrapper.__signature__ = inspect.signature(fun)  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # a callable without one: (*args, **kwargs)
        pass


def _call(fun: Callable[..., Any], inputs: tuple[Any, Any], lowering: str) -> Any:
    """``fun(*inputs)`` traced and evaluated by :func:`evaluate`: array leaves are traced, the
    others are constants of the trace; so are the result's leaves that are not arrays (an
    equinox model's activation function, returned with the updated model), as under
    ``eqx.filter_jit``."""
    leaves, tree = jax.tree_util.tree_flatten(inputs)
    traced = [i for i, v in enumerate(leaves) if _is_array(v)]
    result: dict[str, Any] = {}

    def flat(*values: Any) -> list[Any]:
        full = list(leaves)
        for i, v in zip(traced, values):
            full[i] = v
        out_leaves, result["tree"] = jax.tree_util.tree_flatten(
            fun(*jax.tree_util.tree_unflatten(tree, full)))
        result["leaves"] = out_leaves
        result["arrays"] = [i for i, v in enumerate(out_leaves)
                            if isinstance(v, jax.core.Tracer) or _is_array(v)]
        return [out_leaves[i] for i in result["arrays"]]

    written = jax.make_jaxpr(flat)(*(leaves[i] for i in traced))
    closed = passes(written, lowering)

    def ours(*values: Any) -> list[Any]:
        return evaluate(closed.jaxpr, closed.consts, values, lowering=lowering)
    def ours_direct(*values: Any) -> list[Any]:  # without Winograd (lowering="direct")
        direct = passes(written, "direct")
        return evaluate(direct.jaxpr, direct.consts, values, lowering="direct")
    # the program as written where it times faster whole (a small CNN that XLA fuses whole),
    # or without Winograd (a kernel timed alone misses what it costs the calls after it:
    # chooser.whole_program); a program timed whole runs as traced for its timing
    chosen = chooser.whole_program(written, ours, ours_direct if lowering == "auto" else None)
    args = [leaves[i] for i in traced]
    outs = ours(*args) if chosen is None else jax.core.eval_jaxpr(chosen.jaxpr, chosen.consts,
                                                                   *args)
    full = list(result["leaves"])
    for i, v in zip(result["arrays"], outs):
        full[i] = v
    return jax.tree_util.tree_unflatten(result["tree"], full)


def _nnx_kinds() -> tuple[type, ...]:
    """The classes of ``flax.nnx``'s mutable objects (modules, optimizers, variables) where
    flax.nnx is imported, else none (flax is not imported for this)."""
    nnx = sys.modules.get("flax.nnx")
    return tuple(getattr(nnx, name) for name in ("Pytree", "Object", "Variable")
                 if nnx is not None and hasattr(nnx, name))
