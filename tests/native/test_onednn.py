"""The ``onednn`` lowering: oneDNN's primitives through XLA's FFI, on CPU.

With the ``onednn`` extra built (``jaxconv build-onednn``), every kernel forced to
``lowering="onednn"`` equals torch (float64) on a matrix of ranks, data and filter formats,
groups (depthwise with a channel multiplier too), strides, dilations and asymmetric pads; its
derivatives to order 2 and its batching go through the primitive's rules; a fault inside the
handler is a Python exception naming the op. Without it (the library absent, or a child
process pointed at an empty prefix), jaxconv works as before and says why once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support.onednn_matrix import (
    DEEP,
    HIGHEST,
    IDS,
    LARGE,
    MATRIX,
    SPREAD,
    _problem,
    needs_onednn,
)


@needs_onednn
@pytest.mark.parametrize("m", MATRIX, ids=IDS)
def test_every_kernel_equals_torch(m):
    x, w, dy, attrs, (y_ref, dx_ref, dw_ref) = _problem(m)
    y = jaxconv.convolution(x, w, **attrs, lowering="onednn")
    dx = jaxconv.convolution_backward_data(dy, w, x.shape, **attrs, lowering="onednn")
    dw = jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs, lowering="onednn")
    for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        h.assert_close(got, ref, jnp.float32)
    program = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(
        x, dy, w.shape, **attrs, lowering="onednn")).lower(x, dy).as_text()
    assert library.TARGETS["weight"] in program and "convolution(" not in program


# MATRIX[1] with more channels and positions: 3.1e6 multiply-adds per example, above the
# handler's kMinChunkMacs (2^21), so that its batch splits into chunks on XLA's pool

@needs_onednn
@pytest.mark.parametrize("blocks,dtype,o,i,taps,applies", [
    # float32, I innermost in O x I tiles (a forward's or data gradient's filter)
    ("16a16b", "float32", 16, 16, (1,), True), ("16a16b", "float32", 32, 48, (3, 3), True),
    ("16a16b", "float32", 512, 512, (3, 3), True),
    ("16a16b", "float32", 64, 32, (2, 3, 2), True), ("32a32b", "float32", 64, 96, (3,), True),
    # O innermost (a weight gradient's): rows in XIO's order, streamed from 8 MiB
    ("16b16a", "float32", 48, 16, (5,), True), ("16b16a", "float32", 512, 512, (3, 3), True),
    ("16b16a", "float32", 64, 32, (2, 3, 2), True), ("16b32a", "float32", 64, 48, (3, 3), True),
    ("16b64a", "float32", 128, 32, (3,), True),
    # bfloat16, pairs of I innermost (brgconv's and jit_bf16's forwards): XIO's rows
    # interleaved two by two, O's padding (48 blocks of 1024) written as zeros
    ("64a2b", "bfloat16", 512, 512, (3, 3), True), ("32a2b", "bfloat16", 64, 96, (3,), True),
    ("8b16a2b", "bfloat16", 2048, 1024, (1, 1), True),
    ("8b16a2b", "bfloat16", 32, 48, (2, 3, 2), True),
    ("48a2b", "bfloat16", 1024, 512, (1, 1), True), ("16a2b", "bfloat16", 16, 64, (7, 7), True),
    # bfloat16, pairs of O innermost (data gradients'): 16 x 16 tiles of O pairs, I's padding
    # (48 blocks of 1024 and of 32, 64 blocks of 48) written as zeros
    ("64b2a", "bfloat16", 256, 256, (3, 3), True), ("32b2a", "bfloat16", 512, 512, (3, 3), True),
    ("8a16b2a", "bfloat16", 2048, 512, (1, 1), True),
    ("48b2a", "bfloat16", 512, 1024, (1, 1), True), ("48b2a", "bfloat16", 64, 32, (3,), True),
    ("64b2a", "bfloat16", 64, 48, (3,), True),
    ("8a16b2a", "bfloat16", 64, 32, (2, 3, 2), True),
    # channels that do not fill the tiles, or float32 with I blocked alone (brgconv's layouts,
    # where oneDNN's reorder was the faster), or pairs of float32: oneDNN's reorder
    ("16a16b", "float32", 24, 16, (3, 3), False), ("16b16a", "float32", 24, 16, (3, 3), False),
    ("32a32b", "float32", 32, 48, (3, 3), False), ("32b", "float32", 512, 256, (3, 3, 3), False),
    ("64b", "float32", 16, 128, (1, 1), False), ("16b", "float32", 80, 16, (5,), False),
    ("64a2b", "float32", 512, 512, (3, 3), False),
    ("32b2a", "bfloat16", 48, 32, (3, 3), False),
    ("16b16a", "bfloat16", 24, 16, (3, 3), False),
    # bfloat16 weight gradients' O-innermost tiles: the copy measured level with oneDNN's reorder
    ("16b16a", "bfloat16", 512, 512, (3, 3), False),
    ("16b32a", "bfloat16", 64, 48, (3, 3, 3), False)])
def test_filter_moves_equal_onednns_reorder(blocks, dtype, o, i, taps, applies):
    """The handler moves an XIO filter (flax's HWIO) into oneDNN's blocked layouts (float32
    O x I tiles with I innermost; bfloat16 layouts with pairs of I or of O innermost), and a
    float32 weight gradient out of the tiles with O innermost, itself (oneDNN 3.2's reorders of
    those directions ran at up to 10x the time of torch's): bit for bit what oneDNN's own
    reorder writes, padding included, on 1D, 2D and 3D filters; channels that do not fill the
    tiles, float32 layouts that block I alone and bfloat16 weight gradients keep oneDNN's
    reorder."""
    if not blocks.endswith("a") or blocks.endswith("b2a"):
        if "AVX-512" not in library.status().isa:
            pytest.skip(f"the moves into blocked layouts are AVX-512 code; this CPU: "
                        f"{library.status().isa}")
    assert library.check_filter_move(blocks, o, i, taps, dtype) is (True if applies else None)


@needs_onednn
def test_calls_move_xio_filters_themselves(layout_trial):
    """A data gradient of an XIO filter of at least 1 MiB whose primitive takes the blocked
    filter runs the transpose (in the first call's layout trial at least), a weight gradient
    the copy in its calls; both equal torch's."""
    m = (2, "NXC", "XIO", 1, 256, 128, (5, 4), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    x, w, dy, attrs, (_, dx_ref, dw_ref) = _problem(m, seed=3, batch=2)
    before = library.cache_stats()
    dx = jaxconv.convolution_backward_data(dy, w, x.shape, **attrs, lowering="onednn")
    dw = jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs, lowering="onednn")
    h.assert_close(dx, dx_ref, jnp.float32)
    h.assert_close(dw, dw_ref, jnp.float32)
    after = library.cache_stats()
    if "AVX-512" in library.status().isa:  # blocks of 16 channels: AVX-512's layouts
        assert after["filter_transposes"] > before["filter_transposes"]
        assert after["filter_copies"] > before["filter_copies"]


@needs_onednn
def test_windows_that_read_only_padding():
    """Every window in the padding (stride 10 past a one-element x, pads 5 each side): y, dx and
    dW equal torch's (zeros for both gradients), with no oneDNN call for the gradients."""
    m = (1, "NXC", "XIO", 1, 2, 3, (1,), (1,), (10,), (1,), (5,), (5,))
    x, w, dy, attrs, (y_ref, dx_ref, dw_ref) = _problem(m)
    assert dy.shape[1] == 2
    h.assert_close(jaxconv.convolution(x, w, **attrs, lowering="onednn"), y_ref, jnp.float32)
    dx = jaxconv.convolution_backward_data(dy, w, x.shape, **attrs, lowering="onednn")
    dw = jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs, lowering="onednn")
    h.assert_close(dx, dx_ref, jnp.float32)
    h.assert_close(dw, dw_ref, jnp.float32)
    assert not np.any(np.asarray(dx)) and not np.any(np.asarray(dw))
    program = jax.jit(lambda dy, w: jaxconv.convolution_backward_data(
        dy, w, x.shape, **attrs, lowering="onednn")).lower(dy, w).as_text()
    assert "custom_call" not in program


@needs_onednn
@pytest.mark.parametrize("m, batch", [(LARGE, 1), (LARGE, 3), (LARGE, 5), (DEEP, 3)],
                         ids=["large-1", "large-3", "large-5", "deep-3"])
def test_batches_one_call_or_chunks_on_xlas_pool(m, batch):
    """The handler's ways of running a call, each equal to torch: a problem below 2^21
    multiply-adds whole on the calling thread (the matrix above); one large example as one
    OpenMP call (batch 1, and every weight gradient past 2^21); larger batches of a forward or
    data gradient as chunks on XLA's thread pool, of unequal sizes where the chunks do not
    divide the batch (3, 5 on two threads), except where the filter outweighs a chunk's
    activations (a deep layer: one OpenMP call)."""
    x, w, dy, attrs, (y_ref, dx_ref, dw_ref) = _problem(m, seed=4, batch=batch)
    h.assert_close(jaxconv.convolution(x, w, **attrs, lowering="onednn"), y_ref, jnp.float32)
    h.assert_close(jaxconv.convolution_backward_data(dy, w, x.shape, **attrs, lowering="onednn"),
                   dx_ref, jnp.float32)
    h.assert_close(jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs,
                                                        lowering="onednn"), dw_ref, jnp.float32)


# Strided 1x1 data gradients: the handler computes the unit-stride one and spreads it onto
# dx's grid with the zeros between (Spread in native/onednn/primitives.cc, SpreadCopy in native/onednn/execute.cc). The spacing on the
# innermost buffer axis (NCX) and not (NXC), a trailing row no window reads, 1D and 3D, and a
# batch past 2^21 multiply-adds per example (chunks on XLA's pool, each spreading its own).


@needs_onednn
@pytest.mark.parametrize("m, batch", SPREAD, ids=["2d-nxc", "1d-ncx", "3d-nxc-g2", "chunks"])
def test_strided_1x1_data_gradient_spreads_onto_dx(m, batch):
    """The handler's own spread (no pad in the program) equals torch's data gradient."""
    x, w, dy, attrs, (_, dx_ref, _) = _problem(m, seed=6, batch=batch)
    op = jax.jit(lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **attrs,
                                                                 lowering="onednn"))
    h.assert_close(op(dy, w), dx_ref, jnp.float32)
    program = op.lower(dy, w).as_text()
    assert library.TARGETS["data"] in program and "stablehlo.pad" not in program


