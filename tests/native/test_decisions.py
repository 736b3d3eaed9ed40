"""The handler's pure decisions, one test each, called directly (no primitive runs or pass).

``jaxconv/_src/native/onednn/decisions.h`` holds oneDNN's, ``native/winograd/winograd_decisions.h``
Winograd's; ``native/onednn/decisions_diagnostics.cc`` exports each on
plain numbers. They need the built handler (``jaxconv build-onednn``), and are skipped, with
that reason, where it is not loaded.
"""

from __future__ import annotations

import ctypes

import pytest

from jaxconv._src.native import library

LIB = library.handler()
pytestmark = pytest.mark.skipif(LIB is None, reason="the oneDNN handler is not built/loaded")

I64 = ctypes.c_int64
FORWARD, DATA, WEIGHT = 0, 1, 2


def _arr(kind, values):
    return (kind * len(values))(*values)


def chunks(kernel, x, y, w, pool_threads=2, openmp=True, data_axes=None):
    fn = LIB.jaxconv_onednn_decide_chunks
    fn.restype = I64
    fn.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.POINTER(I64)] * 4 + [I64, ctypes.c_int]
    axes = None if data_axes is None else _arr(I64, data_axes)
    return fn(kernel, len(x), _arr(I64, x), _arr(I64, y), _arr(I64, w), axes, pool_threads,
              int(openmp))


def test_chunks_split_the_batch_only_where_a_thread_pays():
    # NCX / OIX shapes
    tiny = ((8, 4, 6, 6), (8, 4, 6, 6), (4, 4, 1, 1))         # far below a work unit
    wide = ((8, 64, 56, 56), (8, 64, 56, 56), (64, 64, 3, 3))  # 1.8e9 multiply-adds
    heavy_filter = ((8, 512, 5, 5), (8, 512, 5, 5), (512, 512, 3, 3))
    assert chunks(FORWARD, *tiny) == 1               # whole, on the calling thread
    assert chunks(FORWARD, *wide) == 2               # one chunk per pool thread
    assert chunks(DATA, *wide, pool_threads=4) == 4
    assert chunks(FORWARD, *heavy_filter) == 0       # the filter outweighs a chunk: OpenMP
    # from a quarter of a work unit, two chunks (kSplitMinUnits), as one example's rows: the
    # MNIST CNN's 3x3 1 -> 32 at 28x28, batch 8 (0.74 units)
    small = ((8, 1, 28, 28), (8, 32, 26, 26), (32, 1, 3, 3))
    assert chunks(FORWARD, *small) == 2
    assert chunks(DATA, *small) == 2
    # a filter that outweighs a chunk below one unit: whole, not the team (0.5 units)
    assert chunks(FORWARD, (8, 256, 1, 2), (8, 256, 1, 2), (256, 256, 1, 1)) == 1
    assert chunks(WEIGHT, *wide) == 0                # a weight gradient: one OpenMP call
    assert chunks(WEIGHT, *tiny) == 1
    one = ((1, 64, 56, 56), (1, 64, 56, 56), (64, 64, 3, 3))
    assert chunks(FORWARD, *one) == 0                # one large example: the team
    assert chunks(FORWARD, *wide, openmp=False) == 0  # no OpenMP found: oneDNN's own call
    assert chunks(FORWARD, *wide, data_axes=(1, 0, 2, 3)) == 0  # batch not the outer axis


