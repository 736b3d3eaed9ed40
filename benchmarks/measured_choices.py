"""Do timed choices give every process the same step, and never a slower one than the rules?

One accelerated training step (``jax.jit(jaxconv.accelerate(step))``, ``keep_freed_memory()``
first: ``jaxconv._src.bench.model_steps``) timed alone in fresh processes of three kinds, in
turn so that a VM's slow phase hits each alike:

* ``rule``: ``JAXCONV_MEASURE=0``, nothing timed: the tables' methods and the caller's layouts;
* ``empty``: timing on, this machine's cache of timed choices removed first (every choice
  timed by this process: ``lowering/measured.py``, the handler's layout trial);
* ``warm``: timing on, the cache the previous process left (no timing at all where it holds
  every choice).

Each process reports its step's median, every timed choice (the rule's method, the verdict,
each candidate's time and noise, the lead and the lead needed) and the handler's layout
choices with their sources. The JSON holds them all and, per kind, the median of the
process medians and the spread (the slowest process's median over the fastest); the report
says which choices differ from the rule's and which differ between processes:

    python -m benchmarks.measured_choices --model mobilenet_v2 --batch 32 --processes 8 \
        --out choices.json
    python -m benchmarks.measured_choices --report JSON [JSON ...]  (the markdown tables; a
        JSON may hold a list of results)

``--ab`` instead compiles both steps in one process, the timed one first, and times them
interleaved (``--processes`` such processes): the timed step over the rules' one without the
processes' spread between them.

It removes this machine's cache of timed choices (``jaxconv tune --clear`` does the same).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
from typing import Any

KINDS = ("rule", "empty", "warm")


def _training_loop(model: str, batch: int, dtype: str) -> Any:
    """The accelerated training step of ``model`` as a zero-argument loop carrying its state
    (``model_steps._training_loop``), compiled and run twice (each oneDNN call's first call
    made)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxconv._src.bench import model_steps, models

    spec = models.MODELS[model]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, spec.image, spec.image, spec.channels)).astype(np.float32)
    labels = rng.integers(0, spec.classes, batch).astype(np.int32)
    variables = models.init(model, jnp.asarray(x), True)
    params, stats = variables["params"], variables.get("batch_stats", {})
    net = models.build(model, jax.lax.conv_general_dilated, True,
                       dtype=jnp.bfloat16 if dtype == "bfloat16" else None)
    step, tx = model_steps._jax_step(net, True, donate=True, accelerate=True)
    run = model_steps._training_loop(step, params, stats, tx.init(params), jnp.asarray(x),
                                     jnp.asarray(labels))
    for _ in range(2):
        jax.block_until_ready(run())
    return run


def child(model: str, batch: int, dtype: str, reps: int) -> dict[str, Any]:
    """One process's step (this process is the child)."""
    import jaxconv
    jaxconv.keep_freed_memory()
    import jax

    from jaxconv._src.bench.timing import interleaved
    from jaxconv._src.lowering import measured
    from jaxconv._src.native import library

    run = _training_loop(model, batch, dtype)
    measured.save_layouts()
    times = interleaved({"step": lambda: jax.block_until_ready(run())}, reps)["step"]
    layouts = library.choices()
    return {"median_ms": statistics.median(times) * 1e3,
            "samples_ms": [t * 1e3 for t in times],
            "onednn": library.status().line(),
            "decisions": [vars(d) for d in measured.decisions()],
            "layouts": [{"kernel": c["kernel"], "x": list(c["x"]), "w": list(c["w"]),
                         "threading": c["threading"], "source": c["source"],
                         "kept": f"{c['candidates'][0]['layout']} {c['candidates'][0]['impl']}",
                         "candidates": c["candidates"]} for c in layouts]}


