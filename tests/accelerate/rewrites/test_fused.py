"""The fused-chain rewrite (``accelerate/rewrites/fused.py``): a forward convolution and the
element-wise chain after it (flax's BatchNorm in inference mode, a bias, a residual, ReLU,
ReLU6, tanh) as one fused primitive, where nothing else reads the chain's values; against the
unaccelerated function (lax's values and JAX's own derivatives).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support.onednn_matrix import needs_onednn

_DN = ("NHWC", "HWIO", "NHWC")


def _prims(fn, *args) -> list[str]:
    return [e.primitive.name for e in h.equations(fn, *args)]


class Block(nn.Module):
    """A residual block in inference mode: conv, BN, ReLU6; conv, BN, + shortcut, ReLU (the
    shortcut a 1x1 convolution with BN where the width changes)."""

    features: int
    bias: bool = False
    dtype: Any = None  # flax's mixed precision: the computation's dtype

    @nn.compact
    def __call__(self, x):
        norm = lambda name: nn.BatchNorm(use_running_average=True, name=name,  # noqa: E731
                                         dtype=self.dtype)
        conv = lambda k, bias: nn.Conv(self.features, k, use_bias=bias,  # noqa: E731
                                       dtype=self.dtype)
        y = nn.relu6(norm("bn1")(conv((3, 3), self.bias)(x)))
        y = norm("bn2")(conv((3, 3), self.bias)(y))
        if x.shape[-1] != self.features:
            x = norm("bn3")(conv((1, 1), False)(x))
        return nn.relu(x + y)


def _block(features=8, bias=False, channels=4, batch=2, dtype=None):
    rng = np.random.default_rng(features + channels + batch)
    x = h.random(rng, (batch, 9, 9, channels)).astype(dtype or jnp.float32)
    model = Block(features, bias, dtype)
    v = model.init(jax.random.key(0), x)
    stats = jax.tree.map(lambda a: jnp.asarray(rng.uniform(0.5, 1.5, a.shape), a.dtype),
                         v["batch_stats"])  # BatchNorm no identity
    return model, {"params": v["params"], "batch_stats": stats}, x


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("channels", [4, 8])
def test_a_blocks_chains_are_fused_and_compute_the_blocks_values(bias, channels):
    model, v, x = _block(bias=bias, channels=channels)
    fn = model.apply
    prims = _prims(jaxconv.accelerate(fn), v, x)
    convolutions = 3 if channels != 8 else 2
    assert prims.count("jaxconv_fused") == convolutions
    got = jax.jit(jaxconv.accelerate(fn))(v, x)
    h.assert_close(got, fn(v, x), jnp.float32)
    decisions = [d for d in jaxconv.explain(fn, v, x).decisions if d.matched == "fused chain"]
    labels = sorted(d.label for d in decisions)
    assert len(labels) == convolutions
    assert any("clip(0, 6)" in s for s in labels)  # ReLU6's max and min: one clip
    assert any("add(t) relu" in s for s in labels)  # the residual, then ReLU
    # flax's BatchNorm: its variance and epsilon, its normalizer computed in the call
    assert all("sub(c) mul_rsqrt(c, 1e-05) mul(c) add(c)" in s for s in labels), labels


def _calls(program: str, target: str) -> int:
    return program.count(f'custom_call_target="{target}"')


@needs_onednn
def test_on_onednn_each_chain_is_one_call():
    """Where the chooser runs the forward on oneDNN (its rows in ``explain``), its chain is one
    call; where it runs another method (Winograd, the rule for a 3x3 stride-1 float32 forward
    under ``"auto"``; XLA's product for this small 1x1), the chain runs after it as written,
    and the unfused convolutions, which nothing reads, are gone."""
    model, v, x = _block()
    fused = {}
    for lowering in ("direct", "auto"):
        fn = jaxconv.accelerate(model.apply, lowering=lowering)
        rows = jaxconv.explain(fn, v, x).rows
        on_onednn = sum(r.count for r in rows if r.lowering == "onednn")
        program = jax.jit(fn).lower(v, x).compile().as_text()
        fused[lowering] = _calls(program, library.TARGETS["fused"])
        assert fused[lowering] == on_onednn, rows
        # a fused BatchNorm's normalizer is computed in its call: XLA computes only those of
        # the chains that run after another method's convolution (3 BatchNorms in the block)
        assert program.count(" rsqrt(") == 3 - on_onednn, program
        assert _calls(program, library.TARGETS["forward"]) == 0
        h.assert_close(jax.jit(fn)(v, x), model.apply(v, x), jnp.float32)
    assert fused["direct"] >= 2  # the 3x3 forwards


def test_a_value_read_elsewhere_ends_no_chain_there():
    """A chain value the function also returns stays: the chain is fused up to it, and the
    convolution's result read twice is not fused at all."""
    rng = np.random.default_rng(3)
    x, w = h.random(rng, (2, 8, 8, 3)), h.random(rng, (3, 3, 3, 4))
    b = h.random(rng, (1, 1, 1, 4))

    def upto(x, w):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN) + b
        return y, jax.nn.relu(y)

    def twice(x, w):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN)
        return jnp.tanh(y), y * 2.0

    for fn, fused in ((upto, 1), (twice, 0)):
        assert _prims(jaxconv.accelerate(fn), x, w).count("jaxconv_fused") == fused
        for a, c in zip(jax.jit(jaxconv.accelerate(fn))(x, w), fn(x, w)):
            h.assert_close(a, c, jnp.float32)


