"""Precision: the error bounds stated in docs/precision.md, zero-size inputs, finite results.

The bounds are the measured worst cases of ``python -m benchmarks.precision`` (benchdnn
problems, float64 torch reference on the same rounded inputs) with head-room; here they are
asserted on a few of those problems so that a lowering that loses accuracy fails CI.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from benchmarks import precision
from jaxconv._src.bench import benchdnn

# max |got - ref| / max |ref| per configuration and backend (docs/precision.md)
CPU_BOUNDS = {
    "float32 HIGHEST": 3e-5,
    "float32 DEFAULT": 3e-5,
    "float16 (f32 accumulation)": 2e-3,
    "float16 -> float32 result": 3e-5,
    "float16 accumulation": 1e-2,
    "bfloat16 (f32 accumulation)": 1.6e-2,
    "bfloat16 -> float32 result": 3e-5,
    "bfloat16 accumulation": 8e-2,
}
BOUNDS = {
    "cpu": CPU_BOUNDS,
    # float32 DEFAULT is TF32 (10-bit mantissa products) on Ampere/Hopper: 3-4e-4 measured on
    # an H100; the other configurations round the same way as on CPU.
    "gpu": dict(CPU_BOUNDS, **{"float32 DEFAULT": 1e-3}),
    # float32 DEFAULT is one bfloat16 pass on TPU: the inputs rounded to bfloat16, the bound of
    # bfloat16 with float32 accumulation.
    "tpu": dict(CPU_BOUNDS, **{"float32 DEFAULT": CPU_BOUNDS["bfloat16 (f32 accumulation)"]}),
}


def backend_bounds() -> dict[str, float]:
    """The bounds of the backend this run computes on (cuda and rocm: "gpu")."""
    backend = jax.default_backend()
    return BOUNDS["gpu" if backend in ("gpu", "cuda", "rocm") else backend]


PROBLEMS = [("conv_shapes_mobilenet_dw", 0), ("conv_shapes_dilated", 20), ("conv_shapes_3d", 5),
            ("deconv_shapes_2d", 3)]


@pytest.mark.parametrize("lst,index", PROBLEMS)
def test_error_bounds(lst, index):
    prob = benchdnn.load(lst, batch_cap=2)[index]
    bounds = backend_bounds()
    errors = precision.measure(prob)
    assert set(errors) == set(bounds)
    for config, errs in errors.items():
        for op, err in errs.items():
            assert err <= bounds[config], f"{prob.name} {config} {op}: {err:.2e} > {bounds[config]}"


ZERO_CASES = [  # (what, x shape NXC, filter XIO)
    ("batch", (0, 6, 6, 4), (3, 3, 4, 8)),
    ("channels", (2, 6, 6, 0), (3, 3, 0, 8)),
    ("out-channels", (2, 6, 6, 4), (3, 3, 4, 0)),
]


@pytest.mark.parametrize("what,x_shape,w_shape", ZERO_CASES, ids=[c[0] for c in ZERO_CASES])
def test_zero_size_gives_correctly_shaped_zeros(what, x_shape, w_shape):
    x = jnp.ones(x_shape)
    w = jnp.ones(w_shape)
    a = dict(strides=2, auto_pad="same_upper")
    y = jaxconv.convolution(x, w, **a)
    assert y.shape == (x_shape[0], 3, 3, w_shape[3])
    dy = jnp.ones(y.shape)
    dw = jaxconv.convolution_backprop_filters(x, dy, w_shape, **a)
    dx = jaxconv.convolution_backward_data(dy, w, x_shape, **a)
    assert dw.shape == w_shape and dx.shape == x_shape
    for r in (y, dw, dx):
        assert not np.any(np.asarray(r))  # all zeros (empty sums)


@pytest.mark.parametrize("oc", [2, 16], ids=["outer-sum", "dot_general"])
def test_zero_batch_with_a_window_covering_the_input(oc):
    """Every output extent 1 and no examples: the outer product over the batch is all zeros."""
    dw = jaxconv.convolution_backprop_filters(jnp.ones((0, 5, 5, 4)), jnp.ones((0, 1, 1, oc)),
                                              (5, 5, 4, oc))
    assert dw.shape == (5, 5, 4, oc)
    assert not np.any(np.asarray(dw))


def test_no_nan_or_inf_from_finite_extremes():
    """Inputs at the edge of the range: float16's max stays finite with f32 accumulation only
    where the true result fits; here the true results fit (alternating signs cancel)."""
    big = 6e4 * np.where(np.arange(2 * 8 * 8 * 4).reshape(2, 8, 8, 4) % 2, 1.0, -1.0)
    x = jnp.asarray(big, jnp.float16)
    dy = jnp.asarray(np.ones((2, 8, 8, 2)) * 1e-3, jnp.float16)
    dw = jaxconv.convolution_backprop_filters(x, dy, (1, 1, 4, 2),
                                              preferred_element_type=jnp.float32)
    assert bool(jnp.all(jnp.isfinite(dw)))
    tiny = jnp.full((2, 8, 8, 4), 1e-38, jnp.float32)  # subnormal products
    assert bool(jnp.all(jnp.isfinite(jaxconv.convolution(tiny, jnp.ones((3, 3, 4, 2)),
                                                         auto_pad="same_upper"))))