def child_ab(model: str, batch: int, dtype: str, reps: int) -> dict[str, Any]:
    """The rules' step and the timed one compiled in one process and timed interleaved (this
    process is the child; the cache of timed choices is not read nor written). The timed
    program is compiled and run first, each oneDNN primitive's first call running the layout
    trial; before each sample of either program the handler's primitives are dropped and made
    again, from the trials' verdicts for the timed program and on the caller's layouts for the
    rules' one (``library.forget``, ``remember``, ``set_trial``), so that the two differ in
    both their methods and their layouts."""
    import jaxconv
    jaxconv.keep_freed_memory()
    import jax
    import numpy as np

    from jaxconv._src.bench.timing import _time_n, settle
    from jaxconv._src.lowering import measured
    from jaxconv._src.native import library

    measured._disk()["methods"].clear()  # time every choice now, store nothing
    measured._disk()["layouts"].clear()
    measured._write = lambda: None  # type: ignore[assignment]
    runs = {}
    for kind, on in (("timed", True), ("rule", False)):
        measured.enabled = lambda on=on: on  # type: ignore[assignment]
        library.set_trial(on)
        runs[kind] = _training_loop(model, batch, dtype)
    chosen = [c for c in library.choices() if c["source"] == "trial"]
    verdicts = {c["key"]: (c["candidates"][0]["layout"], c["candidates"][0]["impl"])
                for c in chosen}

    def use(kind: str) -> None:  # the kind's primitives, made afresh
        library.forget()
        if kind == "timed":
            library.remember(verdicts)
        library.set_trial(kind == "timed")
        for _ in range(2):
            jax.block_until_ready(runs[kind]())

    times: dict[str, list[float]] = {"timed": [], "rule": []}
    order = np.random.default_rng(1)
    for _ in range(reps):
        for kind in order.permutation(list(times)):
            use(kind)
            settle(runs[kind], 2)
            times[kind].append(_time_n(runs[kind], 2) / 2)
    use("timed")  # the primitives the timed step runs: its trials' verdicts, remembered
    used = [c for c in library.choices() if c["source"] == "cache"]
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    decisions = [vars(d) for d in measured.decisions()]
    return {"median_ms": med, "samples_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
            "timed_over_rule": med["timed"] / med["rule"],
            "round_ratios": [a / b for a, b in zip(times["timed"], times["rule"])],
            "onednn": library.status().line(), "decisions": decisions,
            "methods_not_the_rule": [f"{d['kernel']} {d['problem']}: {d['verdict']} over "
                                     f"{d['rule']} ({d['lead']:+.0%}, needed {d['need']:.0%})"
                                     for d in decisions if d["verdict"] != d["rule"]],
            "layouts_not_the_callers": [
                f"{c['kernel']} x{list(c['x'])} w{list(c['w'])}: {c['candidates'][0]['layout']} "
                f"{c['candidates'][0]['impl']}" for c in used
                if c["candidates"][0]["layout"] != "caller"]}


def _methods_cell(procs: list[dict[str, Any]]) -> str:
    """The methods the timed step ran instead of the rule's: how many, and per verdict over
    rule the range of the leads and of the leads needed."""
    taken: dict[str, list[tuple[float, float]]] = {}
    names = set()
    for p in procs:
        for d in p["decisions"]:
            if d["verdict"] != d["rule"]:
                names.add(f"{d['kernel']} {d['problem']}")
                taken.setdefault(f"{d['verdict']} over {d['rule']}", []).append(
                    (d["lead"], d["need"]))
    if not taken:
        return "0"
    parts = [f"{k}: leads {min(a for a, _ in v):.0%}-{max(a for a, _ in v):.0%}, needed "
             f"{min(b for _, b in v):.0%}-{max(b for _, b in v):.0%}" for k, v in taken.items()]
    return f"{len(names)} ({'; '.join(parts)})"


def _layouts_cell(procs: list[dict[str, Any]]) -> str:
    """The oneDNN primitives the timed step ran on other layouts than the caller's: how many,
    by layout and kind of kernel."""
    found = {m for p in procs for m in p["layouts_not_the_callers"]}
    if not found:
        return "0"
    kinds: dict[str, int] = {}
    for m in found:
        kernel, layout = m.split(" ", 1)[0], m.split(": ", 1)[1].split(" ", 1)[0]
        kinds[f"{layout} {kernel}"] = kinds.get(f"{layout} {kernel}", 0) + 1
    return f"{len(found)} ({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))})"