@pytest.mark.parametrize("scale", [True, False])
def test_a_normalizer_read_elsewhere_stays_a_product(scale):
    """``rsqrt(var + eps)`` (times a scale) becomes ``mul_rsqrt`` of the variance only where
    nothing else reads the vectors between; the values are the program's either way."""
    rng = np.random.default_rng(5)
    x, w = h.random(rng, (1, 6, 6, 3)), h.random(rng, (3, 3, 3, 8))
    var = jnp.asarray(rng.uniform(0.1, 2.0, (1, 1, 1, 8)), jnp.float32)
    gamma = h.random(rng, (1, 1, 1, 8))

    def fn(x, w, var, gamma, also):
        m = lax.rsqrt(var + 1e-3)
        m = m * gamma if scale else m
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN) * m
        return (y, m) if also else y

    want = "mul_rsqrt(c, 0.001) mul(c)" if scale else "mul_rsqrt(c, 0.001)"
    for also in (False, True):
        f = lambda *a, also=also: fn(*a, also)  # noqa: E731
        labels = [d.label for d in jaxconv.explain(f, x, w, var, gamma).decisions
                  if d.matched == "fused chain"]
        assert len(labels) == 1 and (want in labels[0]) != also, labels
        got, ref = jax.jit(jaxconv.accelerate(f))(x, w, var, gamma), f(x, w, var, gamma)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
            h.assert_close(a, b, jnp.float32)


