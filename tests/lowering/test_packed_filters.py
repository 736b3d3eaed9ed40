"""Packed filters (``native/onednn/packed.h``, ``lowering/fused.py``: ``pack``): a forward's
or a data gradient's constant filter moved once into its primitive's layout, which the call
then reads as it is, against lax's convolution (``Precision.HIGHEST``) followed by the chain in
NumPy's float64 (a data gradient: ``jax.vjp`` of lax's convolution), and against the same call
on the unpacked filter.

The forward's matrix crosses the data layouts, groups, strides and pads with chains with and
without a multiply (BatchNorm's folds into an unpacked filter, never into a packed one) at
batch 1 (one call, or rows split on XLA's pool) and 3 (chunks of the batch); the data
gradient's (a served transposed convolution) crosses them with the handler's own paths: output
positions that read only padding, negative pads (crops of x), a strided 1x1 spread onto dx's
grid, three spatial axes, and a large filter at a small size (tap products in the trial).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax import lax

from jaxconv._src.geometry import conv_output_size
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import fused
from jaxconv._src.native import library
from tests.lowering.test_fused import (
    CHAINS, HIGHEST, PROBLEMS, _operands, _oracle, _problem)
from tests.support import helpers as h
from tests.support.onednn_matrix import needs_onednn

#: a problem whose one example the handler splits into rows on XLA's pool (test_fused.py's
#: ROW_PROBLEMS[0] with other channels: that test reads the primitive cache for its own shapes)
ROWS = ("NXC", "XIO", 1, 24, 32, (64, 40), (3, 3), (1, 1), (1, 1), (1, 1))
CASES = [*PROBLEMS, ROWS]
#: (chain, case): flax's BatchNorm not on the rows case, whose 216-term sums times
#: rsqrt(1e-3) ~ 32 exceed float32's bound against ReLU6's range for the unpacked call too
MATRIX = [(chain, case) for chain in ("none", "bias residual relu", "flax bn relu6")
          for case in CASES if not (chain == "flax bn relu6" and case is ROWS)]


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
    bytes_, why = fused.pack(np.asarray(w), p, "onednn", post=post, operands=operands)
    assert why == "" and bytes_.dtype == np.uint8 and bytes_.ndim == 1
    library.forget()  # the primitives each call creates, in choices()
    before = library.cache_stats()
    got = _calls(x, w, operands, p, post, (bytes_, "onednn"))
    after = library.cache_stats()
    assert after["packed_reads"] > before["packed_reads"]
    assert after["packed_reorders"] == before["packed_reorders"]  # packed for these threads
    ran = {c["candidates"][0]["impl"] for c in library.choices()}
    assert not any(impl.startswith("ref") for impl in ran), ran  # packed for the chain
    library.forget()
    unpacked = _calls(x, w, operands, p, post, None)
    # the same sums where both ran one implementation
    if dtype == "float32" and not any(op.alg.startswith("mul") for op in post) and \
            ran == {c["candidates"][0]["impl"] for c in library.choices()}:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(unpacked))
    oracle = _oracle(x.astype(jnp.float32), w.astype(jnp.float32),
                     [o.astype(jnp.float32) for o in operands], p, post)
    h.assert_close(got.astype(jnp.float32), oracle, jnp.dtype(dtype))


@needs_onednn
def test_a_filter_packed_for_chunks_of_each_examples_rows_is_read_as_it_is():
    """Planned for 8 pool threads (``library.planned_pool_threads``), a batch of 3 runs as
    chunks of each example's rows (decisions.h, SplitsExampleRows): the filter packed for them
    is read as it is by every chunk, and the values are the unpacked call's."""
    rows = (*ROWS[:5], (64, 44), *ROWS[6:])  # ROWS on a map of its own (its chunks' shapes)
    rng, x, w, p = _problem(rows, 3)
    post = CHAINS["bias residual relu"]
    operands = _operands(rng, post, p)
    with library.planned_pool_threads(8):
        bytes_, why = fused.pack(np.asarray(w), p, "onednn", post=post, operands=operands)
        assert why == ""
        before = library.cache_stats()
        got = _calls(x, w, operands, p, post, (bytes_, "onednn"))
        after = library.cache_stats()
        unpacked = _calls(x, w, operands, p, post, None)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(unpacked))
    assert after["packed_reads"] > before["packed_reads"]
    assert after["packed_reorders"] == before["packed_reorders"]
    h.assert_close(got, _oracle(x, w, operands, p, post), jnp.float32)
    mine = [c for c in library.choices() if c["kernel"] == "forward" and c["w"] == w.shape
            and c["x"][0] == 1 and c["x"][1] < x.shape[1] and c["x"][2:] == x.shape[2:]]
    assert mine, [(c["x"], c["threading"]) for c in library.choices()]


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
def test_a_filter_is_packed_where_onednn_runs_its_calls_chain_beyond_its_reference():
    """oneDNN runs a residual (a tensor post-op) on its gemm kernel's plain layouts only as its
    reference loop nest (a channels-first 1x1 64 -> 256 at 56x56, batch 1: 1.4 s a call
    against 0.8 ms on its blocked kernel), and its "any" layouts are other ones for the chain
    than for the plain forward. With the plain kernel's verdict on the caller's layouts
    (gemm), a filter packed for the call's chain is packed on layouts where oneDNN computes the
    chain with more than its reference, in that primitive's filter layout (read as it is); one
    packed without the chain runs the reference (slower, never wrong); a call with another
    chain than the one packed for is an error (native/onednn/packed.h)."""
    case = ("NCX", "OIX", 1, 16, 32, (8, 8), (1, 1), (1, 1), (0, 0), (0, 0))
    rng, x, w, p = _problem(case, 1)
    post = CHAINS["bias residual relu"]
    operands = _operands(rng, post, p)
    want = _oracle(x, w, operands, p, post)
    library.forget()
    assert fused.pack(np.asarray(w), p, "onednn")[1] == ""  # the plain kernel's trial
    (plain,) = [c for c in library.choices() if c["source"] != "packed"]
    (gemm,) = [c["impl"] for c in plain["candidates"] if c["layout"] == "caller"]

    def packed_call(chain):
        library.forget()
        assert library.remember({plain["key"]: ("caller", gemm)}) == 1
        bytes_, why = fused.pack(np.asarray(w), p, "onednn", post=chain, operands=operands)
        assert why == ""
        before = library.cache_stats()
        got = _calls(x, w, operands, p, post, (bytes_, "onednn"))
        after = library.cache_stats()
        h.assert_close(got, want, jnp.float32)
        ran = {c["candidates"][0]["impl"] for c in library.choices()
               if c["source"] == "packed" and c["kernel"] == "forward"}
        return bytes_, ran, after["packed_reorders"] - before["packed_reorders"]

    _, ran, _ = packed_call(())
    assert {i for i in ran if i.startswith("ref")}, ran  # what a pack without its chain gets
    bytes_, ran, reorders = packed_call(post)
    assert ran and not any(i.startswith("ref") for i in ran) and reorders == 0, (ran, reorders)
    with pytest.raises(jax.errors.JaxRuntimeError, match="another chain"):
        _calls(x, w, [], p, [], (bytes_, "onednn")).block_until_ready()