@needs_onednn
@pytest.mark.parametrize("pads", [0, 1], ids=["unpadded", "padded"])
def test_strided_1x1_weight_gradient_hands_the_stride_to_onednn_on_avx512(pads):
    """A strided 1x1 weight gradient with trailing rows no window reads equals torch's. On
    AVX-512 without pads x reaches oneDNN whole, its stride with it; otherwise (pads, or AVX2,
    whose 1x1 kernel miscomputed with unread rows) x's grid is taken in the program first."""
    m = (2, "NXC", "XIO", 1, 32, 48, (25, 23), (1, 1), (3, 2), (1, 1), (pads, pads), (pads, 0))
    x, w, dy, attrs, (_, _, dw_ref) = _problem(m, seed=10, batch=4)
    op = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs,
                                                                    lowering="onednn"))
    h.assert_close(op(x, dy), dw_ref, jnp.float32)
    program = op.lower(x, dy).as_text()
    whole = f"tensor<{'x'.join(map(str, x.shape))}xf32>"
    call = [line for line in program.splitlines() if library.TARGETS["weight"] in line]
    assert len(call) == 1
    assert (whole in call[0].split("->")[0]) == (library.status().avx512 and pads == 0), call


@needs_onednn
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [MATRIX[1], MATRIX[3], MATRIX[4]], ids=[IDS[1], IDS[3], IDS[4]])
def test_16_bit_dtypes_run_in_onednn_where_this_cpu_has_them(m, dtype):
    """Where oneDNN computes the dtype on this CPU (asked once at load: bfloat16 from AVX-512
    BF16, float16 from AVX-512 FP16 or AMX) the program is oneDNN's call; elsewhere the kernel is
    XLA's. Either way the result equals torch on the same rounded operands, to the dtype's bound."""
    x, w, dy, attrs, refs = _problem(m, seed=3, dtype=dtype)
    got = (jaxconv.convolution(x, w, **attrs, lowering="onednn"),
           jaxconv.convolution_backward_data(dy, w, x.shape, **attrs, lowering="onednn"),
           jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs, lowering="onednn"))
    for out, ref in zip(got, refs):
        assert out.dtype == dtype
        h.assert_close(out, ref, dtype)
    program = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(
        x, dy, w.shape, **attrs, lowering="onednn")).lower(x, dy).as_text()
    assert (library.TARGETS["weight"] in program) == (dtype in library.status().dtypes)
    assert ("convolution(" in program) != (dtype in library.status().dtypes)