def test_derivatives_and_batching_through_a_fused_chain():
    """``grad`` of an accelerated inference function differentiates the fused primitive (its
    derivatives are the unfused chain's); ``accelerate`` of ``grad`` fuses each chain up to the
    value autodiff's backward pass reads (an activation's input: its derivative's mask), the
    activation left as written; ``vmap`` batches it."""
    model, v, x = _block()

    def loss(v, x):
        return jnp.sum(jnp.sin(model.apply(v, x)))
    got = jax.jit(jax.grad(jaxconv.accelerate(loss), (0, 1)))(v, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(jax.grad(loss, (0, 1))(v, x))):
        h.assert_close(a, b, jnp.float32)
    labels = [d.label for d in jaxconv.explain(jax.grad(loss), v, x).decisions
              if d.matched == "fused chain"]
    assert labels and not any("relu" in s or "clip" in s for s in labels), labels
    got = jax.jit(jaxconv.accelerate(jax.grad(loss)))(v, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(jax.grad(loss)(v, x))):
        h.assert_close(a, b, jnp.float32)
    xs = jnp.stack([x, -x])
    batched = jax.jit(jax.vmap(jaxconv.accelerate(model.apply), (None, 0)))(v, xs)
    h.assert_close(batched, jax.vmap(model.apply, (None, 0))(v, xs), jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@jax.numpy_dtype_promotion("standard")  # flax's BatchNorm mixes the dtype and float32
def test_a_mixed_precision_blocks_chains_are_fused_converts_and_all(dtype):
    """flax's mixed precision (``dtype``, float32 parameters): each BatchNorm computes in
    float32 and rounds back, and the widening pass keeps its float32 value for the residual's
    add. Each convolution's chain is one fused primitive, converts and all; the residual is
    read in the convolution's dtype (the input block's, widened by the program; the projection
    chain's result, which its convert back reads too). The values are the float32 model's
    within the dtype's tolerance, as the unaccelerated 16-bit model's are."""
    model, v, x = _block(channels=8, dtype=dtype)
    fn = model.apply
    assert _prims(jaxconv.accelerate(fn), v, x).count("jaxconv_fused") == 2
    # a projection shortcut: its BatchNorm's float32 result, which only the add reads, is
    # read in float32 by the last chain; its own chain, which nothing rounds, stays
    projected, vp, xp = _block(channels=4, dtype=dtype)
    assert _prims(jaxconv.accelerate(projected.apply), vp, xp).count(
        "jaxconv_fused") == 2
    reasons = [key for d in jaxconv.explain(projected.apply, vp, xp).decisions
               for _, key in d.reasons]
    assert "fused dtype" in reasons
    wide = Block(8).apply(vp, xp.astype(jnp.float32))
    h.assert_close(jax.jit(jaxconv.accelerate(projected.apply))(vp, xp).astype(jnp.float32),
                   wide, dtype)
    labels = sorted(d.label for d in jaxconv.explain(fn, v, x).decisions
                    if d.matched == "fused chain")
    name = np.dtype(dtype).name
    bn = "post-ops float32 sub(c) mul_rsqrt(c, 1e-05) mul(c) add(c)"
    assert labels == [f"{bn} add(t) {name} float32 relu {name} (where oneDNN runs the forward)",
                      f"{bn} {name} float32 clip(0, 6) {name} (where oneDNN runs the forward)"]
    wide = Block(8).apply(v, x.astype(jnp.float32))
    got = jax.jit(jaxconv.accelerate(fn))(v, x)
    assert got.dtype == np.dtype(dtype)
    h.assert_close(fn(v, x).astype(jnp.float32), wide, dtype)  # the tolerance holds as written
    h.assert_close(got.astype(jnp.float32), wide, dtype)


@needs_onednn
def test_a_bfloat16_projection_chain_whose_result_is_read_twice_ends_rounded():
    """A chain whose float32 result (a BatchNorm's, as the widening pass keeps it) a convert
    back to bfloat16 reads beside float32 readers is fused: the call returns the rounded
    bfloat16 value, the convert reads it, and the float32 readers read it widened. Without
    such a convert (the residual add alone reads the float32 value) the chain stays as
    written, and says why."""
    rng = np.random.default_rng(6)
    x, w, u = (h.random(rng, s).astype(jnp.bfloat16)
               for s in ((1, 6, 6, 8), (1, 1, 8, 8), (3, 3, 8, 8)))
    mean = h.random(rng, (1, 1, 1, 8))

    def fn(x, w, u, rounded):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN)
        z = y.astype(jnp.float32) - mean
        out = z + x.astype(jnp.float32)
        if rounded:
            z16 = z.astype(jnp.bfloat16)
            out = out + lax.conv_general_dilated(z16, u, (1, 1), "SAME",
                                                 dimension_numbers=_DN).astype(jnp.float32)
        return out

    for rounded in (True, False):
        f = lambda *a, rounded=rounded: fn(*a, rounded)  # noqa: E731
        decisions = jaxconv.explain(f, x, w, u).decisions
        chains = [d.label for d in decisions if d.matched == "fused chain"]
        reasons = [key for d in decisions for _, key in d.reasons]
        if rounded:
            assert any(s.startswith("post-ops float32 sub(c) bfloat16") for s in chains), chains
            assert any(d.label == "the 16-bit value it widens" for d in decisions)
        else:
            assert not any("sub(c)" in s for s in chains) and "fused dtype" in reasons, chains
        got = jax.jit(jaxconv.accelerate(f))(x, w, u)
        h.assert_close(got, f(x, w, u), jnp.bfloat16)


