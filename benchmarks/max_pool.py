"""ResNet's stem max pool alone (3x3, stride 2, pads 1), forward and backward: flax's
``nn.max_pool`` (XLA's ``select_and_scatter``, the baseline), ``jaxconv.max_pool`` (its
forward and argmax where timed faster, the handler's one pass or XLA's passes) and the same
with XLA's passes (the rule), and PyTorch's ``max_pool2d_with_indices`` with its backward
(channels-last), interleaved in one process with kept host memory, per batch:

    python -m benchmarks.max_pool --out docs/benchmarks/max-pool-zen4.json
    python -m benchmarks.max_pool --dtype bfloat16 --out docs/benchmarks/max-pool-bf16-zen4.json

Prints and writes each contender's median in ms, its ratio to the baseline's, whether
``jaxconv``'s program holds the handler's pool, and the largest gradient difference from
torch's.
"""

from __future__ import annotations

import argparse
import json

import jaxconv
from jaxconv._src.bench import machine, model_steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--image", type=int, default=112, help="the pool's input height and width")
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    jaxconv.keep_freed_memory()
    rows = []
    for batch in args.batches:
        shape = (batch, args.image, args.image, args.channels)
        result = model_steps.measure_max_pool(shape, args.reps, args.dtype)
        if result is None:
            raise SystemExit("max_pool: needs torch (pip install -e \".[bench]\")")
        med = result["median_ms"]
        result["over_baseline"] = {k: med["xla"] / v for k, v in med.items()}
        print(json.dumps(result))
        rows.append(result)
    machine.write(args.out, machine.result(
        f"python -m benchmarks.max_pool --dtype {args.dtype}", result=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