BF16 = "bfloat16" in library.status().dtypes


@needs_onednn
@pytest.mark.skipif(not BF16, reason=f"oneDNN computes {list(library.status().dtypes)} here: "
                    f"bfloat16 needs AVX-512 BF16 or AMX (ISA {library.status().isa})")
@pytest.mark.parametrize("m", [MATRIX[1], MATRIX[2], LARGE, SPREAD[0][0]],
                         ids=[IDS[1], IDS[2], "large-chunks", "strided-1x1"])
def test_bfloat16_through_the_handler(m):
    """bfloat16 computed by oneDNN (the program holds the handler's calls): forward, data and
    weight gradients against a float64 oracle on the same rounded operands, at bfloat16's bound;
    both layouts, groups and depthwise, a problem large enough to run in chunks, and a strided
    1x1 one (its data gradient spread onto dx's grid in 16-bit elements)."""
    x, w, dy, attrs, (y_ref, dx_ref, dw_ref) = _problem(m, seed=5, dtype=jnp.bfloat16)
    ops = (lambda x, w, dy: jaxconv.convolution(x, w, **attrs, lowering="onednn"),
           lambda x, w, dy: jaxconv.convolution_backward_data(dy, w, x.shape, **attrs,
                                                             lowering="onednn"),
           lambda x, w, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs,
                                                                 lowering="onednn"))
    for op, ref, kernel in zip(ops, (y_ref, dx_ref, dw_ref), ("forward", "data", "weight")):
        out = jax.jit(op)(x, w, dy)
        assert out.dtype == jnp.bfloat16
        h.assert_close(out, ref, jnp.bfloat16)
        assert library.TARGETS[kernel] in jax.jit(op).lower(x, w, dy).as_text()