@needs_onednn
def test_a_chains_filter_is_packed_on_the_layouts_its_own_trial_keeps(layout_trial):
    """A forward's filter packed for its chain is packed on the layouts the layout trial keeps
    for the call's primitive, its post-ops and all (``native/onednn/packed.cc``,
    ``ChainLayouts``), not the plain forward's: with each of the chain's candidates given as
    its verdict, the packed call runs on it, reads the filter as it is and computes the
    chain."""
    case = ("NXC", "XIO", 1, 32, 32, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1))
    rng, x, w, p = _problem(case, 1)
    post = CHAINS["bias residual relu"]
    operands = _operands(rng, post, p)
    want = _oracle(x, w, operands, p, post)
    assert fused.pack(np.asarray(w), p, "onednn", post=post, operands=operands)[1] == ""
    (trial,) = [c for c in library.choices() if c["source"] == "trial"]  # the chain's
    layouts = {c["layout"]: c["impl"] for c in trial["candidates"]
               if c["layout"] in ("caller", "any", "blocked")}
    assert len(layouts) >= 2, trial["candidates"]
    for layout, impl in sorted(layouts.items()):
        library.forget()
        assert library.remember({trial["key"]: (layout, impl)}) == 1
        bytes_, why = fused.pack(np.asarray(w), p, "onednn", post=post, operands=operands)
        assert why == ""
        before = library.cache_stats()
        got = _calls(x, w, operands, p, post, (bytes_, "onednn"))
        after = library.cache_stats()
        ran = [c["candidates"][0] for c in library.choices() if c["source"] == "packed"]
        assert {c["layout"] for c in ran} == {layout}, (layout, ran)
        assert after["packed_reads"] > before["packed_reads"]
        assert after["packed_reorders"] == before["packed_reorders"]
        h.assert_close(got, want, jnp.float32)


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


