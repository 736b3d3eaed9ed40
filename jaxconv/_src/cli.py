"""The ``jaxconv`` command line (also ``python -m jaxconv``).

Commands:
  check    every op against jax.vjp on the current backend, as a table
  shapes   an op's output shape and resolved geometry, computing nothing
  bench    the benchmark runner: jaxconv vs jax.vjp vs PyTorch on benchdnn shapes
           (``bench models``: whole networks' training steps and their layers)
  demo     one filter gradient, explained
  tune     make a script's timed choices now and keep them; show or clear the cache
  build-onednn  compile the oneDNN lowering's handler (after pip install ".[onednn]")

Each exits 0 on success, 1 when a check fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from typing import Any

from jaxconv._src import registry

_EPILOG_SHAPES = """\
arguments are NAME=VALUE pairs named as in the op's signature; an array argument
takes its shape. Values: 1,2,3 (ints), 5 (int), same_upper (string), true/false,
or JSON ({"strides": [1, 1], ...} for the TBE para_dict).

examples:
  jaxconv shapes convolution_backprop_filters input_forward=8,32,32,16 \\
      output_delta=8,16,16,32 filter_shape=3,3,8,32 strides=2,2 auto_pad=same_upper groups=2
  jaxconv shapes group_convolution_backprop_data data=1,20,224,224 filters=4,5,2,3,3 \\
      strides=2,2 pads_begin=1,1 pads_end=1,1