def test_a_forward_of_one_example_splits_its_rows_where_they_are_outer():
    # NHWC buffers (N, H, W, C): one example's rows are contiguous
    nhwc = (0, 3, 1, 2)
    one = ((1, 56, 56, 64), (1, 56, 56, 64), (64, 64, 1, 1))
    heavy_filter = ((1, 7, 7, 512), (1, 7, 7, 2048), (2048, 512, 1, 1))
    assert chunks(FORWARD, *one, data_axes=nhwc) == 2        # one chunk of rows per thread
    assert chunks(FORWARD, *one, data_axes=nhwc, pool_threads=8) == 6  # one per work unit
    assert chunks(FORWARD, *heavy_filter, data_axes=nhwc) == 2  # rows split all the same
    assert chunks(DATA, *one, data_axes=nhwc) == 2           # a data gradient's: x's rows
    # a data gradient whose filter holds over 8 times x and y: not its rows (each chunk would
    # read the whole filter) but x's channels, equal chunks of multiples of 16 (SplitsChannels);
    # DCGAN's 4x4 512 -> 256 at 4x4, 85 times
    assert chunks(DATA, *heavy_filter, data_axes=nhwc) == 2  # 8.4 times
    dcgan = ((1, 8, 8, 256), (1, 4, 4, 512), (512, 256, 4, 4))
    assert chunks(DATA, *dcgan, data_axes=nhwc) == 2
    assert chunks(DATA, *dcgan, data_axes=nhwc, pool_threads=8) == 8   # 32 channels each
    assert chunks(DATA, *dcgan, data_axes=nhwc, pool_threads=3) == 2   # 3 do not divide 256
    assert chunks(DATA, *dcgan, data_axes=nhwc, pool_threads=1) == 0   # one thread: the team
    nchw = ((1, 256, 8, 8), (1, 512, 4, 4), (512, 256, 4, 4))
    assert chunks(DATA, *nchw) == 0                          # NCHW: the team
    odd = ((1, 8, 8, 48), (1, 4, 4, 512), (512, 48, 4, 4))   # 48 channels: not two of 16s
    assert chunks(DATA, *odd, data_axes=nhwc) == 0
    assert chunks(FORWARD, *dcgan, data_axes=nhwc) == 2
    assert chunks(WEIGHT, *one, data_axes=nhwc) == 0         # a weight gradient: the team
    assert chunks(FORWARD, *one) == 0                        # NCHW: rows are not contiguous
    one_row = ((1, 1, 3136, 64), (1, 1, 3136, 64), (64, 64, 1, 1))
    assert chunks(FORWARD, *one_row, data_axes=nhwc) == 0    # one row: the team
    # one to two work units: two chunks of rows, not the team (the MNIST CNN's 3x3 32 -> 64
    # at 14x14, 1.7 units; MobileNetV2's depthwise 192 at 28x28, 1.2 units of bytes)
    mnist = ((1, 14, 14, 32), (1, 14, 14, 64), (64, 32, 3, 3))
    assert chunks(FORWARD, *mnist, data_axes=nhwc) == 2
    assert chunks(FORWARD, *mnist, data_axes=nhwc, pool_threads=1) == 0
    depthwise = ((1, 28, 28, 192), (1, 28, 28, 192), (192, 1, 3, 3))
    assert chunks(FORWARD, *depthwise, data_axes=nhwc) == 2
    # one example's rows split from a quarter of a unit (kSplitMinUnits), as a batch's
    # examples do: MobileNetV2's depthwise 384 at 14x14 (0.57 units of bytes) keeps the
    # pool's thread awake for the 1x1 after it
    small = ((1, 14, 14, 384), (1, 14, 14, 384), (384, 1, 3, 3))
    assert chunks(FORWARD, *small, data_axes=nhwc) == 2
    assert chunks(DATA, *small, data_axes=nhwc) == 2
    assert chunks(FORWARD, (2, 384, 14, 7), (2, 384, 14, 7), (384, 1, 3, 3)) == 2
    tiny = ((1, 7, 7, 64), (1, 7, 7, 64), (64, 1, 3, 3))  # 0.05 units: whole
    assert chunks(FORWARD, *tiny, data_axes=nhwc) == 1


