"""The product rewrites (``accelerate/rewrites/products.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from tests.support import helpers as h


def _prims(fn, *args) -> list[str]:
    return [e.primitive.name for e in h.equations(fn, *args)]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@jax.default_matmul_precision("float32")  # GPUs round float32 products to TF32
def test_a_transposed_product_runs_in_the_layout_its_reader_wants(dtype):
    """Autodiff writes a dense layer's kernel gradient as ``transpose(dot_general(dy, x))``:
    it runs as ``dot_general(x, dy)``, no transpose left (XLA:CPU ran it as a strided loop
    where the bfloat16 rounding stood between it and the product), as accurate as written
    against float64; a product with batch dims, and a transpose of three axes, run as
    written."""
    rng = np.random.default_rng(12)
    x = h.random(rng, (8, 24), dtype)
    w = h.random(rng, (24, 10))

    def loss(w, x):
        return jnp.sum(jnp.square((x @ w.astype(dtype)).astype(jnp.float32))) / 2

    grad = jax.grad(loss)
    jaxpr = jax.make_jaxpr(jaxconv.accelerate(grad))(w, x).jaxpr
    assert "transpose" in {e.primitive.name for e in jax.make_jaxpr(grad)(w, x).jaxpr.eqns}
    assert "transpose" not in {e.primitive.name for e in jaxpr.eqns}
    x64 = h.to_f64(x)
    dy = h.to_f64((x @ w.astype(dtype)).astype(jnp.float32))
    want = x64.T @ dy
    got, written = jax.jit(jaxconv.accelerate(grad))(w, x), grad(w, x)
    assert got.shape == written.shape == w.shape and got.dtype == written.dtype
    if jnp.dtype(dtype).itemsize < 4:  # written, the product is rounded to 16 bits; in
        # float32 both errors are the GEMM's summation order, which differs between CPUs
        err = np.max(np.abs(h.to_f64(got) - want))
        assert err <= np.max(np.abs(h.to_f64(written) - want))
    h.assert_close(got, want, dtype)

    def batched(a, b):  # a batch dim: the transpose stays
        return jnp.transpose(lax.dot_general(a, b, (((2,), (2,)), ((0,), (0,)))), (0, 2, 1))

    a, b = h.random(rng, (2, 5, 4), dtype), h.random(rng, (2, 3, 4), dtype)
    names = [e.primitive.name for e in jax.make_jaxpr(jaxconv.accelerate(batched))(a, b).jaxpr.eqns]
    assert names.count("transpose") == 1
    np.testing.assert_array_equal(jaxconv.accelerate(batched)(a, b), batched(a, b))