#: data gradients' problems (the forward's, as PROBLEMS): DCGAN's 4 x 4 stride-2 layers, one
#: with its filter larger than its activations (the trial may keep tap products: packed, the
#: primitive races them), groups in NCX, a 1x1 with pads (outputs that read only padding), a
#: strided 1x1 without pads (spread onto dx's grid), negative pads, three spatial axes
DATA_PROBLEMS = [
    ("NXC", "XIO", 1, 16, 8, (16, 16), (4, 4), (2, 2), (1, 1), (1, 1)),
    ("NXC", "XIO", 1, 256, 512, (8, 8), (4, 4), (2, 2), (1, 1), (1, 1)),
    ("NCX", "OIX", 2, 6, 8, (7, 6), (3, 2), (2, 1), (0, 1), (2, 0)),
    ("NXC", "XIO", 1, 8, 16, (9, 8), (1, 1), (2, 2), (1, 1), (1, 0)),
    ("NXC", "XIO", 1, 8, 16, (9, 8), (1, 1), (2, 2), (0, 0), (0, 0)),
    ("NXC", "XIO", 1, 8, 8, (10, 9), (3, 3), (2, 2), (-1, 0), (1, -2)),  # _data_problem
    ("NXC", "XIO", 1, 4, 8, (5, 6, 4), (3, 3, 3), (2, 1, 2), (1, 1, 0), (1, 0, 1)),
]


def _data_oracle(dy, w, p):
    """dx: ``jax.vjp`` of lax's forward at HIGHEST (a negative pad a crop of x first, which
    XLA:CPU computes wrong as a pad)."""
    df = p.data
    n = p.rank
    spec = {"NXC": (0, n + 1, *range(1, n + 1)), "NCX": tuple(range(n + 2))}[df.format]
    fspec = {"XIO": (n + 1, n, *range(n)), "OIX": tuple(range(n + 2))}[p.filter_layout.format]
    dn = lax.ConvDimensionNumbers(spec, fspec, spec)
    crop = [(max(0, -b), max(0, -e)) for b, e in zip(p.pads_begin, p.pads_end)]
    pads = [(max(0, b), max(0, e)) for b, e in zip(p.pads_begin, p.pads_end)]

    def forward(x):
        index = [slice(None)] * x.ndim
        for a, (lo, hi), size in zip(df.spatial_axes, crop, p.input_size):
            index[a] = slice(lo, size - hi)
        return lax.conv_general_dilated(x[tuple(index)], w, p.strides, pads,
                                        rhs_dilation=p.dilations, dimension_numbers=dn,
                                        feature_group_count=p.groups, precision=HIGHEST)
    _, vjp = jax.vjp(forward, jnp.zeros(p.x_shape, jnp.float32))
    return vjp(dy)[0]


def _data_problem(case, batch):
    """``_problem``, negative pads included (a ConvTranspose's output cropped: the public
    attributes never are, ``geometry.conv_transpose_problem`` makes them)."""
    pb, pe = case[8], case[9]
    rng, x, w, p = _problem((*case[:8], tuple(max(0, v) for v in pb),
                             tuple(max(0, v) for v in pe)), batch)
    out = tuple(conv_output_size(i, k, s, d, b, e) for i, b, e, k, d, s in zip(
        p.input_size, pb, pe, p.kernel, p.dilations, p.strides))
    return rng, w, dataclasses.replace(p, pads_begin=tuple(pb), pads_end=tuple(pe),
                                       output_size=out)


