"""``jaxconv.explain``: what a function's compiled program does with its convolutions and pools.

The function is traced (``jax.make_jaxpr``, nested jaxprs included) and each equation that
is a convolution or a max pool becomes a row: jaxconv's kernels with their problem and the
lowering ``"auto"`` picks on this backend, lax's with the kernel ``accelerate`` would run
or the reason it would not. Notes name what is known to be slow on this backend and the
change that removes it. With ``measure=True`` the step is timed, and so is each distinct
convolution and pool alone, on the arguments' shapes: the step's time split into
convolutions, pools and the rest.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import partial_eval as pe

from jaxconv._src import host_faults, host_memory, lowering, pooling
from jaxconv._src.accelerate import rewrites, transform
from jaxconv._src.lowering import fused, measured

#: arguments from this size on (bytes) are "a large state" whose donation matters
LARGE_STATE_BYTES = 1 << 24

_POOLS = {"jaxconv_max_pool_argmax": "max pool and argmax",
          "jaxconv_max_pool_gather": "max pool tangent", "jaxconv_max_pool_scatter":
          "max pool gradient", "reduce_window_max": "max pool",
          "select_and_scatter_add": "max pool gradient", "select_and_gather_add":
          "max pool tangent"}


@dataclasses.dataclass
class Row:
    """One distinct convolution or pool of the program, and how many times it runs."""

    op: str  #: "convolution" or "pool"
    kernel: str  #: "forward", "data", "weight", "max pool", "max pool gradient", ...
    by: str  #: "jaxconv" or "lax"
    shapes: str  #: operands -> result
    lowering: str  #: the method, or lax's reason
    count: int = 1
    #: where the method came from: "rule" (the backend's table), "measured" (timed in this
    #: process) or "cache" (an earlier process's timing), with the lead of the fastest
    #: challenger over the rule's method and the lead it needed (``lowering/measured.py``)
    chosen: str = ""
    threading: str = ""
    #: the oneDNN primitive's activation layouts and where they came from ("trial", "cache",
    #: "rule", "alone": ``library.choices``), as the handler's first call chose them
    layout: str = ""
    ms: float | None = None  #: one run alone (``measure=True``)
    #: the equation as JAX binds it (to time it alone)
    _bind: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    _avals: tuple[Any, ...] = dataclasses.field(default=(), repr=False)
    #: the operands as the equation reads them, from random ones of ``_avals`` (a filter packed
    #: as the program's is, an operand more)
    _prepare: Callable[[list[Any]], list[Any]] | None = dataclasses.field(default=None,
                                                                          repr=False)


@dataclasses.dataclass
class Explanation:
    """What :func:`explain` found: its rows, its notes and (``measure=True``) the step's split."""

    backend: str
    rows: list[Row]
    notes: list[str]
    #: ``step``, ``convolutions``, ``pools``, ``rest`` in ms and, on the CPU, ``faults`` (the
    #: step's minor page faults a call) (``measure=True``), else empty
    timing: dict[str, float] = dataclasses.field(default_factory=dict)
    #: what :func:`jaxconv.accelerate`'s rewrites make of the program's lax equations, each
    #: asked equation's decision in program order (nested jaxprs' included): the matches and
    #: reasons of the transformation itself, which evaluated the program to say so
    decisions: list[rewrites.Decision] = dataclasses.field(default_factory=list)

    def rewrites(self) -> list[tuple[str, int, dict[str, int]]]:
        """Per rewrite asked (in ``rewrites.REWRITES``' order): its name, the equations it
        matched, and how many it declined for each reason (``rewrites.REASONS``' text)."""
        out = []
        for r in rewrites.REWRITES:
            matched = sum(d.matched == r.name for d in self.decisions)
            why: dict[str, int] = {}
            for d in self.decisions:
                for name, key in d.reasons:
                    if name == r.name and key not in rewrites.STRUCTURAL:
                        why[rewrites.REASONS[key]] = why.get(rewrites.REASONS[key], 0) + 1
            if matched or why:
                out.append((r.name, matched, why))
        return out

    def __str__(self) -> str:
        head = ("op", "kernel", "by", "shapes", "lowering", "chosen", "n", "threading",
                "layout", "ms")
        cells = [head] + [(r.op, r.kernel, r.by, r.shapes, r.lowering, r.chosen, str(r.count),
                           r.threading, r.layout, "" if r.ms is None else f"{r.ms:.3f}")
                          for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
        lines = [f"jaxconv.explain ({self.backend}): {len(self.rows)} distinct convolutions "
                 f"and pools"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
        if self.timing:
            t = self.timing
            faults = f" ({t['faults']:,.0f} minor page faults a call)" if "faults" in t else ""
            lines.append(f"step {t['step']:.2f} ms{faults}: convolutions {t['convolutions']:.2f}, "
                         f"pools {t['pools']:.2f}, rest {t['rest']:.2f} (each convolution and "
                         f"pool timed alone; XLA runs independent operations of a step "
                         f"concurrently, so the parts may add up to more than the step)")
        for name, matched, why in self.rewrites():
            declined = "".join(f"; declined {n}: {w}" for w, n in why.items())
            lines.append(f"rewrite {name}: {matched} matched{declined}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html
        return "<pre>" + html.escape(str(self)) + "</pre>"


def _live(jaxpr: Any) -> Any:
    """``jaxpr`` without the equations whose results nothing reads, which XLA drops (an
    accelerated chain's convolution, which its fused call computes)."""
    try:
        live, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)
    except Exception:  # noqa: BLE001 - a primitive without a rule: the program as traced
        return jaxpr
    return live


def _walk(jaxpr: Any) -> list[Any]:
    """Every equation, nested ones included."""
    eqns = []
    for eqn in jaxpr.eqns:
        eqns.append(eqn)
        for sub in transform._subjaxprs(eqn.params):
            eqns.extend(_walk(sub))
    return eqns


def _fmt(*avals: Any) -> str:
    return " x ".join(f"{a.dtype}{list(a.shape)}" for a in avals)


def _conv_row(eqn: Any, backend: str, decision: rewrites.Decision | None,
              chain: str = "") -> Row:
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    out = eqn.outvars[0].aval
    shapes = f"{_fmt(lhs, rhs)} -> {list(out.shape)}"
    if eqn.primitive.name == fused.fused_p.name:  # a fused chain's or a packed filter's kernel
        params = eqn.params
        planned = lowering.plan(params["kernel"], params["p"], method=params["method"],
                                backend=backend, dtype=lhs.dtype, precision=params["precision"],
                                preferred_element_type=params["preferred_element_type"],
                                packed=params["constant"])
        packed = "; its filter packed" if params["packed"] == planned.method else ""
        plain = {**params, "post": (), "packed": ""}  # measured alone: the convolution

        def alone(x: Any, w: Any, *filt: Any) -> Any:  # filt: w packed, as the program's is
            return fused.fused_p.bind(  # type: ignore[no-untyped-call]
                x, w, *filt, **{**plain, "packed": params["packed"] if filt else ""})

        def prepare(operands: list[Any]) -> list[Any]:
            x, w = operands
            got, _ = fused.pack(np.asarray(w), params["p"], params["packed"], params["kernel"])
            return [x, w] if got is None else [x, w, jax.device_put(got, jax.devices("cpu")[0])]
        return Row("convolution", str(params["kernel"]), "jaxconv", shapes, planned.method,
                   chosen=planned.why + packed, _bind=alone, _avals=(lhs, rhs),
                   _prepare=prepare if packed else None)
    if eqn.primitive.name == "jaxconv_conv":
        kernel, p = eqn.params["kernel"], eqn.params["p"]
        planned = lowering.plan(kernel, p, method=eqn.params["method"], backend=backend,
                                dtype=lhs.dtype if lhs.dtype == rhs.dtype else None,
                                precision=eqn.params["precision"],
                                preferred_element_type=eqn.params["preferred_element_type"])
        return Row("convolution", str(kernel), "jaxconv", shapes, planned.method,
                   chosen=planned.why,
                   _bind=_binder(eqn), _avals=(lhs, rhs))
    if decision is None:  # accelerate's evaluation did not reach it (Explanation.notes)
        return Row("convolution", "", "lax", shapes, "not evaluated", _bind=_binder(eqn),
                   _avals=(lhs, rhs))
    matched = decision.matched is not None
    runs = f"accelerate runs {decision.label}" + (f" + {chain}" if chain else "")
    return Row("convolution", str(decision.detail) if matched else "", "lax", shapes,
               runs if matched else decision.why(), _bind=_binder(eqn), _avals=(lhs, rhs))


def _pool_row(eqn: Any) -> Row:
    avals = tuple(v.aval for v in eqn.invars)
    name = eqn.primitive.name
    shapes = f"{_fmt(*avals)} -> {list(eqn.outvars[0].aval.shape)}"
    if name == pooling.argmax_p.name:  # on the handler where timed faster (chooser)
        p = eqn.params["p"]
        why = lowering.max_pool_why_not(avals[0], p, *pooling.contenders(p))
        return Row("pool", _POOLS[name], "jaxconv", shapes,
                   "the handler's one pass" if why is None else f"XLA's passes: {why}",
                   _bind=_binder(eqn), _avals=avals)
    if name.startswith("jaxconv_"):
        return Row("pool", _POOLS[name], "jaxconv", shapes, "gather/scatter",
                   _bind=_binder(eqn), _avals=avals)
    why = "XLA's select_and_scatter" if name == "select_and_scatter_add" else "XLA"
    return Row("pool", _POOLS[name], "lax", shapes, why, _bind=_binder(eqn), _avals=avals)


def _binder(eqn: Any) -> Callable[..., Any]:
    prim, params = eqn.primitive, dict(eqn.params)
    return lambda *a: prim.bind(*a, **params)


def _key(r: Row) -> tuple[Any, ...]:
    return (r.op, r.kernel, r.by, r.shapes, r.lowering)


def _signature(eqn: Any) -> tuple[Any, ...]:
    """What a rewrite's decision on ``eqn`` depends on, beside its context: the passes trace
    the program again, so the kernels pass decides on equations alike, not the same."""
    return (eqn.primitive.name, tuple((v.aval.shape, v.aval.dtype) for v in eqn.invars),
            tuple((v.aval.shape, v.aval.dtype) for v in eqn.outvars), repr(sorted(
                (k, v) for k, v in eqn.params.items())))


def _rows(jaxpr: Any, backend: str, record: transform.Record) -> list[Row]:
    decided: dict[tuple[Any, ...], rewrites.Decision] = {}
    chains: dict[tuple[Any, ...], str] = {}  # a convolution's fused chain, by its signature
    for eqn, decision in record.items():
        decided.setdefault(_signature(eqn), decision)
        if decision.matched == "fused chain":
            chains.setdefault(_signature(decision.detail[0]), decision.label)
    rows: dict[tuple[Any, ...], Row] = {}
    for eqn in _walk(_live(jaxpr)):
        name = eqn.primitive.name
        if name in ("jaxconv_conv", "conv_general_dilated", fused.fused_p.name):
            row = _conv_row(eqn, backend, decided.get(_signature(eqn)),
                            chains.get(_signature(eqn), ""))
        elif name in _POOLS:
            row = _pool_row(eqn)
        else:
            continue
        if _key(row) in rows:
            rows[_key(row)].count += 1
        else:
            rows[_key(row)] = row
    return list(rows.values())


def _donation_note(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Whether a large argument that the step returns again is not donated."""
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    large = sum(int(np.prod(np.shape(v))) * np.dtype(v.dtype).itemsize for v in leaves
                if hasattr(v, "dtype") and transform._is_array(v))
    if large < LARGE_STATE_BYTES:
        return None
    lower = getattr(fn, "lower", None)
    if lower is None:
        return (f"the arguments hold {large / 2**20:.0f} MiB and the function is not jitted: "
                f"jax.jit(fn, donate_argnums=...) over the state it returns updated lets XLA "
                f"update it in place")
    try:
        info = jax.tree_util.tree_leaves(lower(*args, **kwargs).args_info)
    except Exception:  # noqa: BLE001 - a function that does not lower here says nothing
        return None
    if any(getattr(a, "donated", False) for a in info):
        return None
    return (f"no argument is donated ({large / 2**20:.0f} MiB of arguments): "
            f"jax.jit(..., donate_argnums=...) over the state the step returns updated lets "
            f"XLA update it in place")


def _notes(rows: list[Row], backend: str, fn: Any, args: tuple[Any, ...],
           kwargs: dict[str, Any], as_written: bool = False) -> list[str]:
    notes = []
    lax_convs = [r for r in rows if r.op == "convolution" and r.by == "lax"]
    if any(r.kernel for r in lax_convs) and not as_written:
        notes.append(f"{sum(r.count for r in lax_convs if r.kernel)} lax convolutions have a "
                     f"jaxconv kernel: jax.jit(jaxconv.accelerate(fn)) runs them through it")
    if backend == "cpu" and any(r.lowering == "XLA's select_and_scatter" for r in rows):
        notes.append("a max pool's gradient is XLA's select_and_scatter, slow on XLA:CPU "
                     "(ResNet-18's stem pool: docs/training.md): jaxconv.accelerate runs "
                     "jaxconv.max_pool's")
    if backend == "cpu":
        from jaxconv._src.native import library
        if not library.status().available:
            notes.append(library.status().line() + " (docs/onednn.md: pip install "
                         "'jaxconv[onednn]' && jaxconv build-onednn)")
        memory = host_memory.line(backend)
        if memory is not None and host_memory.mode() not in ("kept", "n/a"):
            notes.append(memory)
    donation = _donation_note(fn, args, kwargs)
    if donation is not None:
        notes.append(donation)
    return notes


def _median_ms(call: Callable[[], Any], reps: int) -> float:
    jax.block_until_ready(call())  # type: ignore[no-untyped-call]
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(call())  # type: ignore[no-untyped-call]
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _random(aval: Any, seed: int) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal(aval.shape).astype(np.float32), aval.dtype)


def _measure(rows: list[Row], fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             reps: int) -> tuple[dict[str, float], host_faults.StepFaults | None]:
    """The step's time split (and, on the CPU, its minor page faults a call), and the faults'
    measurement (None off the CPU)."""
    inner = getattr(fn, "__wrapped__", fn) if hasattr(fn, "lower") else fn
    step = jax.jit(inner)  # without donation: the caller's arguments stay valid
    faults = None
    if jax.default_backend() == "cpu":  # the same calls time the step and count its faults
        times: list[float] = []

        def timed() -> None:
            t = time.perf_counter()
            jax.block_until_ready(step(*args, **kwargs))  # type: ignore[no-untyped-call]
            times.append(time.perf_counter() - t)
        faults = host_faults.step_faults(timed, calls=reps, warm=1)
        total = statistics.median(times[1:]) * 1e3
    else:
        total = _median_ms(lambda: step(*args, **kwargs), reps)
    split = {"convolutions": 0.0, "pools": 0.0}
    for i, r in enumerate(rows):
        if r._bind is None:
            continue
        operands = [_random(a, i + k) for k, a in enumerate(r._avals)]
        if r._prepare is not None:  # a packed filter: packed once, before it is timed
            operands = r._prepare(operands)
        if r.kernel in ("max pool gradient", "max pool tangent") and r.by == "jaxconv":
            operands[1] = jnp.zeros(r._avals[1].shape, r._avals[1].dtype)  # an argmax
        one = jax.jit(r._bind)
        r.ms = _median_ms(lambda: one(*operands), reps)
        split["convolutions" if r.op == "convolution" else "pools"] += r.ms * r.count
    _threading(rows)
    rest = max(total - split["convolutions"] - split["pools"], 0.0)
    out = {"step": total, **split, "rest": rest}
    if faults is not None:
        out["faults"] = faults.per_step
    return out, faults


def _threading(rows: list[Row]) -> None:
    """Each oneDNN row's threading and layouts, as the handler's first call chose them."""
    from jaxconv._src.native import library
    chosen = library.choices()
    for r in rows:
        if r.lowering != "onednn":
            continue
        shapes = {tuple(a.shape) for a in r._avals}
        # the handler's buffers may be a cropped or regridded view of the operands: the
        # kernel and one operand's shape identify the call
        for c in chosen:
            if c["kernel"] == r.kernel and shapes & {c["x"], c["y"], c["w"]}:
                r.threading = c["threading"]
                r.layout = f"{c['candidates'][0]['layout']} ({c['source']})"
                break


def explain(fn: Callable[..., Any], *args: Any, measure: bool = False, reps: int = 5,
            **kwargs: Any) -> Explanation:
    """What ``fn``'s compiled program does with its convolutions and max pools.

    Traces ``fn(*args, **kwargs)`` (nothing runs unless ``measure``) and lists each distinct
    convolution and pool once, with how many times it runs: jaxconv's with its kernel and the
    lowering ``"auto"`` picks on this backend (``onednn``, or one of XLA's formulations:
    docs/onednn.md), lax's with the jaxconv kernel :func:`jaxconv.accelerate` would run or why
    it would not; then what each of accelerate's rewrites matched and declined (the
    transformation's own decisions: it evaluates the traced program to say so). The notes name what is known to be slow here and the change that removes
    it: lax convolutions and pools that ``accelerate`` would take, XLA's max-pool gradient,
    the oneDNN extra not built, glibc's allocator defaults, a large state not donated.

    Args:
      fn: a function, jitted or not, accelerated or not (a training step, a loss).
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``; ``measure`` needs arrays).
      measure: also time the step (jitted, without donation) and each distinct convolution and
        pool alone on random operands of its shapes (a filter the program reads packed,
        packed), ``reps`` runs each (medians): the step's
        time split into convolutions, pools and the rest, and each oneDNN call's threading;
        on the CPU also the step's minor page faults a call, with a note saying why where they
        are high (fresh memory each step: docs/training.md, "Host memory").
      reps: the timed runs of each (with ``measure``).
      **kwargs: example keyword arguments.

    Returns:
      An :class:`Explanation`: ``rows``, ``notes`` and ``timing``; printed (or shown in a
      notebook) it is a table.

    Raises:
      TypeError: ``fn`` is not callable.

    Example:
      >>> import jax, jax.numpy as jnp, jaxconv
      >>> from jax import lax
      >>> def f(x, w):
      ...     return lax.conv_general_dilated(x, w, (1, 1), "SAME",
      ...                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
      >>> x, w = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4))
      >>> [(r.kernel, r.by) for r in jaxconv.explain(f, x, w).rows]
      [('forward', 'lax')]
      >>> [(r.kernel, r.by) for r in jaxconv.explain(jaxconv.accelerate(f), x, w).rows]
      [('forward', 'jaxconv')]
    """
    if not callable(fn):
        raise TypeError(f"explain: fn must be callable, got {type(fn).__name__}")
    backend = jax.default_backend()
    with measured.collecting() as seen:
        closed = jax.make_jaxpr(fn)(*args, **kwargs)
    programs = [d for d in seen if d.kernel == "program"]
    record: transform.Record = {}
    kept = {"lax": "the program as written", "direct": "accelerated without Winograd"}
    notes = [f"whole program timed, {d.verdict} kept ({kept.get(d.verdict, 'accelerated')}): "
             f"{d.line()}" for d in programs]
    notes += list(dict.fromkeys(  # once per product, however often the passes asked
        f"float32 product timed, {d.verdict} kept "
        f"({'XLA' if d.verdict == 'xla' else 'oneDNN'}): {d.line()}"
        for d in seen if d.kernel == "product"))
    try:  # accelerate's own passes over the program, traced only: their decisions
        widened = transform.passes(closed, record=record)
        jax.make_jaxpr(lambda *a: transform.evaluate(widened.jaxpr, widened.consts, a,
                                                     record=record))(*closed.in_avals)
    except Exception as e:  # noqa: BLE001 - a program accelerate cannot evaluate says why
        notes.append(f"jaxconv.accelerate cannot evaluate this program: {type(e).__name__}: {e}")
    rows = _rows(closed.jaxpr, backend, record)
    notes += _notes(rows, backend, fn, args, kwargs,
                    as_written=any(d.verdict == "lax" for d in programs))
    timing: dict[str, float] = {}
    if measure:
        timing, faults = _measure(rows, fn, args, kwargs, reps)
        if faults is not None and faults.high:
            notes.append(faults.line())
    return Explanation(backend, rows, notes, timing, list(record.values()))

