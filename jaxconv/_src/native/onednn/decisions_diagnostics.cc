// decisions.h's pure decisions on plain numbers, for ctypes: tests/native/test_decisions.py
// calls them one by one (jaxconv/_src/native/library.py loads the handler).
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "decisions.h"
#include "filter_move.h"
#include "linger.h"
#include "problem.h"
#include "threading.h"

using namespace jaxconv_onednn;  // NOLINT: this file only exports C functions

namespace {

// A problem of the given NCX / OIX shapes (data_axes and filter_axes in that order unless
// given), float32.
Problem PlainProblem(int kernel, int rank, const int64_t* x, const int64_t* y, const int64_t* w,
                     const int64_t* data_axes) {
  Problem p;
  p.kernel = static_cast<Kernel>(kernel);
  p.x_dims.assign(x, x + rank);
  p.y_dims.assign(y, y + rank);
  p.w_dims.assign(w, w + rank);
  for (int a = 0; a < rank; ++a) {
    p.data_axes.push_back(data_axes != nullptr ? data_axes[a] : a);
    p.filter_axes.push_back(a);
  }
  p.strides.assign(rank - 2, 1);
  p.dilations.assign(rank - 2, 1);
  p.pads_begin.assign(rank - 2, 0);
  p.pads_end.assign(rank - 2, 0);
  return p;
}

}  // namespace