def test_a_batch_of_fewer_examples_than_threads_splits_their_rows_too():
    # each example a chunk leaves pool threads idle: its rows split as one example's would on
    # its share of the threads (ResNet-50's and ResNet-18's batch 8 on 16 cores)
    nhwc = (0, 3, 1, 2)
    wide = ((8, 56, 56, 64), (8, 56, 56, 64), (64, 64, 3, 3))  # 55 units an example
    assert chunks(FORWARD, *wide, data_axes=nhwc, pool_threads=16) == 16  # 8 examples x 2
    assert chunks(DATA, *wide, data_axes=nhwc, pool_threads=16) == 16
    assert chunks(FORWARD, *wide, data_axes=nhwc, pool_threads=32) == 32  # x 4
    assert chunks(FORWARD, *wide, data_axes=nhwc, pool_threads=15) == 8   # 1 thread an example
    assert chunks(FORWARD, *wide, data_axes=nhwc, pool_threads=8) == 8    # as before
    assert chunks(FORWARD, *wide, data_axes=nhwc) == 2
    three = ((3, 28, 28, 128), (3, 28, 28, 128), (128, 128, 3, 3))
    assert chunks(FORWARD, *three, data_axes=nhwc, pool_threads=8) == 6   # 3 x 2 (8 // 3)
    assert chunks(FORWARD, *wide, pool_threads=16) == 8  # NCHW: an example's rows are not contiguous
    # the filter outweighs a chunk of the batch: the team, as before
    heavy = ((8, 7, 7, 512), (8, 7, 7, 512), (512, 512, 3, 3))
    assert chunks(FORWARD, *heavy, data_axes=nhwc, pool_threads=16) == 0
    # an example's rows too few for a second chunk (a quarter unit: kSplitMinUnits): the batch
    tiny = ((2, 7, 7, 64), (2, 7, 7, 64), (64, 1, 3, 3))
    assert chunks(FORWARD, *tiny, data_axes=nhwc, pool_threads=16) == 1
    small = ((2, 14, 14, 384), (2, 14, 14, 384), (384, 1, 3, 3))  # 0.57 units an example
    assert chunks(FORWARD, *small, data_axes=nhwc, pool_threads=16) == 4
    # a data gradient whose filter holds over 8 times an example's x and y: its rows do not
    # split (each chunk would read the whole filter), the batch does
    dcgan = ((2, 8, 8, 256), (2, 4, 4, 512), (512, 256, 4, 4))
    assert chunks(DATA, *dcgan, data_axes=nhwc, pool_threads=16) == 0  # the filter: the team
    one_row = ((4, 1, 3136, 64), (4, 1, 3136, 64), (64, 64, 1, 1))  # one row: nothing to split
    assert chunks(FORWARD, *one_row, data_axes=nhwc, pool_threads=16) == 4


def row_chunk(kernel, x_rows, taps, stride, dilation, pad_begin, pad_end, begin, end):
    fn = LIB.jaxconv_onednn_decide_row_chunk
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int] + [I64] * 8 + [ctypes.POINTER(I64)]
    span = (I64 * 6)()
    verdict = fn(kernel, x_rows, taps, stride, dilation, pad_begin, pad_end, begin, end, span)
    return verdict, tuple(span)


@pytest.mark.parametrize("kernel", [FORWARD, DATA])
@pytest.mark.parametrize("x_rows, taps, stride, dilation, pad_begin, pad_end", [
    (56, 1, 1, 1, 0, 0), (56, 3, 1, 1, 1, 1), (224, 3, 2, 1, 1, 1), (224, 7, 2, 1, 3, 2),
    (17, 3, 2, 2, 2, 0), (9, 5, 3, 1, 0, 4), (12, 2, 4, 1, 1, 0), (7, 3, 1, 3, 6, 6),
    (32, 4, 2, 1, 1, 1), (64, 4, 2, 1, 1, 1), (31, 3, 2, 1, 0, 0),
])
def test_a_row_chunk_is_the_convolution_of_its_rows(kernel, x_rows, taps, stride, dilation,
                                                     pad_begin, pad_end):
    # Output row o, tap t reads x's row g = o * stride - pad_begin + t * dilation (a pad where
    # g is outside x). In a chunk, its output o - y_begin, tap t reads the chunk's row
    # (o - y_begin) * stride - chunk pad + t * dilation: the same row of x where that is in the
    # chunk, else a pad. A forward's chunk has every row its outputs read; a data gradient's,
    # every output whose window reaches its rows.
    y_rows = (x_rows + pad_begin + pad_end - (taps - 1) * dilation - 1) // stride + 1
    along = y_rows if kernel == FORWARD else x_rows
    for chunks in (1, 2, 3, along):
        for i in range(chunks):
            begin, end = i * along // chunks, (i + 1) * along // chunks
            if begin == end:
                continue
            verdict, (xb, xe, yb, ye, pb, pe) = row_chunk(
                kernel, x_rows, taps, stride, dilation, pad_begin, pad_end, begin, end)
            assert verdict >= 1
            if verdict == 1:  # not ok: a chunk without rows, or a negative pad
                assert xe <= xb or ye <= yb or pb < 0 or pe < 0
                continue
            assert (xb, xe) == (begin, end) if kernel == DATA else (yb, ye) == (begin, end)
            assert 0 <= xb < xe <= x_rows and 0 <= yb < ye <= y_rows
            rows = xe - xb  # the chunk's output size, as oneDNN computes it
            assert (rows + pb + pe - (taps - 1) * dilation - 1) // stride + 1 == ye - yb
            assert (rows + pb + pe - (taps - 1) * dilation - 1) % stride == 0 or kernel == FORWARD
            for o in range(y_rows):
                for t in range(taps):
                    g = o * stride - pad_begin + t * dilation
                    if yb <= o < ye:
                        local = (o - yb) * stride - pb + t * dilation
                        if xb <= g < xe:
                            assert local == g - xb
                        else:
                            assert not 0 <= local < rows
                            assert kernel == DATA or not 0 <= g < x_rows
                    elif xb <= g < xe:
                        assert kernel == FORWARD  # a data gradient's chunk misses no output