"""


class UsageError(ValueError):
    """A bad command-line argument (exit status 2)."""


def _demo(args: argparse.Namespace) -> int:
    """Computes a filter gradient with jaxconv and checks it against jax.vjp."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    import jaxconv
    from jaxconv._src import lax_refs

    groups = 2
    attrs: dict[str, Any] = dict(strides=(2, 2), dilations=(1, 1), auto_pad="same_upper",
                                 groups=groups, data_format="NXC", filter_format="XIO",
                                 precision=lax.Precision.HIGHEST)
    rng = np.random.default_rng(args.seed)
    x = jnp.asarray(rng.standard_normal((8, 32, 32, 16)), jnp.float32)      # N, H, W, IC
    filter_shape = (3, 3, 16 // groups, 32)                        # KH, KW, IC/g, OC
    y_shape = jax.eval_shape(
        lambda x: jaxconv.convolution(x, jnp.zeros(filter_shape), **attrs), x).shape
    dy = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)

    def grad(x: jax.Array, dy: jax.Array) -> jax.Array:
        return jaxconv.convolution_backprop_filters(x, dy, filter_shape, **attrs)

    dw = jax.jit(grad)(x, dy)

    # The reference: jax.vjp of plain lax.conv_general_dilated ("SAME" is TF's
    # rule, the same as same_upper), independent of jaxconv's geometry.
    def plain(w: jax.Array) -> jax.Array:
        return lax_refs.conv_general_dilated(
            x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=2, precision=lax.Precision.HIGHEST)
    _, vjp = jax.vjp(plain, jnp.zeros(filter_shape))
    (ref,) = vjp(dy)
    err = float(jnp.max(jnp.abs(dw - ref)) / jnp.max(jnp.abs(ref)))
    ok = err < 1e-5
    print("jaxconv demo: ConvolutionBackpropFilters-1 on", jax.default_backend().upper())
    print(f"  input_forward {tuple(x.shape)} NXC, output_delta {tuple(dy.shape)}, "
          f"filter_shape {filter_shape} XIO")
    print("  strides (2, 2), auto_pad same_upper, groups 2")
    print(f"  filter_delta[1, 1, :3, 0] = {np.asarray(dw[1, 1, :3, 0]).round(4).tolist()}")
    print(f"  max |jaxconv - jax.vjp| / max |jax.vjp| = {err:.2e} "
          f"(reference: jax.vjp of lax.conv_general_dilated) -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def _check(args: argparse.Namespace) -> int:
    """Verifies every op against jax.vjp of lax.conv_general_dilated on this backend."""
    import jax

    from jaxconv._src import checks, host_faults, host_memory
    from jaxconv._src.native import library

    print(f"jaxconv check: backend {jax.default_backend()} ({jax.devices()[0].device_kind}), "
          f"float32, Precision.HIGHEST, tolerance {checks.TOLERANCE:.0e} relative")
    print(library.status().line())
    memory = host_memory.line(jax.default_backend())
    if memory:
        print(memory)
        # what a step with a 64 MiB temporary faults per call here, and why where it is high
        print("  probe: " + host_faults.probe().line().removeprefix("host memory: "))
    results = checks.run_checks()
    print(checks.format_table(results))
    failed = [r.op for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


# --------------------------------------------------------------------------- shapes

def _ops() -> dict[str, Any]:
    """The public ops (array in, array out)."""
    import jaxconv
    return {name: getattr(jaxconv, name) for name in registry.ARRAY_OPS}


def _array_params(fn: Any) -> list[str]:
    """The parameters that take arrays: those typed ``ArrayLike`` in the op's signature."""
    return [name for name, prm in inspect.signature(fn).parameters.items()
            if prm.annotation in ("ArrayLike", "jax.typing.ArrayLike")]


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"not valid JSON: {text!r} ({e.msg})") from None
    parts = [p for p in text.split(",") if p != ""]
    try:
        ints = tuple(int(p) for p in parts)
    except ValueError:
        return text
    return ints[0] if len(ints) == 1 and "," not in text else ints


def _shapes(args: argparse.Namespace) -> int:
    """Prints an op's output shape and resolved geometry; computes nothing."""
    import jax
    import jax.numpy as jnp

    from jaxconv._src import lowering
    from jaxconv._src.kernel import Kernel

    ops = _ops()
    if args.op not in ops:
        raise UsageError(f"unknown op {args.op!r}; one of: {', '.join(sorted(ops))}")
    fn = ops[args.op]
    params = inspect.signature(fn).parameters
    arrays = _array_params(fn)
    kwargs: dict[str, Any] = {}
    for item in args.arguments:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UsageError(f"argument {item!r} is not NAME=VALUE")
        if name not in params:
            raise UsageError(f"{args.op} has no argument {name!r}; it takes: {', '.join(params)}")
        kwargs[name] = _value(text)
    missing = [a for a in arrays if a not in kwargs]
    if missing:
        raise UsageError(f"{args.op} needs the shape of {', '.join(missing)} (e.g. {missing[0]}=1,3,8,8)")
    dtype = jnp.dtype(args.dtype)
    structs = []
    for a in arrays:
        shape = kwargs.pop(a)
        shape = (shape,) if isinstance(shape, int) else shape
        if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise UsageError(f"{a} must be a shape like 1,3,8,8, got {shape!r}")
        structs.append(jax.ShapeDtypeStruct(shape, dtype))  # type: ignore[no-untyped-call]
    closed = jax.make_jaxpr(lambda *xs: fn(*xs, **kwargs))(*structs)
    out = closed.out_avals[0]
    print(f"{args.op}: output shape {tuple(out.shape)}, dtype {out.dtype}")
    problems = [e.params["p"] for e in closed.jaxpr.eqns if e.primitive.name == "jaxconv_conv"]
    if not problems:  # conv_general_dilated where jaxconv has no kernel: lax computes it
        print("  no jaxconv kernel: computed by lax.conv_general_dilated itself")
        return 0
    p = problems[-1]  # every op binds one kernel
    transposed = p.filter_swap
    role = "the convolution it transposes" if transposed else "the forward convolution"
    print(f"  geometry ({role}, {p.rank}D, data {p.data.format}, filter {p.filter_layout.format})")
    rows = [("input size", p.input_size), ("output size", p.output_size),
            ("kernel", p.kernel), ("strides", p.strides), ("dilations", p.dilations),
            ("pads_begin", p.pads_begin),
            ("pads_end" + (" (net of output_padding)" if transposed else ""), p.pads_end),
            ("channels in -> out", (p.in_channels, p.out_channels)), ("groups", p.groups)]
    for k, v in rows:
        print(f"    {k:34s} {list(v) if isinstance(v, tuple) else v}")
    kind = registry.ARRAY_OPS[args.op].kernel
    forced = kwargs.get("lowering", "auto")
    for k in Kernel:  # the op's kernel, then the others (under jax.grad)
        name = "forward" if k is Kernel.FORWARD else f"{k} gradient"
        label = f"lowering ({name})" if k == kind else f"under grad ({name})"
        if k == kind and forced != "auto":
            chosen = f"{forced} (forced)"
        else:
            chosen = ", ".join(f"{b}: {lowering.choose(k, p, b)}" for b in lowering.BACKENDS)
        print(f"    {label:34s} {chosen}")
    return 0


# --------------------------------------------------------------------------- bench

def _bench(args: argparse.Namespace) -> int:
    """Times jaxconv's gradient ops against jax.vjp and PyTorch on oneDNN's benchdnn shapes.

    The runner and its shape lists ship with the package; PyTorch and the plots need the
    ``bench`` extra (``pip install jaxconv[bench]``). ``jaxconv bench models`` times whole
    training steps of ResNet-18, ResNet-50 and MobileNetV2 (in flax, which the ``bench`` extra installs)
    against torch.nn, and every layer's convolutions.
    """
    if args.bench_args[:1] == ["models"]:
        from jaxconv._src.bench import model_run
        status: int = model_run.main(args.bench_args[1:])
        return status
    from jaxconv._src.bench import run
    status = run.main(args.bench_args)
    return status


def _build_onednn(args: argparse.Namespace) -> int:
    """Compiles the oneDNN lowering's FFI handler against the oneDNN of the `onednn` extra
    (or --prefix), with XLA's FFI headers from jaxlib, into jaxconv's cache directory."""
    import pathlib

    from jaxconv._src.native import build, library

    try:
        out = build.build(pathlib.Path(args.prefix) if args.prefix else None, verbose=True)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"jaxconv build-onednn: {e}", file=sys.stderr)
        return 1
    print(f"built {out}")
    print(library.status().line())
    return 0 if library.status().available else 1