extern "C" {

// Chunks of a float32 problem of kernel 0/1/2 (forward, data, weight) with NCX / OIX buffer
// shapes of `rank` axes (`data_axes`: the buffers' role axes, or null for N, C, X...).
int64_t jaxconv_onednn_decide_chunks(int kernel, int rank, const int64_t* x, const int64_t* y,
                                     const int64_t* w, const int64_t* data_axes,
                                     int64_t pool_threads, int openmp) {
  return Chunks(PlainProblem(kernel, rank, x, y, w, data_axes), pool_threads, openmp != 0);
}

// Calls from now on plan their chunks for `threads` pool threads (0: XLA's pool's), run on
// the pool there is (threading.h, PlanForPoolThreads): the tests' stand-in for more cores.
void jaxconv_onednn_plan_for_pool_threads(int64_t threads) { PlanForPoolThreads(threads); }

// Pool threads linger `ns` after a split call's chunks (linger.h, SetLinger; < 0: kLinger).
void jaxconv_onednn_set_linger(int64_t ns) { SetLinger(std::chrono::nanoseconds(ns)); }

// Winograd's forwards on XLA's pool (1), on the team (0), or by the rule (-1): SetWinogradPool.
void jaxconv_onednn_set_winograd_pool(int mode) { SetWinogradPool(mode); }

// Whether a `kernel` (0 forward, 1 data gradient) of x (1, x_rows, 8, 4) (NHWC) by a filter of
// `taps` rows splits its rows (SplitsRows), and the chunk [begin, end)'s RowChunk into `span`
// (x_begin, x_end, y_begin, y_end, pad_begin, pad_end); its ok() returned as 2 (else 0 or 1).
int jaxconv_onednn_decide_row_chunk(int kernel, int64_t x_rows, int64_t taps, int64_t stride,
                                    int64_t dilation, int64_t pb, int64_t pe, int64_t begin,
                                    int64_t end, int64_t* span) {
  const int64_t y_rows = (x_rows + pb + pe - (taps - 1) * dilation - 1) / stride + 1;
  const int64_t x[] = {1, x_rows, 8, 4}, y[] = {1, y_rows, 8, 4}, w[] = {4, 4, taps, 1},
                axes[] = {0, 3, 1, 2};
  Problem p = PlainProblem(kernel, 4, x, y, w, axes);
  p.strides[0] = stride, p.dilations[0] = dilation, p.pads_begin[0] = pb, p.pads_end[0] = pe;
  const RowSpan r = RowChunk(p, begin, end);
  const int64_t out[] = {r.x_begin, r.x_end, r.y_begin, r.y_end, r.pad_begin, r.pad_end};
  std::memcpy(span, out, sizeof(out));
  return SplitsRows(p) ? (r.ok() ? 2 : 1) : 0;
}

// Parts of a product of m x n over k on `pool_threads` threads (ProductParts), or 0 where it
// runs on the team (ProductOnPool).
int64_t jaxconv_onednn_decide_product_parts(int64_t m, int64_t n, int64_t k, int float32,
                                            int64_t pool_threads) {
  if (!ProductOnPool(m, n, float32 != 0)) return 0;
  return ProductParts(m, n, k, float32 ? 4 : 2, pool_threads);
}

int jaxconv_onednn_decide_spin(int64_t finished, int64_t chunks, int64_t waited_ns) {
  return KeepSpinning(finished, chunks, std::chrono::nanoseconds(waited_ns)) ? 1 : 0;
}

int jaxconv_onednn_decide_linger(int64_t gap_ns, int64_t since_team_ns) {
  return Lingers(std::chrono::nanoseconds(gap_ns), std::chrono::nanoseconds(since_team_ns)) ? 1
                                                                                             : 0;
}

int jaxconv_onednn_decide_winograd_pool(int weight) { return WinogradOnPool(weight != 0) ? 1 : 0; }

// The trial's decisions for `n` candidates: which race after warm-ups `warmup` (into
// `racing`), whether the trial ends after `round` rounds with `spent` seconds each, and the
// one kept given each candidate's `best` time and what it `moves` (0, 1, 2: decisions.h).
void jaxconv_onednn_decide_racing(const double* warmup, int n, int* racing) {
  const std::vector<bool> r = Racing(std::vector<double>(warmup, warmup + n));
  for (int c = 0; c < n; ++c) racing[c] = r[c] ? 1 : 0;
}

int jaxconv_onednn_decide_trial_done(int round, const double* spent, const int* racing, int n) {
  return TrialDone(round, std::vector<double>(spent, spent + n),
                   std::vector<bool>(racing, racing + n)) ? 1 : 0;
}

int64_t jaxconv_onednn_decide_pick(const double* best, const double* noise, const int* racing,
                                   const int* moves, int n, double macs) {
  return static_cast<int64_t>(Pick(std::vector<double>(best, best + n),
                                   std::vector<double>(noise, noise + n),
                                   std::vector<bool>(racing, racing + n),
                                   std::vector<int>(moves, moves + n), macs));
}

double jaxconv_onednn_decide_noise(const double* samples, int n) {
  return Noise(std::vector<double>(samples, samples + n));
}

// The filter-move plan between an XIO filter (dims O, I, X...; `xio_strides`) and a blocked
// layout (`blk_strides`, `nblks` inner blocks `blks` of dims `idxs`), elements of `element`
// bytes, both unpadded, into the blocked layout (`into`) or out of it: the MoveKind (0 where
// off) with O's and I's offset tables in `o_off` (O entries) and `i_off` (I entries).
int jaxconv_onednn_decide_filter_move(int n, const int64_t* dims, const int64_t* xio_strides,
                                      const int64_t* blk_strides, int nblks, const int64_t* blks,
                                      const int64_t* idxs, int element, int into, int64_t* o_off,
                                      int64_t* i_off) {
  Blocking xio, blk;
  xio.dims.assign(dims, dims + n);
  blk.dims = xio.dims;
  xio.strides.assign(xio_strides, xio_strides + n);
  blk.strides.assign(blk_strides, blk_strides + n);
  blk.inner_blks.assign(blks, blks + nblks);
  blk.inner_idxs.assign(idxs, idxs + nblks);
  for (Blocking* b : {&xio, &blk}) {
    b->element = element;
    b->padded = b->dims;
    b->blocked = b->offset0 = true;
  }
  const FilterMove t = PlanFilterMove(xio, blk, into != 0);
  if (t.kind == MoveKind::kOff) return 0;
  std::memcpy(o_off, t.o_off.data(), t.o_off.size() * sizeof(int64_t));
  std::memcpy(i_off, t.i_off.data(), t.i_off.size() * sizeof(int64_t));
  return static_cast<int>(t.kind);
}

}  // extern "C"
