"""The train-step blocks of ``benchmarks/train_step.py`` data-parallel on a mesh of host devices.

jaxconv's step (``jax.jit`` of value_and_grad + SGD) on one device against the same jitted step
with the batch sharded over N simulated CPU devices (``--xla_force_host_platform_device_count``,
the same cores) and the parameters replicated: XLA's SPMD partitioner splits the program, and
each oneDNN call runs on its device's slice of the batch (``jaxconv/_src/lowering/spmd.py``), the
weight gradients then one all-reduce each. Timed interleaved in one process (medians); the two
steps must agree. ``mesh_over_one`` is the mesh step's time over the one-device step's (the
goal: <= 1.1); ``onednn_calls`` and ``all_gathers`` are counted in the mesh's compiled program.

usage: python -m benchmarks.train_step_mesh [--devices 2] [--reps 5] [--blocks ...]
                                            [--out benchmarks/results/train_step_mesh.json]
"""

from __future__ import annotations

import argparse
import os
import sys


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train_step_mesh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--blocks", nargs="+", default=None, help="default: every block")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/train_step_mesh.json")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if "jax" in sys.modules:
        raise SystemExit("train_step_mesh: run it as its own process (the device count is set "
                         "before JAX starts)")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import json
    import pathlib
    import statistics

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxconv
    from benchmarks.train_step import BLOCKS, CONTENDERS, RESULTS, _init, make_step
    from jaxconv._src.bench.run import cpu_model
    from jaxconv._src.bench.timing import _time_n, interleaved

    jaxconv.keep_freed_memory()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    one, batch, repl = jax.devices()[0], NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    rows = []
    for name in args.blocks or list(BLOCKS):
        desc, shapes, x_shape, fwd = BLOCKS[name](args.batch)
        rng = np.random.default_rng(0)
        params = _init(rng, shapes)
        x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
        target = jnp.asarray(rng.standard_normal(jax.eval_shape(
            lambda p, x: fwd(*CONTENDERS["lax"][:2], p, x), params, x).shape), jnp.float32)
        step = make_step(fwd, *CONTENDERS["jaxconv"][:2])
        on_one = [jax.device_put(v, one) for v in (params, x, target)]
        on_mesh = [jax.device_put(params, repl), jax.device_put(x, batch),
                   jax.device_put(target, batch)]
        hlo = step.lower(*on_mesh).compile().as_text()
        fns = {"one": lambda a=on_one: step(*a), "mesh": lambda a=on_mesh: step(*a)}
        (p1, l1), (pm, lm) = fns["one"](), fns["mesh"]()
        gap = max(float(jnp.max(jnp.abs(p1[k] - jax.device_put(pm[k], one)))) for k in p1)
        for fn in fns.values():
            _time_n(fn, 1)
        t = interleaved(fns, args.reps)
        med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        rows.append({"block": name, "description": desc, "median_ms": med,
                     "mesh_over_one": med["mesh"] / med["one"], "param_gap": gap,
                     "loss_gap": abs(float(l1) - float(lm)),
                     "onednn_calls": hlo.count('custom_call_target="jaxconv_onednn'),
                     "all_reduces": hlo.count("all-reduce("),
                     "all_gathers": hlo.count("all-gather(")})
        r = rows[-1]
        print(f"{name:14s} one {med['one']:8.2f} ms  mesh of {args.devices} {med['mesh']:8.2f} ms"
              f"  mesh/one {r['mesh_over_one']:.3f}  oneDNN calls {r['onednn_calls']}"
              f"  all-reduces {r['all_reduces']}  all-gathers {r['all_gathers']}"
              f"  param gap {gap:.1e}", flush=True)
    out = pathlib.Path(args.out) if args.out else RESULTS / "train_step_mesh.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": {"jax": jax.__version__, "cpu": cpu_model(),
                                        "cpu_count": os.cpu_count(), "devices": args.devices,
                                        "batch": args.batch, "reps": args.reps},
                               "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
