"""``python -m benchmarks.models``: whole networks (ResNet-18, ResNet-50, MobileNetV2) in flax
against torch.nn, training steps and every layer's convolutions; the runner of
``jaxconv bench models``, which ships with the package (``jaxconv/_src/bench/model_run.py``).
``python -m benchmarks.models --help`` lists its options.
"""

from jaxconv._src.bench.model_run import main

if __name__ == "__main__":
    raise SystemExit(main())
