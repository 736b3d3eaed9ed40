"""A grouped backprop-data problem against the OpenVINO runtime and jax.vjp.

GroupConvolutionBackpropData: data (8, 32, 56, 56), filters [G=4, C_IN=8, C_OUT=4, 3, 3],
strides 2, pads 1, output_padding 1 -> (8, 16, 112, 112); median of interleaved runs.

usage: python -m benchmarks.openvino_gcbd
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv
import jaxconv.testing
from jaxconv._src.bench.machine import import_openvino


def main() -> int:
    import_openvino()  # before JAX starts: its import forks (machine.import_openvino)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 32, 56, 56)).astype(np.float32)
    w = rng.standard_normal((4, 8, 4, 3, 3)).astype(np.float32)
    kw = dict(strides=(2, 2), pads_begin=(1, 1), pads_end=(1, 1), output_padding=(1, 1))
    xj, wj = jnp.asarray(x), jnp.asarray(w)
    ours = jax.jit(lambda x, w: jaxconv.group_convolution_backprop_data(x, w, **kw))
    y_shape = ours(xj, wj).shape

    # jax.vjp of the grouped forward convolution w.r.t. its input (the obvious path):
    # GroupConvolution filters [G, C_OUT=C_IN_bpd, C_IN=C_OUT_bpd, k, k] -> OIHW (G*8, 4, k, k)
    w_fwd = jnp.asarray(w.reshape(32, 4, 3, 3))

    def base(x, w_fwd):
        fwd = lambda z: lax.conv_general_dilated(  # noqa: E731
            z, w_fwd, (2, 2), [(1, 0), (1, 0)], dimension_numbers=("NCHW", "OIHW", "NCHW"),
            feature_group_count=4)
        return jax.vjp(fwd, jnp.zeros(y_shape, jnp.float32))[1](x)[0]

    base = jax.jit(base)
    jaxconv.testing.assert_close(ours(xj, wj), base(xj, w_fwd))
    impls = {"jaxconv": lambda: ours(xj, wj).block_until_ready(),
             "jax.vjp": lambda: base(xj, w_fwd).block_until_ready()}
    try:
        import openvino as ov
        from openvino import opset1
        from openvino.utils.node_factory import NodeFactory

        from tests.support import openvino_oracle as ovo

        param = opset1.parameter(list(x.shape), np.float32)
        node = NodeFactory("opset1").create(
            "GroupConvolutionBackpropData", [param.output(0), opset1.constant(w).output(0)],
            ovo._attrs(kw, 2))
        compiled = ov.Core().compile_model(ov.Model([node], [param]), "CPU",
                                           {"INFERENCE_PRECISION_HINT": "f32"})
        req = compiled.create_infer_request()
        jaxconv.testing.assert_close(ours(xj, wj), req.infer({0: x})[0])
        impls["openvino"] = lambda: req.infer({0: x})
    except ImportError:
        pass
    times = {k: [] for k in impls}
    for fn in impls.values():
        fn()
    for rep in range(15):
        names = list(impls)
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            impls[name]()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(json.dumps({"median_ms": med, "backend": jax.default_backend()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