# --------------------------------------------------------------------------- tune

def _tune(args: argparse.Namespace) -> int:
    """Shows, clears or fills this machine's cache of timed choices (lowering="auto"'s
    methods and the oneDNN handler's layouts: docs/lowerings.md, "Timed choices"). With a
    script, runs it (as `python SCRIPT ARGS...`) with its timed choices made and stored, so
    that later processes on this machine compile the same programs without timing; then
    shows what its programs decided."""
    import runpy

    from jaxconv._src.lowering import measured
    from jaxconv._src.native import library

    if args.clear:
        removed = measured.clear()
        print(f"removed {len(removed)} cache file(s)" +
              "".join(f"\n  {p}" for p in removed))
        return 0
    if args.script:
        if not measured.enabled():
            raise UsageError("JAXCONV_MEASURE=0 times nothing: unset it to tune")
        saved = sys.argv
        sys.argv = [args.script, *args.script_args]
        try:
            runpy.run_path(args.script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                print(f"jaxconv tune: {args.script} exited with {e.code}", file=sys.stderr)
                return 1
        finally:
            sys.argv = saved
        measured.save_layouts()
        for d in measured.decisions():
            print(d.line())
        sources: dict[str, int] = {}
        for c in library.choices():
            sources[c["source"]] = sources.get(c["source"], 0) + 1
        print("oneDNN layouts by source: " +
              (", ".join(f"{k} {v}" for k, v in sorted(sources.items())) or "none"))
    path = measured.cache_path()
    data = measured.cached()
    print(f"cache {path} ({'present' if path.exists() else 'absent'})")
    print("machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items()
                                  if k not in ("timing", "rule")))
    methods = data["methods"].values()
    taken = [r for r in methods if r["verdict"] != r["rule"]]
    print(f"{len(methods)} method verdicts ({len(taken)} not the rule's), "
          f"{len(data['layouts'])} layout verdicts "
          f"({sum(r['layout'] != 'caller' for r in data['layouts'].values())} not the "
          f"caller's layouts)")
    if args.verbose:
        for r in methods:
            print(f"  {r['kernel']} {r['problem']}: {r['verdict']} (rule {r['rule']}, "
                  f"lead {r['lead']:+.0%}, needed {r['need']:.0%})")
        for r in data["layouts"].values():
            print(f"  {r['kernel']} x{r['x']} w{r['w']} {r['threading']}: {r['layout']} "
                  f"{r['impl']}")
    return 0