def test_rows_split_only_where_every_chunk_has_rows_and_pads():
    # (Chunks then runs the call on the team)
    assert row_chunk(FORWARD, 8, 3, 1, 1, 3, 3, 0, 1)[0] == 1  # padded by 3: y's first row
    assert row_chunk(FORWARD, 8, 3, 1, 1, 3, 3, 0, 6)[0] == 2  # reads pads alone
    assert row_chunk(DATA, 10, 3, 2, 1, 0, 0, 9, 10)[0] == 1   # stride 2: no output reads row 9
    assert row_chunk(DATA, 10, 3, 2, 1, 0, 0, 5, 9)[0] == 2


def test_spin_lasts_until_the_chunks_end_or_200_us():
    fn = LIB.jaxconv_onednn_decide_spin
    fn.argtypes = [I64, I64, I64]
    assert fn(1, 2, 50_000) == 1
    assert fn(2, 2, 50_000) == 0       # every chunk finished
    assert fn(1, 2, 199_999) == 1
    assert fn(1, 2, 200_000) == 0      # kSpin: then asleep


def test_pool_threads_linger_after_split_calls_within_50_us_while_the_team_is_idle():
    fn = LIB.jaxconv_onednn_decide_linger
    fn.argtypes = [I64, I64]
    quiet = 10**12                        # no team call for a thousand seconds
    assert fn(5_000, quiet) == 1          # a batch-1 forward's calls: 5-20 us apart
    assert fn(49_999, quiet) == 1
    assert fn(50_000, quiet) == 0         # kLingerGap: XLA's own work between them
    assert fn(90_000, quiet) == 0         # a training step's closest
    assert fn(5_000, 19_999_999) == 0     # a team call within kLingerAfterTeam (20 ms)
    assert fn(5_000, 20_000_000) == 1


def test_winograds_forward_runs_on_xlas_pool_and_its_weight_gradient_on_the_team():
    fn = LIB.jaxconv_onednn_decide_winograd_pool
    fn.argtypes = [ctypes.c_int]
    assert fn(0) == 1                     # a forward (and a data gradient): parts on the pool
    assert fn(1) == 0                     # a weight gradient: the team, beside the step's others


def test_a_product_runs_in_one_part_per_work_unit_and_pool_thread():
    """ProductOnPool and ProductParts: a float32 product, and a bfloat16 one of at most 16 rows
    or columns (a serving batch's dense layer), in parts on XLA's pool, one per work unit (its
    matrices' bytes count: memory-bound; two from one unit on), at most one per pool thread
    and one per 16 rows or columns, a small one whole on the calling thread; a larger bfloat16
    one on the team (0)."""
    fn = LIB.jaxconv_onednn_decide_product_parts
    fn.argtypes = [I64, I64, I64, ctypes.c_int, I64]
    fn.restype = I64
    assert fn(1, 1000, 1280, 1, 2) == 2      # MobileNetV2's classifier: 5.1 MB of weights
    assert fn(1, 1000, 1280, 1, 16) == 4     # 4.9 units
    assert fn(1, 1000, 512, 1, 16) == 2      # ResNet-18's: 2.05 MB, 1.96 units: two
    assert fn(1, 256, 3136, 1, 16) == 3      # the MNIST CNN's first dense layer: 3.2 MB
    assert fn(1, 10, 256, 1, 16) == 1        # its second: 10 KB, whole
    assert fn(8, 10, 256, 1, 2) == 1
    assert fn(1, 20, 100_000, 1, 16) == 2    # 20 columns: two blocks of 16 at most
    assert fn(4096, 16, 4096, 1, 16) == 16   # rows: 256 blocks of 16
    assert fn(1, 1000, 1280, 1, 1) == 1      # one pool thread
    assert fn(1, 1000, 1280, 0, 16) == 2     # bfloat16: half the bytes, 2.5 units
    assert fn(16, 1000, 1280, 0, 2) == 2
    assert fn(1, 256, 3136, 0, 16) == 2      # 1.6 MB, 1.5 units: two from one unit on
    assert fn(17, 1000, 1280, 0, 2) == 0     # 17 rows: on the team
    assert fn(512, 1000, 8, 0, 2) == 0       # a training step's kernel gradient


