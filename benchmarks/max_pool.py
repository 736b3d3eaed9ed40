"""ResNet-18's stem max pool alone, forward and backward: flax's ``nn.max_pool`` (XLA's
``select_and_scatter``), ``jaxconv.max_pool`` and PyTorch's ``max_pool2d_with_indices`` with
its backward (channels-last), interleaved in one process with kept host memory:

    python -m benchmarks.max_pool --out benchmarks/results/max-pool.json

Prints and writes the medians in ms and the largest gradient difference from torch's.
"""

from __future__ import annotations

import argparse
import json

import jaxconv
from jaxconv._src.bench import machine, model_steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=int, nargs=4, default=[8, 112, 112, 64], help="NHWC input")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    jaxconv.keep_freed_memory()
    result = model_steps.measure_max_pool(tuple(args.shape), args.reps)
    if result is None:
        raise SystemExit("max_pool: needs torch (pip install -e \".[bench]\")")
    print(json.dumps(result))
    machine.write(args.out, machine.result("python -m benchmarks.max_pool", result=result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
