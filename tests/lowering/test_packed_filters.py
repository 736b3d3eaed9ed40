"""Packed filters (``native/onednn/packed.h``, ``lowering/fused.py``: ``pack``): a forward's
constant filter moved once into its primitive's layout, which the fused call then reads as it
is, against lax's convolution (``Precision.HIGHEST``) followed by the chain in NumPy's float64,
and against the same call on the unpacked filter.

The matrix crosses the data layouts, groups, strides and pads with chains with and without a
multiply (BatchNorm's folds into an unpacked filter, never into a packed one) at batch 1 (one
call, or rows split on XLA's pool) and 3 (chunks of the batch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxconv._src.lowering import fused
from jaxconv._src.native import library
from tests.lowering.test_fused import CHAINS, PROBLEMS, ROW_PROBLEMS, _operands, _oracle, _problem
from tests.support import helpers as h
from tests.support.onednn_matrix import needs_onednn

CASES = [*PROBLEMS, ROW_PROBLEMS[0][0]]
#: (chain, case): flax's BatchNorm not on the rows case, whose 144-term sums times
#: rsqrt(1e-3) ~ 32 exceed float32's bound against ReLU6's range for the unpacked call too
MATRIX = [(chain, case) for chain in ("none", "bias residual relu", "flax bn relu6")
          for case in CASES if not (chain == "flax bn relu6" and case is ROW_PROBLEMS[0][0])]


def _calls(x, w, operands, p, post, packed):
    fn = jax.jit(lambda x, w, *o: fused.forward(x, w, o, p=p, post=post, method="onednn",
                                                packed=packed))
    return fn(x, w, *operands)


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("chain, case", MATRIX, ids=lambda c: c if isinstance(c, str) else
                         f"{c[0]}-g{c[2]}-k{c[6][0]}s{c[7][0]}-{c[5][0]}")
def test_a_packed_filter_is_read_as_it_is_with_the_unpacked_calls_values(chain, case, batch,
                                                                         dtype):
    rng, x, w, p = _problem(case, batch)
    post = [] if chain == "none" else CHAINS[chain]
    x, w = x.astype(dtype), w.astype(dtype)
    operands = [o.astype(dtype) if o.ndim > 1 else o for o in _operands(rng, post, p)]
    bytes_, why = fused.pack(np.asarray(w), p, "onednn")
    assert why == "" and bytes_.dtype == np.uint8 and bytes_.ndim == 1
    before = library.cache_stats()
    got = _calls(x, w, operands, p, post, (bytes_, "onednn"))
    after = library.cache_stats()
    assert after["packed_reads"] > before["packed_reads"]
    assert after["packed_reorders"] == before["packed_reorders"]  # packed for these threads
    unpacked = _calls(x, w, operands, p, post, None)
    if dtype == "float32" and not any(op.alg.startswith("mul") for op in post):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(unpacked))  # the same sums
    oracle = _oracle(x.astype(jnp.float32), w.astype(jnp.float32),
                     [o.astype(jnp.float32) for o in operands], p, post)
    h.assert_close(got.astype(jnp.float32), oracle, jnp.dtype(dtype))


@needs_onednn
def test_a_filter_packed_for_other_threads_is_moved_each_call_and_still_right():
    """A pack assumes the threads its calls will run on (XLA's pool as the last call saw it);
    packed for one thread, a call split on the pool may want another layout (oneDNN blocks a
    filter by the threads sharing it: ResNet-50's 1x1 1024 -> 512 at 14x14 on AVX-512, packed
    for the team, runs as two chunks that want another layout): it moves the packed filter
    each call, and is right."""
    rng, x, w, p = _problem(("NXC", "XIO", 1, 1024, 512, (14, 14), (1, 1), (1, 1), (0, 0),
                             (0, 0)), 1)
    post = CHAINS["bias residual relu"]
    operands = _operands(rng, post, p)
    library.see_pool_threads(1)
    try:
        bytes_, why = fused.pack(np.asarray(w), p, "onednn")
    finally:
        library.see_pool_threads(0)
    assert why == ""
    before = library.cache_stats()
    got = _calls(x, w, operands, p, post, (bytes_, "onednn"))
    after = library.cache_stats()
    assert (after["packed_reads"] + after["packed_reorders"]
            > before["packed_reads"] + before["packed_reorders"])
    h.assert_close(got, _oracle(x, w, operands, p, post), jnp.float32)


@needs_onednn
def test_a_damaged_or_foreign_packed_filter_is_an_error_never_a_result():
    rng, x, w, p = _problem(PROBLEMS[0], 1)
    bytes_, _ = fused.pack(np.asarray(w), p, "onednn")
    damaged = bytes_.copy()
    damaged[0] ^= 0xFF  # its magic
    with pytest.raises(jax.errors.JaxRuntimeError, match="packed"):
        _calls(x, w, [], p, [], (damaged, "onednn")).block_until_ready()
    with pytest.raises(jax.errors.JaxRuntimeError, match="size"):
        _calls(x, w, [], p, [], (bytes_[:-64], "onednn")).block_until_ready()
    with pytest.raises(ValueError, match="^fused: packed must be"):
        _calls(x, w, [], p, [], (bytes_.view(np.int32), "onednn"))
    with pytest.raises(ValueError, match="^fused: packed must be"):
        _calls(x, w, [], p, [], (bytes_, "winograd"))


@needs_onednn
def test_derivatives_and_batching_read_the_filter_not_its_packing():
    """``grad`` and ``vmap`` go through the unfused chain on ``w`` (the packed bytes are a
    constant without a tangent), as for an unpacked call."""
    rng, x, w, p = _problem(PROBLEMS[0], 2)
    post = CHAINS["bias residual relu"]
    operands = _operands(rng, post, p)
    packed = (fused.pack(np.asarray(w), p, "onednn")[0], "onednn")

    def loss(x, packed):
        return jnp.sum(fused.forward(x, w, operands, p=p, post=post, method="onednn",
                                     packed=packed) ** 2)
    h.assert_close(jax.grad(loss)(x, packed), jax.grad(loss)(x, None), jnp.float32)
    xs = jnp.stack([x, 2 * x])
    batched = jax.vmap(lambda x: fused.forward(x, w, operands, p=p, post=post,
                                               method="onednn", packed=packed))(xs)
    h.assert_close(batched[1], _oracle(2 * x, w, operands, p, post), jnp.float32)