def test_trial_races_times_and_keeps_the_layout_that_moves_least_within_the_margin():
    racing = (ctypes.c_int * 3)()
    LIB.jaxconv_onednn_decide_racing(_arr(ctypes.c_double, [0.001, 0.0035, 0.05]), 3, racing)
    assert list(racing) == [1, 1, 0]   # over 4x the fastest warm-up and over 20 ms: out
    LIB.jaxconv_onednn_decide_racing(_arr(ctypes.c_double, [0.001, 0.01, 0.019]), 3, racing)
    assert list(racing) == [1, 1, 1]   # slower than 4x but under the 20 ms floor: timed

    done = LIB.jaxconv_onednn_decide_trial_done
    done.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int),
                     ctypes.c_int]
    both = _arr(ctypes.c_int, [1, 1])
    assert not done(2, _arr(ctypes.c_double, [1.0, 1.0]), both, 2)    # under 3 rounds
    assert not done(3, _arr(ctypes.c_double, [0.02, 0.005]), both, 2)  # one under 10 ms
    assert done(3, _arr(ctypes.c_double, [0.02, 0.005]), _arr(ctypes.c_int, [1, 0]), 2)
    assert done(25, _arr(ctypes.c_double, [0.0, 0.0]), both, 2)       # at most 25 rounds

    pick = LIB.jaxconv_onednn_decide_pick
    pick.restype = I64
    pick.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double),
                     ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                     ctypes.c_double]
    times = _arr(ctypes.c_double, [1.04e-3, 1.0e-3])  # the caller's layout 4% slower
    steady = _arr(ctypes.c_double, [0.0, 0.0])
    callers = _arr(ctypes.c_int, [1, 2])  # moves: the filter; the activations
    assert pick(times, steady, both, callers, 2, 1e6) == 0     # within 5%: the caller's layout
    assert pick(times, steady, both, callers, 2, 3e8) == 1     # a large problem: a 1% margin
    assert pick(times, steady, _arr(ctypes.c_int, [0, 1]), callers, 2, 1e6) == 1  # not raced
    slower = _arr(ctypes.c_double, [1.2e-3, 1.0e-3])             # 20% slower
    assert pick(slower, steady, both, callers, 2, 1e6) == 1
    # ... but within the margin plus both candidates' noise (8% and 9%): the caller's
    assert pick(slower, _arr(ctypes.c_double, [0.08, 0.09]), both, callers, 2, 1e6) == 0
    assert pick(times, _arr(ctypes.c_double, [0.01, 0.03]), both, callers, 2, 3e8) == 0
    # three: the caller's layouts with oneDNN's filter, blocked activations, and the caller's
    # filter too (nothing moved): the least moved within the margin of the fastest ...
    three, none = _arr(ctypes.c_int, [1, 1, 1]), _arr(ctypes.c_double, [0.0, 0.0, 0.0])
    moves = _arr(ctypes.c_int, [1, 2, 0])
    assert pick(_arr(ctypes.c_double, [1.0e-3, 1.0e-3, 1.04e-3]), none, three, moves, 3, 1e6) == 2
    assert pick(_arr(ctypes.c_double, [1.0e-3, 0.9e-3, 1.0e-3]), none, three, moves, 3, 1e6) == 1
    # ... and of equals the first: the caller's layouts stay where nothing else is faster
    assert pick(_arr(ctypes.c_double, [1.0e-3, 1.0e-3]), steady, both,
                _arr(ctypes.c_int, [1, 1]), 2, 1e6) == 0

    noise = LIB.jaxconv_onednn_decide_noise
    noise.restype = ctypes.c_double
    noise.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.c_int]
    assert noise(_arr(ctypes.c_double, [1.0]), 1) == 0.0
    # the median (1.1) above the best (1.0), over the median
    assert noise(_arr(ctypes.c_double, [1.2, 1.0, 1.1]), 3) == pytest.approx(0.1 / 1.1)
    assert noise(_arr(ctypes.c_double, [1.0, 1.0, 1.0, 1.0]), 4) == 0.0


