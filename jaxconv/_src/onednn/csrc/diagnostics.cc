// Plain C functions for ctypes (jaxconv/_src/onednn/library.py): oneDNN's version and ISA, the
// dtypes it computes on this CPU, the cache's state and choices, the machine's measured FMA
// peak, a check of jaxconv's filter moves against oneDNN's reorder, and the pure decisions of
// decisions.h on plain numbers, which tests/test_onednn_decisions.py calls one by one.
#include <immintrin.h>

#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cache.h"
#include "decisions.h"
#include "execute.h"
#include "filter_move.h"
#include "problem.h"
#include "trial.h"
#include "winograd.h"

using namespace jaxconv_onednn;  // NOLINT: this file only exports C functions

namespace {

// The float32 arithmetic peak, measured: every core runs a loop of independent vector FMAs on
// registers (no memory traffic) for about `seconds`; GFLOP/s over all cores. This is cores x
// FMA units x lanes x 2 x the clock the cores actually run at, which a VM's /proc/cpuinfo does
// not tell. One thread's loop: 12 independent accumulators (more than an FMA's latency times
// its units), a * m + c contracted into one FMA each, checked against the clock every 4096
// rounds.
#define JAXCONV_FMA_LOOP(NAME, TARGET, LANES)                                                \
  typedef float NAME##Vec __attribute__((vector_size(4 * LANES)));                          \
  __attribute__((target(TARGET), optimize("fp-contract=fast"))) double NAME(double seconds) { \
    NAME##Vec acc[12], m, c;                                                                 \
    for (int i = 0; i < LANES; ++i) { m[i] = 0.999999f; c[i] = 1e-7f; }                      \
    for (auto& a : acc) a = c;                                                               \
    int64_t rounds = 0;                                                                      \
    double elapsed = 0;                                                                      \
    const auto t0 = std::chrono::steady_clock::now();                                        \
    do {                                                                                     \
      for (int r = 0; r < 4096; ++r) {                                                       \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) acc[i] = acc[i] * m + c;       \
      }                                                                                      \
      rounds += 4096;                                                                        \
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); \
    } while (elapsed < seconds);                                                             \
    float sink = 0;                                                                          \
    for (auto& a : acc) sink += a[0];                                                        \
    volatile float keep = sink;                                                              \
    (void)keep;                                                                              \
    return static_cast<double>(rounds) * 12 * LANES * 2 / elapsed / 1e9;                     \
  }

JAXCONV_FMA_LOOP(Avx2Loop, "avx2,fma", 8)
JAXCONV_FMA_LOOP(Avx512Loop, "avx512f", 16)

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

double jaxconv_fma_peak_gflops(int threads, double seconds, int* lanes) {
  const bool wide = __builtin_cpu_supports("avx512f");
  if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0;
  *lanes = wide ? 16 : 8;
  std::vector<double> each(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { each[t] = wide ? Avx512Loop(seconds) : Avx2Loop(seconds); });
  for (auto& th : pool) th.join();
  double total = 0;
  for (double g : each) total += g;
  return total;
}

int jaxconv_onednn_version(int* out) {
  const dnnl_version_t* v = dnnl_version();
  out[0] = v->major; out[1] = v->minor; out[2] = v->patch;
  return static_cast<int>(dnnl_get_effective_cpu_isa());
}