# a bfloat16 XIO filter of 1.2 MiB (256 x 256 x 3x3), above every move's threshold
BF16_DEEP = (2, "NXC", "XIO", 1, 256, 256, (6, 5), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))


@needs_onednn
@pytest.mark.skipif(not BF16, reason=f"oneDNN computes {list(library.status().dtypes)} here: "
                    f"bfloat16 needs AVX-512 BF16 or AMX (ISA {library.status().isa})")
@pytest.mark.parametrize("kernel", ["forward", "data"])
def test_bfloat16_calls_move_xio_filters_themselves(kernel):
    """A bfloat16 forward or data gradient of an XIO filter moves the filter into the
    primitive's layout by the handler's own transposes (pairs of I innermost for the forward's
    kernels, pairs of O for the data gradient's); each equals a float64 oracle on the same
    rounded operands at bfloat16's bound."""
    x, w, dy, attrs, refs = _problem(BF16_DEEP, seed=6, dtype=jnp.bfloat16)
    op = {"forward": lambda: jaxconv.convolution(x, w, **attrs, lowering="onednn"),
          "data": lambda: jaxconv.convolution_backward_data(dy, w, x.shape, **attrs,
                                                            lowering="onednn")}[kernel]
    before = library.cache_stats()
    h.assert_close(op(), refs[("forward", "data").index(kernel)], jnp.bfloat16)
    after = library.cache_stats()
    assert after["filter_transposes"] > before["filter_transposes"]


@needs_onednn
def test_conv_transpose_and_openvino_ops_through_onednn():
    rng = np.random.default_rng(1)
    x = h.random(rng, (2, 6, 5, 4))          # NXC, IC = 4
    w = h.random(rng, (4, 3, 3, 3))          # IOX (IC, OC/g, K, K), groups 1 -> OC = 3
    kw = dict(strides=2, pads_begin=1, pads_end=0, output_padding=1, filter_format="IOX")
    y = jaxconv.conv_transpose(x, w, **kw, lowering="onednn")
    h.assert_close(y, jaxconv.conv_transpose(x, w, **kw, precision=HIGHEST, lowering="grid"),
                   jnp.float32)
    xo = h.random(rng, (1, 4, 6, 6))
    wo = h.random(rng, (2, 2, 3, 3, 3))     # G=2, C_IN=2, C_OUT=3
    got = jaxconv.group_convolution_backprop_data(xo, wo, strides=2, lowering="onednn")
    h.assert_close(got, jaxconv.group_convolution_backprop_data(xo, wo, strides=2,
                                                                precision=HIGHEST), jnp.float32)


@needs_onednn
def test_derivatives_to_order_2_and_vmap():
    m = MATRIX[1]
    x, w, dy, attrs, _ = _problem(m, seed=2)

    def f(x, w):
        return jaxconv.convolution(x, w, **attrs, lowering="onednn")

    h.check_grads(f, (x, w), order=2)
    batched = jax.vmap(f, in_axes=(None, 0))(x, jnp.stack([w, 2 * w]))
    h.assert_close(batched[1], 2 * f(x, w), jnp.float32)
    gw = jax.vmap(jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), 1), in_axes=(0, None))(
        jnp.stack([x, -x]), w)
    h.assert_close(gw[0], gw[1], jnp.float32)