OFF, TRANSPOSE, TRANSPOSE_ROW_PAIRS, TRANSPOSE_PAIRS, COPY = range(5)  # MoveKind


def test_filter_move_plan_takes_tiles_of_16_channels_only():
    fn = LIB.jaxconv_onednn_decide_filter_move
    fn.argtypes = ([ctypes.c_int] + [ctypes.POINTER(I64)] * 3 + [ctypes.c_int]
                   + [ctypes.POINTER(I64)] * 2 + [ctypes.c_int] * 2 + [ctypes.POINTER(I64)] * 2)
    o, i = 32, 48
    dims = [o, i, 1, 1]
    xio = [1, o, o * i, o * i]              # O innermost, then I (flax's HWIO, 1x1)
    # ABcd16a16b: 16x16 tiles, I innermost in a tile (a: O, b: I); tiles ordered O, I
    blk = [(i // 16) * 256, 256, o * i, o * i]
    o_off, i_off = (I64 * o)(), (I64 * i)()

    def plan(blks, idxs, into, dims=dims, xio=xio, blk=blk, element=4):
        return fn(len(dims), _arr(I64, dims), _arr(I64, xio), _arr(I64, blk), len(blks),
                  _arr(I64, blks), _arr(I64, idxs), element, int(into), o_off, i_off)

    assert plan([16, 16], [0, 1], True) == TRANSPOSE
    # (o, i) sits in tile (o // 16, i // 16) at (o % 16) * 16 + i % 16
    assert o_off[17] == 1 * blk[0] + 1 * 16 and i_off[33] == 2 * blk[1] + 1
    assert plan([16, 16], [1, 0], False) == COPY    # O innermost: the weight gradient's copy
    assert o_off[17] == 1 * blk[0] + 1 and i_off[33] == 2 * blk[1] + 1 * 16
    # the copy of 2-byte rows measured level with oneDNN's reorder: oneDNN's reorder
    assert plan([16, 16], [1, 0], False, element=2) == OFF
    assert plan([16, 16], [1, 0], True) == OFF      # the transpose wants I innermost
    assert plan([32], [1], True) == OFF             # float32 I blocked alone: oneDNN's reorder
    assert plan([8, 8], [0, 1], True) == OFF        # tiles of 8
    assert plan([16, 16], [0, 1], True, element=8) == OFF     # neither 4- nor 2-byte
    odd = [24, i, 1, 1]
    assert plan([16, 16], [0, 1], True, dims=odd, xio=[1, 24, 24 * i, 24 * i]) == OFF
    # 2-byte ABcd8b16a2b (jit_bf16's forward): tiles of 16 O x 16 I, I pairs innermost
    assert plan([8, 16, 2], [1, 0, 1], True, element=2) == TRANSPOSE_ROW_PAIRS
    # (o, i) at ((i % 16) // 2) * 32 + (o % 16) * 2 + i % 2 in its tile
    assert o_off[17] == 1 * blk[0] + 1 * 2 and i_off[35] == 2 * blk[1] + 1 * 32 + 1
    assert plan([8, 16, 2], [1, 0, 1], True) == OFF           # pairs of float32: no such move
    # 2-byte AcdB32a2b (brgconv's forward): O blocks of 32, I an outer dim of pairs
    acdb = [i * 32, 64, o * i, o * i]
    assert plan([32, 2], [0, 1], True, blk=acdb, element=2) == TRANSPOSE_ROW_PAIRS
    assert o_off[17] == 17 * 2 and i_off[35] == 17 * 64 + 1
    # 2-byte BcdA32b2a (a data gradient's): I blocks of 32, O an outer dim of pairs
    bcda = [64, o * 32, o * 32, o * 32]
    assert plan([32, 2], [1, 0], True, dims=[o, 32, 1, 1], xio=[1, o, o * 32, o * 32],
                blk=bcda, element=2) == TRANSPOSE_PAIRS
    assert o_off[17] == 8 * 64 + 1 and i_off[5] == 5 * 2
    # pairs of O over 16 O (not 32): no 16 x 16 tile of pairs
    assert plan([16, 2], [1, 0], True, dims=[16, 32, 1, 1], xio=[1, 16, 512, 512],
                blk=[32, 16 * 16, 512, 512], element=2) == OFF


# ---- Winograd's drivers (native/winograd/winograd_decisions.h) ----

FUSED, STAGED, BLOCKED = 0, 1, 2


def _wino(name, restype, *argtypes):
    fn = getattr(LIB, f"jaxconv_winograd_decide_{name}")
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


def test_winograd_forward_fuses_while_u_fits_then_blocks_small_chunks():
    plan = _wino("plan", ctypes.c_int, ctypes.c_int, ctypes.c_int, I64, I64, I64, I64, I64)
    # U = 36 x C x K floats: 64 x 64 channels (0.6 MB) within 4 MB, 512 x 512 (37.7 MB) not
    assert plan(0, 6, 64, 64, 4096, 4096, 0) == FUSED
    assert plan(0, 6, 512, 512, 32, 32, 0) == BLOCKED      # 32 tiles <= 96: blocks of U
    assert plan(0, 6, 512, 512, 200, 200, 0) == STAGED     # 200 tiles: the whole U
    assert plan(0, 6, 512, 512, 200, 96, 0) == BLOCKED     # chunks of 96 tiles
    assert plan(0, 4, 256, 256, 97, 97, 0) == FUSED        # F(2x2): 16 x 256 x 256 floats, 4 MB
    assert plan(0, 4, 256, 288, 97, 97, 0) == STAGED       # 32 columns more: past 4 MB


def test_winograd_weight_gradient_blocks_where_all_tiles_fit_twice_a_block():
    plan = _wino("plan", ctypes.c_int, ctypes.c_int, ctypes.c_int, I64, I64, I64, I64, I64)
    # dU = 36 x 64 x 64 floats (0.6 MB), within 1 MB: fused
    assert plan(1, 6, 64, 64, 4096, 4096, 48) == FUSED
    # 512 x 512: 37.7 MB of dU; 32 tiles in one chunk, at most 2 x 48: blocked
    assert plan(1, 6, 512, 512, 32, 32, 48) == BLOCKED
    assert plan(1, 6, 512, 512, 97, 97, 48) == STAGED      # more than twice the block's rows
    assert plan(1, 6, 512, 512, 32, 16, 48) == STAGED      # not all tiles in one chunk


def test_winograd_blocks_and_chunks_hold_what_their_bytes_allow():
    chunk = _wino("chunk_tiles", I64, ctypes.c_int, I64, I64, I64, I64)
    # 36 positions x (64 + 64) floats a tile: 18,432 bytes; 64 MB hold 3,640 tiles
    assert chunk(6, 64, 64, 100_000, 64 << 20) == (64 << 20) // (36 * 128 * 4)
    assert chunk(6, 64, 64, 10, 64 << 20) == 10             # never more than the tiles
    assert chunk(6, 4096, 4096, 10, 1024) == 1              # at least one
    forward = _wino("forward_block", I64, ctypes.c_int, I64, I64, I64, ctypes.c_int)
    # 384 KiB / 18,432 bytes: 21 tiles, rounded down to rows of 12
    assert forward(6, 64, 64, 10_000, 12) == 12
    assert forward(6, 16, 32, 10_000, 12) == 384 * 1024 // (36 * 48 * 4) // 12 * 12
    assert forward(6, 64, 64, 5, 12) == 12                  # a few tiles: one block of rows
    weight = _wino("weight_block", I64, ctypes.c_int, I64, I64, I64)
    assert weight(6, 64, 64, 10_000) == 384 * 1024 // (36 * 128 * 4)
    assert weight(6, 4096, 4096, 10_000) == 1


def test_winograd_channel_blocks_keep_every_thread_busy():
    rows = _wino("filter_rows", I64, I64, I64)
    assert rows(64, 2) == 16            # four blocks a thread, at least 16 channels
    assert rows(1024, 2) == 64          # at most kWinogradFilterBlock
    assert rows(512, 2) == 64 and rows(256, 2) == 32
    splits = _wino("row_splits", I64, I64, I64)
    assert splits(2, 8) == 1 and splits(8, 2) == 8 and splits(16, 3) == 11
    weight_rows = _wino("weight_rows", I64, I64, I64, I64, ctypes.c_int)
    assert weight_rows(512, 512, 2, 12) == 48   # 11 x 8 blocks for 2 threads: the full rows
    assert weight_rows(64, 64, 2, 12) == 12     # 64 channels, one column group: smallest rows
    assert weight_rows(256, 64, 2, 12) == 36    # 8 blocks of 36 (4 a thread)