# --------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxconv", description="Differentiable convolution-gradient operators for JAX.",
        epilog="`jaxconv COMMAND --help` describes each command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = sub.add_parser("check", help="verify every op against jax.vjp on this backend",
                           description=_check.__doc__)
    check.set_defaults(func=_check)

    shapes = sub.add_parser("shapes", help="output shape and resolved pads of an op, no compute",
                            description=_shapes.__doc__, epilog=_EPILOG_SHAPES,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    shapes.add_argument("op", help="a jaxconv op, e.g. convolution_backprop_filters")
    shapes.add_argument("arguments", nargs="*", metavar="NAME=VALUE",
                        help="the op's arguments (arrays by their shape)")
    shapes.add_argument("--dtype", default="float32", help="dtype of the arrays (default float32)")
    shapes.set_defaults(func=_shapes)

    bench = sub.add_parser(
        "bench", help="time the gradient ops against jax.vjp and PyTorch (benchdnn shapes)",
        description=(_bench.__doc__ or "") + " Every argument after `bench` goes to the "
        "runner; `jaxconv bench -- --help` lists them (presets: smoke, quick, full); "
        "`jaxconv bench models --help` the whole-model benchmark's.",
        epilog="examples: jaxconv bench --preset quick; jaxconv bench models --no-batchnorm")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER,
                       help="the runner's arguments (default: --preset quick)")
    bench.set_defaults(func=_bench)

    demo = sub.add_parser("demo", help="compute a filter gradient and check it against jax.vjp",
                          description=_demo.__doc__)
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)

    tune = sub.add_parser("tune", help="make a script's timed choices now; show or clear them",
                          description=_tune.__doc__,
                          epilog="examples: jaxconv tune examples/flax_linen_resnet.py --epochs 1; "
                                 "jaxconv tune --verbose; jaxconv tune --clear")
    tune.add_argument("--clear", action="store_true",
                      help="remove every machine's cache of timed choices")
    tune.add_argument("--verbose", "-v", action="store_true", help="list every cached verdict")
    tune.add_argument("script", nargs="?", help="a Python script to run with its choices timed")
    tune.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    tune.set_defaults(func=_tune)

    onednn = sub.add_parser("build-onednn", help="compile the oneDNN lowering (CPU)",
                            description=_build_onednn.__doc__)
    onednn.add_argument("--prefix", help="where oneDNN's include/ and lib/ are (default: this "
                        "environment's, where the onednn extra installs them)")
    onednn.set_defaults(func=_build_onednn)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv[:1] == ["bench"] and argv[1:2] not in (["-h"], ["--help"]):
        # Everything after `bench` belongs to the runner (argparse.REMAINDER cannot take
        # a first argument that looks like an option).
        rest = argv[1:]
        return _bench(argparse.Namespace(bench_args=rest[1:] if rest[:1] == ["--"] else rest))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = args.func(args)
        return status
    except UsageError as e:
        print(f"jaxconv {args.command}: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as e:  # the op's own validation error, already explicit
        if args.command != "shapes":
            raise
        print(f"jaxconv shapes: {e}", file=sys.stderr)
        return 2