def ab_table(results: list[dict[str, Any]]) -> str:
    """The table of ``--ab`` runs (CHANGELOG.md, "Earlier measurements"): per model, batch and dtype, the timed
    step over the rules' one in each process (interleaved), and what differed."""
    lines = ["| model (batch), dtype | rules' step, ms | timed / rules (each process) | "
             "methods not the rule's | layouts not the caller's |", "|---|---|---|---|---|"]
    for res in results:
        procs = res["processes"]
        ratios = [p["timed_over_rule"] for p in procs]
        rule = statistics.median(p["median_ms"]["rule"] for p in procs)
        lines.append(f"| {res['model']} ({res['batch']}), {res['dtype']} | {rule:.0f} | "
                     f"{statistics.median(ratios):.3f} "
                     f"({', '.join(f'{r:.3f}' for r in ratios)}) | {_methods_cell(procs)} | "
                     f"{_layouts_cell(procs)} |")
    return "\n".join(lines)


def _process(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, JAXCONV_MEASURE="0" if kind == "rule" else "1")
    if kind == "empty":
        subprocess.run([sys.executable, "-m", "jaxconv", "tune", "--clear"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run([sys.executable, "-m", "benchmarks.measured_choices", "--child",
                          "--model", args.model, "--batch", str(args.batch), "--dtype",
                          args.dtype, "--reps", str(args.reps)],
                         env=env, check=True, capture_output=True, text=True)
    return {"kind": kind, **json.loads(out.stdout.strip().splitlines()[-1])}


def _order(processes: int, rule_processes: int) -> list[str]:
    """The kinds in turn: empty, rule, warm, rule, ... (half of ``processes`` each of empty
    and warm, each warm after an empty or a warm one), the rest of the rule ones last."""
    measured = ["empty" if i % 2 == 0 else "warm" for i in range(processes)]
    out: list[str] = []
    rules = rule_processes
    for kind in measured:
        out.append(kind)
        if rules:
            out.append("rule")
            rules -= 1
    return out + ["rule"] * rules


def summary(procs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind the median of the process medians and the spread; the choices that differ
    from the rule's, and those that differ between the timing processes."""
    out: dict[str, Any] = {}
    for kind in (*KINDS, "timed"):
        ms = [p["median_ms"] for p in procs
              if p["kind"] == kind or (kind == "timed" and p["kind"] != "rule")]
        if ms:
            out[kind] = {"processes": len(ms), "median_ms": statistics.median(ms),
                         "spread": max(ms) / min(ms), "each_ms": ms}
    if "rule" in out and "timed" in out:
        out["timed_over_rule"] = out["timed"]["median_ms"] / out["rule"]["median_ms"]
    verdicts: dict[str, set[str]] = {}
    taken: dict[str, str] = {}
    for p in procs:
        for d in p["decisions"]:
            name = f"{d['kernel']} {d['problem']} {d['dtype']}"
            verdicts.setdefault(name, set()).add(d["verdict"])
            if d["verdict"] != d["rule"]:
                taken[name] = f"{d['verdict']} over {d['rule']} ({d['lead']:+.0%}, " \
                              f"needed {d['need']:.0%})"
    layouts: dict[str, set[str]] = {}
    for p in procs:
        if p["kind"] == "rule":
            continue
        for c in p["layouts"]:
            layouts.setdefault(f"{c['kernel']} x{c['x']} w{c['w']} {c['threading']}",
                               set()).add(c["kept"])
    out["methods_not_the_rule"] = taken
    out["methods_that_moved"] = {k: sorted(v) for k, v in verdicts.items() if len(v) > 1}
    out["layouts_not_the_callers"] = sorted(
        {f"{k}: {v}" for k, vs in layouts.items() for v in vs if not v.startswith("caller")})
    out["layouts_that_moved"] = {k: sorted(v) for k, v in layouts.items() if len(v) > 1}
    return out


def table(results: list[dict[str, Any]]) -> str:
    """The table (CHANGELOG.md, "Earlier measurements"): per model, batch and dtype, the rule's and the timed
    processes' medians and spreads, the timed over the rule, and the choices that moved."""
    lines = ["| model (batch), dtype | rule: ms (spread, processes) | timed, empty cache | "
             "timed, warm cache | timed / rule | choices not the rule's; moved between "
             "processes |", "|---|---|---|---|---|---|"]
    for res in results:
        s = res["summary"]

        def cell(kind: str) -> str:
            k = s.get(kind)
            return "-" if k is None else \
                f"{k['median_ms']:.0f} ({k['spread']:.2f}, {k['processes']})"

        moved = len(s["methods_that_moved"]) + len(s["layouts_that_moved"])
        lines.append(f"| {res['model']} ({res['batch']}), {res['dtype']} | {cell('rule')} | "
                     f"{cell('empty')} | {cell('warm')} | {s.get('timed_over_rule', 0):.3f} | "
                     f"{len(s['methods_not_the_rule'])} methods, "
                     f"{len(s['layouts_not_the_callers'])} layouts; {moved} moved |")
    return "\n".join(lines)


def _ab(args: argparse.Namespace, argv: list[str] | None) -> int:
    procs = []
    for i in range(args.processes):
        out = subprocess.run([sys.executable, "-m", "benchmarks.measured_choices", "--child",
                              "--ab", "--model", args.model, "--batch", str(args.batch),
                              "--dtype", args.dtype, "--reps", str(args.reps)],
                             env=dict(os.environ, JAXCONV_MEASURE="1"), check=True,
                             capture_output=True, text=True)
        procs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{i + 1}: timed / rule {procs[-1]['timed_over_rule']:.3f}", file=sys.stderr,
              flush=True)
    from jaxconv._src.bench import machine
    result = {"command": "python -m benchmarks.measured_choices " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "kind": "ab", "model": args.model, "batch": args.batch, "dtype": args.dtype,
              "machine": machine.describe(), "onednn": procs[0]["onednn"], "processes": procs}
    out_path = pathlib.Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(ab_table([result]))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--processes", type=int, default=8,
                    help="timing processes (half with an empty cache, half with a warm one)")
    ap.add_argument("--rule-processes", type=int, default=None,
                    help="processes with JAXCONV_MEASURE=0 (default: as many)")
    ap.add_argument("--reps", type=int, default=8, help="timed samples of the step a process")
    ap.add_argument("--out", default="benchmarks/results/measured_choices.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ab", action="store_true",
                    help="instead: the rules' step and the timed one in one process, "
                         "interleaved (--processes such processes)")
    ap.add_argument("--report", nargs="+", metavar="JSON")
    args = ap.parse_args(argv)
    if args.report:
        results = []
        for path in args.report:  # a result, or a list of them (several runs in one file)
            loaded = json.loads(pathlib.Path(path).read_text())
            results.extend(loaded if isinstance(loaded, list) else [loaded])
        ab = [r for r in results if r.get("kind") == "ab"]
        if len(ab) < len(results):
            print(table([r for r in results if r.get("kind") != "ab"]))
        if ab:
            print(ab_table(ab))
        return 0
    if args.child:
        run = child_ab if args.ab else child
        print(json.dumps(run(args.model, args.batch, args.dtype, args.reps)))
        return 0
    if args.ab:
        return _ab(args, argv)
    rules = args.processes if args.rule_processes is None else args.rule_processes
    procs = []
    for i, kind in enumerate(_order(args.processes, rules)):
        procs.append(_process(kind, args))
        print(f"{i + 1}: {kind} {procs[-1]['median_ms']:.0f} ms", file=sys.stderr, flush=True)
    from jaxconv._src.bench import machine
    result = {"command": "python -m benchmarks.measured_choices " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "model": args.model, "batch": args.batch, "dtype": args.dtype,
              "machine": machine.describe(), "onednn": procs[0]["onednn"],
              "summary": summary(procs), "processes": procs}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(table([result]))
    print(json.dumps({k: v for k, v in result["summary"].items()
                      if k not in KINDS and k != "timed"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