// Whether oneDNN on this CPU creates all three kernels' primitives for dtype 0 (f32), 1 (bf16)
// or 2 (f16) on a small grouped, strided 2D problem: the ISA gates the 16-bit types.
int jaxconv_onednn_supports(int dtype) {
  const memory::data_type types[] = {memory::data_type::f32, memory::data_type::bf16,
                                     memory::data_type::f16};
  if (dtype < 0 || dtype > 2) return 0;
  Problem p;
  p.dtype = types[dtype];
  p.groups = 2;
  p.x_dims = {2, 8, 9, 9}; p.y_dims = {2, 8, 5, 5}; p.w_dims = {8, 4, 3, 3};
  p.data_axes = {0, 1, 2, 3}; p.filter_axes = {0, 1, 2, 3};
  p.strides = {2, 2}; p.dilations = {1, 1}; p.pads_begin = {1, 1}; p.pads_end = {1, 1};
  for (Kernel k : {Kernel::kForward, Kernel::kData, Kernel::kWeight}) {
    p.kernel = k;
    try {
      Choose(p);
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 1;
}

void jaxconv_onednn_cache_stats(int64_t* out) {
  TheCache().Stats(out);
  out[4] = reference_skipped;
  out[5] = reference_trials;
  out[6] = filter_transposes;
  out[7] = filter_copies;
}

// jaxconv's own move of a filter between the caller's XIO layout and oneDNN's blocked one
// against oneDNN's reorder of the same values (the oracle), for an O x I filter with `taps`
// spatial extents (1 to 3 of them) and the blocked layout's inner blocks `blocks` ("16a16b",
// "32a32b": I innermost, the transpose from XIO; "16b16a", ...: O innermost, the copy into
// XIO; "32b", ...: I blocked alone, which keeps oneDNN's reorder). 1 where the two outputs are
// equal bit for bit, 0 where not, -1 where the plan does not apply (or the name is unknown).
int jaxconv_onednn_check_filter_move(const char* blocks, int64_t o, int64_t i,
                                     const int64_t* taps, int n) {
  if (n < 1 || n > 3) return -1;
  using tag = memory::format_tag;
  struct Layout {
    const char* blocks;
    tag tags[3];  // 1D, 2D, 3D filters
  };
  static const Layout layouts[] = {
      {"16a16b", {tag::ABc16a16b, tag::ABcd16a16b, tag::ABcde16a16b}},
      {"32a32b", {tag::ABc32a32b, tag::ABcd32a32b, tag::ABcde32a32b}},
      {"16b", {tag::Bca16b, tag::Bcda16b, tag::Bcdea16b}},
      {"32b", {tag::Bca32b, tag::Bcda32b, tag::Bcdea32b}},
      {"48b", {tag::Bca48b, tag::Bcda48b, tag::Bcdea48b}},
      {"64b", {tag::Bca64b, tag::Bcda64b, tag::Bcdea64b}},
      {"16b16a", {tag::ABc16b16a, tag::ABcd16b16a, tag::ABcde16b16a}},
      {"16b32a", {tag::ABc16b32a, tag::ABcd16b32a, tag::ABcde16b32a}},
      {"16b64a", {tag::ABc16b64a, tag::ABcd16b64a, tag::ABcde16b64a}},
  };
  const Layout* layout = nullptr;
  for (const Layout& l : layouts)
    if (std::string_view(l.blocks) == blocks) layout = &l;
  if (layout == nullptr) return -1;
  const bool copy = std::string_view(blocks).back() == 'a';
  memory::dims dims = {o, i};
  for (int a = 0; a < n; ++a) dims.push_back(taps[a]);
  memory::dims strides(dims.size());  // O innermost, then I, then the spatial axes
  strides[0] = 1;
  strides[1] = o;
  int64_t size = o * i;
  for (int a = static_cast<int>(dims.size()) - 1; a >= 2; --a) {
    strides[a] = size;
    size *= dims[a];
  }
  const memory::desc xio(dims, memory::data_type::f32, strides);
  const memory::desc blocked(dims, memory::data_type::f32, layout->tags[n - 1]);
  const memory::desc& from = copy ? blocked : xio;
  const memory::desc& to = copy ? xio : blocked;
  const FilterMove t = copy ? PlanFilterCopy(from, to) : PlanFilterTranspose(from, to);
  if (!t.on) return -1;
  memory src(from, Engine()), want(to, Engine());
  const AlignedBytes got = Allocate(to.get_size(), true);
  auto* in = static_cast<float*>(src.get_data_handle());
  for (int64_t e = 0; e < size; ++e) in[e] = static_cast<float>(e % 1009) - 504.5f;
  dnnl::stream& s = Stream();
  dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to))
      .execute(s, src, want);
  s.wait();
  if (copy) RunFilterCopy(t, in, got.get());
  else RunFilterTranspose(t, in, got.get());
  return std::memcmp(got.get(), want.get_data_handle(), to.get_size()) == 0 ? 1 : 0;
}

