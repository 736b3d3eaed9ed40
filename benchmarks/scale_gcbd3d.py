"""Scale: the 3D IR example of OpenVINO's GroupConvolutionBackpropData-1 page, float32, here.

data 1x20x224x224x224, filters 4x5x2x3x3x3 (G = 4), strides 2, pads 1 -> output 1x8x447x447x447.
Reports the compiled program's memory (XLA's own accounting: arguments, output, temporaries)
and, from a child process, the peak resident memory and the time of the first (compile + run)
and second call. Writes JSON.

usage: python -m benchmarks.scale_gcbd3d [--size 224] [--out benchmarks/results/scale_gcbd3d.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time

RESULTS = pathlib.Path(__file__).parent / "results"


def child(size: int) -> dict:
    import jax
    import jax.numpy as jnp

    import jaxconv

    data = jax.ShapeDtypeStruct((1, 20, size, size, size), jnp.float32)
    filters = jax.ShapeDtypeStruct((4, 5, 2, 3, 3, 3), jnp.float32)

    def op(d, f):
        return jaxconv.group_convolution_backprop_data(d, f, strides=2, pads_begin=1, pads_end=1)

    fn = jax.jit(op)
    compiled = fn.lower(data, filters).compile()
    mem = compiled.memory_analysis()
    key = jax.random.key(0)
    d = jax.random.normal(key, data.shape, jnp.float32)
    f = jax.random.normal(jax.random.key(1), filters.shape, jnp.float32)
    t0 = time.perf_counter()
    y = jax.block_until_ready(fn(d, f))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    y = jax.block_until_ready(fn(d, f))
    second = time.perf_counter() - t0
    finite = bool(jnp.all(jnp.isfinite(y)))
    return {
        "output_shape": list(y.shape), "finite": finite, "first_call_s": first,
        "second_call_s": second,
        "xla_bytes": {"arguments": mem.argument_size_in_bytes, "output": mem.output_size_in_bytes,
                      "temporaries": mem.temp_size_in_bytes},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale_gcbd3d", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=224, help="spatial size of the data (the example's: 224)")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS / "scale_gcbd3d.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.size)))
        return 0
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scale_gcbd3d", "--child",
                           "--size", str(args.size)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    result["process_wall_s"] = wall
    result["size"] = args.size
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    gb = 2 ** 30
    xb = result["xla_bytes"]
    print(f"GroupConvolutionBackpropData 1x20x{args.size}^3 -> {result['output_shape']}: "
          f"first call {result['first_call_s']:.1f} s, second {result['second_call_s']:.1f} s; "
          f"XLA: arguments {xb['arguments'] / gb:.2f} GiB, output {xb['output'] / gb:.2f} GiB, "
          f"temporaries {xb['temporaries'] / gb:.2f} GiB; peak RSS {result['peak_rss_bytes'] / gb:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