@needs_onednn
def test_a_served_models_constant_filters_are_packed_once():
    """A model served with its variables closed over: each filter of a chain oneDNN runs is a
    constant of the program, packed once when it is traced (``native/onednn/packed.h``), its
    bytes a constant of the program that each call reads as they are; ``explain`` says so,
    the values are the model's, and ``grad`` and ``vmap`` over the input still compose. With
    the variables as arguments nothing is packed."""
    model, v, x = _block()
    served = functools.partial(model.apply, v)
    serve = jaxconv.accelerate(served, lowering="direct")
    told = jaxconv.explain(served, x)
    labels = [d.label for d in told.decisions if d.matched == "fused chain"]
    assert len(labels) == 3 and all("packed once" in s for s in labels), labels
    on_onednn = sum(r.count for r in jaxconv.explain(serve, x).rows if r.lowering == "onednn")
    program = jax.jit(serve).lower(x).compile().as_text()
    assert _calls(program, library.TARGETS["fused"]) == on_onednn >= 2  # the 3x3 forwards
    before = library.cache_stats()["packed_reads"]
    got = jax.jit(serve)(x)
    assert library.cache_stats()["packed_reads"] >= before + on_onednn
    h.assert_close(got, model.apply(v, x), jnp.float32)
    assert not any("packed" in d.label for d in jaxconv.explain(model.apply, v, x).decisions)

    def loss(x):
        return jnp.sum(jnp.sin(serve(x)))
    h.assert_close(jax.jit(jax.grad(loss))(x),
                   jax.grad(lambda x: jnp.sum(jnp.sin(model.apply(v, x))))(x), jnp.float32)
    xs = jnp.stack([x, -x])
    h.assert_close(jax.jit(jax.vmap(serve))(xs), jax.vmap(functools.partial(model.apply, v))(xs),
                   jnp.float32)


@pytest.mark.parametrize("bounds,label", [((0, 6), "clip(0, 6)"), ((-1.0, 1.0), "clip(-1, 1)"),
                                          ((0.0, None), "relu")])
def test_jnp_clip_is_a_clip_post_op(bounds, label):
    """``jnp.clip`` passes its bounds into its ``jit`` as scalars (converted there): they are
    the body's literals, and the chain takes it as one clip (or ReLU)."""
    rng = np.random.default_rng(9)
    x, w = h.random(rng, (2, 8, 8, 4)), h.random(rng, (3, 3, 4, 8))

    def f(x, w):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN)
        return jnp.clip(y, *bounds)
    labels = [d.label for d in jaxconv.explain(f, x, w).decisions if d.matched == "fused chain"]
    assert labels == [f"post-ops {label} (where oneDNN runs the forward)"], labels
    assert _prims(jaxconv.accelerate(f), x, w).count("jaxconv_fused") == 1
    h.assert_close(jax.jit(jaxconv.accelerate(f))(x, w), f(x, w), jnp.float32)


@pytest.mark.parametrize("served", [False, True], ids=["arguments", "served"])
def test_silu_is_a_swish_post_op(served):
    """``jax.nn.silu`` (flax's ``nn.silu``, ``nn.swish``), ``x * logistic(x)`` in its ``jit``:
    oneDNN's swish after BatchNorm, one call where oneDNN runs the forward; the values are
    lax's, and ``grad`` over the input composes."""
    rng = np.random.default_rng(11)
    x, w = h.random(rng, (2, 8, 8, 4)), h.random(rng, (3, 3, 4, 8))
    scale, shift = h.random(rng, (8,)), h.random(rng, (8,))

    def f(x, w):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN)
        return jax.nn.silu(y * scale.reshape(1, 1, 1, 8) + shift.reshape(1, 1, 1, 8))
    fn, args = (functools.partial(f, w=w), (x,)) if served else (f, (x, w))
    labels = [d.label for d in jaxconv.explain(fn, *args).decisions if d.matched == "fused chain"]
    assert len(labels) == 1 and labels[0].startswith("post-ops mul(c) add(c) swish"), labels
    assert _prims(jaxconv.accelerate(fn), *args).count("jaxconv_fused") == 1
    h.assert_close(jax.jit(jaxconv.accelerate(fn))(*args), fn(*args), jnp.float32)

    def loss(g):
        return lambda x: jnp.sum(jnp.sin(g(x, *args[1:])))
    h.assert_close(jax.jit(jax.grad(loss(jaxconv.accelerate(fn))))(x), jax.grad(loss(fn))(x),
                   jnp.float32)


