"""``python -m benchmarks.run``: the benchmark runner of ``jaxconv bench``, from a source checkout.

The runner ships with the package (``jaxconv/_src/bench/run.py``, the benchdnn shape lists in
``jaxconv/_src/bench/shapes/``); ``python -m benchmarks.run --help`` lists its options.
"""

from jaxconv._src.bench.run import main

if __name__ == "__main__":
    raise SystemExit(main())