def _data_call(dy, w, p, packed):
    return jax.jit(lambda dy, w: fused.data(dy, w, p=p, method="onednn", packed=packed))(dy, w)


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", DATA_PROBLEMS, ids=lambda c: f"{c[0]}-g{c[2]}-{c[3]}to{c[4]}-"
                         f"k{c[6][0]}s{c[7][0]}-{c[8][0]}{c[9][-1]}-r{len(c[5])}")
def test_a_data_gradients_packed_filter_is_read_as_it_is(case, batch, dtype):
    """A served transposed convolution: its data gradient's call reads the packed filter (or,
    where its tap products outran the packed primitive, the pack says so and the call moves the
    filter as before), with dx's values."""
    rng, w, p = _data_problem(case, batch)
    dy = h.random(rng, Kernel.FORWARD.out_shape(p)).astype(dtype)
    w = w.astype(dtype)
    bytes_, why = fused.pack(np.asarray(w), p, "onednn", Kernel.DATA)
    packed = None
    if bytes_ is None:  # the trial's tap products outran the primitive on the packed filter
        assert "tap products" in why and case is DATA_PROBLEMS[1], why
    else:
        assert why == "" and bytes_.dtype == np.uint8 and bytes_.ndim == 1
        packed = (bytes_, "onednn")
    before = library.cache_stats()
    got = _data_call(dy, w, p, packed)
    after = library.cache_stats()
    if packed is not None:
        assert after["packed_reads"] > before["packed_reads"]
        assert after["packed_reorders"] == before["packed_reorders"]
    h.assert_close(got.astype(jnp.float32),
                   _data_oracle(dy.astype(jnp.float32), w.astype(jnp.float32), p),
                   jnp.dtype(dtype))


#: a data gradient of one example whose filter outweighs x and y over 8 times: its call
#: splits x's channels (decisions.h, SplitsChannels), its filter packed in one part a chunk
HEAVY = ("NXC", "XIO", 1, 128, 256, (16, 16), (4, 4), (2, 2), (1, 1), (1, 1))


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_data_gradients_filter_packed_for_chunks_of_its_channels_is_read_in_parts(dtype):
    """Planned for 4 pool threads (run on this machine's pool), the filter is packed as four
    parts, one per chunk of dx's channels, each read as it is by its chunk (four packed reads
    a call, no reorder), with the unpacked call's values."""
    rng, w, p = _data_problem(HEAVY, 1)
    dy = h.random(rng, Kernel.FORWARD.out_shape(p)).astype(dtype)
    w = w.astype(dtype)
    with library.planned_pool_threads(4):
        bytes_, why = fused.pack(np.asarray(w), p, "onednn", Kernel.DATA)
        assert why == ""
        before = library.cache_stats()
        got = _data_call(dy, w, p, (bytes_, "onednn"))
        after = library.cache_stats()
        unpacked = _data_call(dy, w, p, None)
    assert after["packed_reads"] - before["packed_reads"] == 4
    assert after["packed_reorders"] == before["packed_reorders"]
    if dtype == "float32":
        np.testing.assert_array_equal(np.asarray(got), np.asarray(unpacked))  # the same sums
    h.assert_close(got.astype(jnp.float32),
                   _data_oracle(dy.astype(jnp.float32), w.astype(jnp.float32), p),
                   jnp.dtype(dtype))


@needs_onednn
@pytest.mark.parametrize("packed_for, called_on", [(4, 2), (2, 1), (1, 2)])
def test_a_data_gradients_filter_packed_for_other_chunks_of_channels_is_still_right(
        packed_for, called_on):
    """Packed in four parts and called on two chunks, in two parts and called on the team
    (one pool thread), or whole (for the team) and called on two chunks of channels: the
    call moves the packed filter to the caller's layout (a packed reorder) and is right."""
    rng, w, p = _data_problem(HEAVY, 1)
    dy = h.random(rng, Kernel.FORWARD.out_shape(p))
    with library.planned_pool_threads(packed_for):
        bytes_, why = fused.pack(np.asarray(w), p, "onednn", Kernel.DATA)
    assert why == ""
    with library.planned_pool_threads(called_on):
        before = library.cache_stats()
        got = _data_call(dy, w, p, (bytes_, "onednn"))
        after = library.cache_stats()
    assert after["packed_reorders"] > before["packed_reorders"]
    h.assert_close(got, _data_oracle(dy, w, p), jnp.float32)