def test_jnp_clip_with_array_bounds_is_no_post_op():
    rng = np.random.default_rng(10)
    x, w = h.random(rng, (2, 8, 8, 4)), h.random(rng, (3, 3, 4, 8))
    lo = jnp.zeros((2, 8, 8, 8))

    def f(x, w, lo):
        return jnp.clip(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN),
                        lo, 6.0)
    assert "jaxconv_fused" not in _prims(jaxconv.accelerate(f), x, w, lo)
    h.assert_close(jax.jit(jaxconv.accelerate(f))(x, w, lo), f(x, w, lo), jnp.float32)


@needs_onednn
def test_explain_times_a_packed_filters_call_packed():
    """``explain(measure=True)`` times each row alone as the program runs it: a packed
    filter's call reads random bytes packed as the program's are (the handler counts its packed
    reads), and its ``ms`` is that call's."""
    model, v, x = _block()
    served = functools.partial(model.apply, v)
    serve = jaxconv.accelerate(served, lowering="direct")
    jax.block_until_ready(jax.jit(serve)(x))
    before = library.cache_stats()["packed_reads"]
    told = jaxconv.explain(serve, x, measure=True, reps=2)
    packed = [r for r in told.rows if "its filter packed" in r.chosen]
    assert packed and all(r.ms is not None and r.ms > 0 for r in packed), told.rows
    # the step's calls (two reps and a warm one) and each packed row's (a compile's and reps)
    assert library.cache_stats()["packed_reads"] >= before + 3 * len(packed) + 2 * len(packed)


def test_a_process_whose_programs_run_elsewhere_packs_nothing(monkeypatch):
    """On a GPU or TPU the fused call is never oneDNN's: its constant filters stay unpacked."""
    model, v, x = _block()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    served = functools.partial(model.apply, v)
    labels = [d.label for d in jaxconv.explain(served, x).decisions if d.matched == "fused chain"]
    assert len(labels) == 3 and not any("packed" in s for s in labels), labels
    eqns = jax.make_jaxpr(jaxconv.accelerate(served))(x).eqns
    fused = [e for e in eqns if e.primitive.name == "jaxconv_fused"]
    assert fused and not any(e.params["packed"] or e.params["constant"] for e in fused)


@needs_onednn
def test_a_served_channels_first_residual_is_packed_for_its_chain():
    """A channels-first block served with its variables closed over (an equinox ResNet's end
    of a bottleneck: a 1x1 convolution, BatchNorm, + the shortcut, ReLU): the rewrite packs the
    filter for the chain its call computes (``native/onednn/packed.h``), on layouts where
    oneDNN computes the residual with more than its reference loop nest (packed for the plain
    forward's, the caller's here, the call ran the reference: 1.4 s against 6.3 ms for the
    block at 256 channels, 56x56); the values are the function's."""
    rng = np.random.default_rng(12)
    x = h.random(rng, (1, 64, 8, 8))
    w0, w1 = np.asarray(h.random(rng, (32, 64, 3, 3))), np.asarray(h.random(rng, (64, 32, 1, 1)))
    scale, shift = (np.asarray(h.random(rng, (1, 64, 1, 1))) for _ in range(2))
    dn = ("NCHW", "OIHW", "NCHW")

    def block(x):
        y = jax.nn.relu(lax.conv_general_dilated(x, w0, (1, 1), "SAME", dimension_numbers=dn))
        y = lax.conv_general_dilated(y, w1, (1, 1), "VALID", dimension_numbers=dn)
        return jax.nn.relu(y * scale + shift + x)
    labels = [d.label for d in jaxconv.explain(block, x).decisions if d.matched == "fused chain"]
    assert any("add(t)" in s and "packed once" in s for s in labels), labels
    library.forget()  # choices(): this program's
    got = jax.jit(jaxconv.accelerate(block))(x)
    ran = {c["candidates"][0]["impl"] for c in library.choices()
           if c["source"] == "packed" and c["w"] == w1.shape}  # the residual's call
    assert ran and not any(i.startswith("ref") for i in ran), ran
    h.assert_close(got, block(x), jnp.float32)