// The cache's choices (Cache::Choices) into `out` of `size` bytes, NUL-terminated where it
// fits; the bytes they need, without the NUL.
int64_t jaxconv_onednn_choices(char* out, int64_t size) {
  const std::string text = TheCache().Choices();
  if (size > static_cast<int64_t>(text.size())) std::memcpy(out, text.c_str(), text.size() + 1);
  return static_cast<int64_t>(text.size());
}

void jaxconv_onednn_set_cache_capacity(int64_t capacity) { TheCache().SetCapacity(capacity); }

// The Winograd passes' vector ISA (0 AVX-512, 1 AVX2, 2 neither), and their chunk size in
// bytes (0: the default), for the tests.
int jaxconv_winograd_isa() { return WinogradIsa(); }
void jaxconv_winograd_set_chunk_bytes(int64_t bytes) {
  SetWinogradChunkBytes(static_cast<size_t>(bytes));
}

// ---- decisions.h on plain numbers ----

// Chunks of a float32 problem of kernel 0/1/2 (forward, data, weight) with NCX / OIX buffer
// shapes of `rank` axes (`data_axes`: the buffers' role axes, or null for N, C, X...).
int64_t jaxconv_onednn_decide_chunks(int kernel, int rank, const int64_t* x, const int64_t* y,
                                     const int64_t* w, const int64_t* data_axes,
                                     int64_t pool_threads, int openmp) {
  return Chunks(PlainProblem(kernel, rank, x, y, w, data_axes), pool_threads, openmp != 0);
}

int jaxconv_onednn_decide_spin(int64_t finished, int64_t chunks, int64_t waited_ns) {
  return KeepSpinning(finished, chunks, std::chrono::nanoseconds(waited_ns)) ? 1 : 0;
}

// The trial's decisions for `n` candidates: which race after warm-ups `warmup` (into
// `racing`), whether the trial ends after `round` rounds with `spent` seconds each, and the
// one kept given each candidate's `best` time and whether it is `on_callers`' layouts.
void jaxconv_onednn_decide_racing(const double* warmup, int n, int* racing) {
  const std::vector<bool> r = Racing(std::vector<double>(warmup, warmup + n));
  for (int c = 0; c < n; ++c) racing[c] = r[c] ? 1 : 0;
}

int jaxconv_onednn_decide_trial_done(int round, const double* spent, const int* racing, int n) {
  return TrialDone(round, std::vector<double>(spent, spent + n),
                   std::vector<bool>(racing, racing + n)) ? 1 : 0;
}

int64_t jaxconv_onednn_decide_pick(const double* best, const int* racing,
                                   const int* on_callers, int n, double macs) {
  return static_cast<int64_t>(Pick(std::vector<double>(best, best + n),
                                   std::vector<bool>(racing, racing + n),
                                   std::vector<bool>(on_callers, on_callers + n), macs));
}

// The filter-move plan between an XIO filter (dims O, I, X...; `xio_strides`) and a blocked
// layout (`blk_strides`, `nblks` inner blocks `blks` of dims `idxs`), float32, both unpadded:
// 1 with O's and I's offset tables in `o_off` (O entries) and `i_off` (I entries), 0 where off.
int jaxconv_onednn_decide_filter_move(int n, const int64_t* dims, const int64_t* xio_strides,
                                      const int64_t* blk_strides, int nblks, const int64_t* blks,
                                      const int64_t* idxs, int i_inner, int64_t* o_off,
                                      int64_t* i_off) {
  Blocking xio, blk;
  xio.dims.assign(dims, dims + n);
  blk.dims = xio.dims;
  xio.strides.assign(xio_strides, xio_strides + n);
  blk.strides.assign(blk_strides, blk_strides + n);
  blk.inner_blks.assign(blks, blks + nblks);
  blk.inner_idxs.assign(idxs, idxs + nblks);
  for (Blocking* b : {&xio, &blk}) b->f32 = b->blocked = b->unpadded = b->offset0 = true;
  const FilterMove t = PlanFilterMove(xio, blk, i_inner != 0);
  if (!t.on) return 0;
  std::memcpy(o_off, t.o_off.data(), t.o_off.size() * sizeof(int64_t));
  std::memcpy(i_off, t.i_off.data(), t.i_off.size() * sizeof(int64_t));
  return 1;
}

}  // extern "C"