@needs_onednn
def test_a_filter_packed_for_one_kernel_is_an_error_of_the_other():
    """The header names the kernel: a forward's packed bytes given to a data gradient of the
    same problem (whose primitive wants another layout) are an error, not a result."""
    rng, x, w, p = _problem(DATA_PROBLEMS[0], 1)
    forward, _ = fused.pack(np.asarray(w), p, "onednn")
    dy = h.random(rng, Kernel.FORWARD.out_shape(p))
    with pytest.raises(jax.errors.JaxRuntimeError, match="packed for a forward"):
        _data_call(dy, w, p, (forward, "onednn")).block_until_ready()
    data, _ = fused.pack(np.asarray(w), p, "onednn", Kernel.DATA)
    with pytest.raises(jax.errors.JaxRuntimeError, match="packed for a data gradient"):
        _calls(x, w, [], p, [], (data, "onednn")).block_until_ready()


@needs_onednn
def test_a_packed_data_gradients_derivatives_and_batching_read_the_filter():
    rng, _, w, p = _problem(DATA_PROBLEMS[0], 2)
    dy = h.random(rng, Kernel.FORWARD.out_shape(p))
    packed = (fused.pack(np.asarray(w), p, "onednn", Kernel.DATA)[0], "onednn")

    def loss(dy, packed):
        return jnp.sum(jnp.sin(fused.data(dy, w, p=p, method="onednn", packed=packed)))
    h.assert_close(jax.grad(loss)(dy, packed), jax.grad(loss)(dy, None), jnp.float32)
    batched = jax.vmap(lambda d: fused.data(d, w, p=p, method="onednn", packed=packed))(
        jnp.stack([dy, 2 * dy]))
    h.assert_close(batched[1], _data_oracle(2 * dy, w, p), jnp.float32)


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_filter_packed_on_each_layout_reads_the_residual_in_its_outputs_layout(
        dtype, layout_trial):
    """A served model's filter is packed for the activations' layouts its plain kernel keeps
    (packed.h), and its fused call, a residual among its post-ops, creates its primitive on
    them: on each layout the plain kernel's trial races, kept by a verdict before the filter
    is packed, the call reads the packed filter and computes the chain (the residual read in
    the output's layout: test_fused.py); one layout at least is not the caller's."""
    if dtype not in library.status().dtypes:
        pytest.skip(f"oneDNN does not compute {dtype} on this CPU")
    case = ("NXC", "XIO", 1, 32, 32, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1))
    rng, x, w, p = _problem(case, 1)
    post = CHAINS["bias residual relu"]
    x, w = x.astype(dtype), w.astype(dtype)
    operands = [o.astype(dtype) if o.ndim > 1 else o for o in _operands(rng, post, p)]
    want = _oracle(x.astype(jnp.float32), w.astype(jnp.float32),
                   [o.astype(jnp.float32) for o in operands], p, post)
    assert fused.pack(np.asarray(w), p, "onednn")[1] == ""  # the plain kernel's trial
    plain = [c for c in library.choices() if c["kernel"] == "forward" and c["source"] == "trial"]
    assert len(plain) == 1, library.choices()
    layouts = {c["layout"]: c["impl"] for c in plain[0]["candidates"]
               if c["layout"] in ("caller", "any", "blocked")}
    assert set(layouts) - {"caller"}, plain[0]["candidates"]
    for layout, impl in sorted(layouts.items()):
        library.forget()
        assert library.remember({plain[0]["key"]: (layout, impl)}) == 1
        bytes_, why = fused.pack(np.asarray(w), p, "onednn")
        assert why == ""
        before = library.cache_stats()
        got = _calls(x, w, operands, p, post, (bytes_, "onednn"))
        after = library.cache_stats()
        assert sum(after[k] - before[k] for k in ("packed_reads", "packed_reorders")) > 0
        h.assert_close(got.astype(jnp.float32), want, jnp.dtype(dtype))
