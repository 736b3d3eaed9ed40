// Plain C functions for ctypes (jaxconv/_src/native/library.py): oneDNN's version and ISA, the
// dtypes it computes on this CPU, the cache's state and choices, the machine's measured FMA
// peak, and a check of jaxconv's filter moves against oneDNN's reorder (decisions.h's pure
// decisions on plain numbers: decisions_diagnostics.cc; Winograd's: winograd_diagnostics.cc).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cache.h"
#include "decisions.h"
#include "execute.h"
#include "filter_move.h"
#include "linger.h"
#include "packed.h"
#include "problem.h"
#include "threading.h"
#include "trial.h"

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

// A filter move's test case (diagnostics' check and timing): an O x I filter with `taps` of
// `element` bytes in XIO and in the blocked layout named by `blocks`, the plan, and oneDNN's
// reorder between them; null where the name is unknown or the plan does not apply.
struct MoveCase {
  memory::desc from, to;
  FilterMove t;
  bool copy = false;
  int element = 0;
  int64_t size = 0;  // elements of the filter
  memory src, want;
  dnnl::reorder reorder;
  AlignedBytes got;

  static std::unique_ptr<MoveCase> Make(const char* blocks, int64_t o, int64_t i,
                                        const int64_t* taps, int n, int element) {
    if (n < 1 || n > 3 || (element != 4 && element != 2)) return nullptr;
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
        // the 2-byte layouts of bfloat16 kernels (brgconv's, jit_bf16's)
        {"16a2b", {tag::AcB16a2b, tag::AcdB16a2b, tag::AcdeB16a2b}},
        {"32a2b", {tag::AcB32a2b, tag::AcdB32a2b, tag::AcdeB32a2b}},
        {"48a2b", {tag::AcB48a2b, tag::AcdB48a2b, tag::AcdeB48a2b}},
        {"64a2b", {tag::AcB64a2b, tag::AcdB64a2b, tag::AcdeB64a2b}},
        {"8b16a2b", {tag::ABc8b16a2b, tag::ABcd8b16a2b, tag::ABcde8b16a2b}},
        {"32b2a", {tag::BcA32b2a, tag::BcdA32b2a, tag::BcdeA32b2a}},
        {"48b2a", {tag::BcA48b2a, tag::BcdA48b2a, tag::BcdeA48b2a}},
        {"64b2a", {tag::BcA64b2a, tag::BcdA64b2a, tag::BcdeA64b2a}},
        {"8a16b2a", {tag::BAc8a16b2a, tag::BAcd8a16b2a, tag::BAcde8a16b2a}},
    };
    const Layout* layout = nullptr;
    for (const Layout& l : layouts)
      if (std::string_view(l.blocks) == blocks) layout = &l;
    if (layout == nullptr) return nullptr;
    auto c = std::make_unique<MoveCase>();
    c->element = element;
    // O innermost ("...a"), but not pairs of O ("...b2a"): the copy out of the blocked layout
    const std::string_view name(blocks);
    c->copy = name.back() == 'a' && name.substr(name.size() - 3) != "b2a";
    memory::dims dims = {o, i};
    for (int a = 0; a < n; ++a) dims.push_back(taps[a]);
    memory::dims strides(dims.size());  // O innermost, then I, then the spatial axes
    strides[0] = 1;
    strides[1] = o;
    c->size = o * i;
    for (int a = static_cast<int>(dims.size()) - 1; a >= 2; --a) {
      strides[a] = c->size;
      c->size *= dims[a];
    }
    const memory::data_type dt = element == 4 ? memory::data_type::f32 : memory::data_type::bf16;
    const memory::desc xio(dims, dt, strides);
    const memory::desc blocked(dims, dt, layout->tags[n - 1]);
    c->from = c->copy ? blocked : xio;
    c->to = c->copy ? xio : blocked;
    c->t = c->copy ? PlanFilterCopy(c->from, c->to) : PlanFilterTranspose(c->from, c->to);
    if (c->t.kind == MoveKind::kOff) return nullptr;
    c->src = memory(c->from, Engine());
    c->want = memory(c->to, Engine());
    c->reorder = dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), c->from, Engine(), c->to));
    c->got = Allocate(c->to.get_size(), false);
    c->Fill(0);
    return c;
  }

  // distinct values at every position (bit patterns of finite bfloat16 values where 2-byte),
  // shifted by `shift`
  void Fill(int shift) {
    if (element == 4) {
      auto* in = static_cast<float*>(src.get_data_handle());
      for (int64_t e = 0; e < size; ++e) in[e] = static_cast<float>((e + shift) % 1009) - 504.5f;
    } else {
      auto* in = static_cast<uint16_t*>(src.get_data_handle());
      for (int64_t e = 0; e < size; ++e) in[e] = static_cast<uint16_t>(0x3c00 + (e + shift) % 4093);
    }
  }

  void Move() {
    if (copy) RunFilterCopy(t, src.get_data_handle(), got.get());
    else RunFilterTranspose(t, src.get_data_handle(), got.get());
  }
};

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
  out[8] = packed_reads;
  out[9] = packed_reorders;
  out[10] = lingered_jobs;
  out[11] = winograd_pool_calls;
}

// jaxconv's own move of a filter between the caller's XIO layout and oneDNN's blocked one
// against oneDNN's reorder of the same values (the oracle), for an O x I filter of `element`
// bytes (4: float32, 2: bfloat16) with `taps` spatial extents (1 to 3 of them) and the blocked
// layout's inner blocks `blocks`, as oneDNN's format tags name them ("16a16b", "32a32b": I
// innermost, the transpose from XIO; "16b16a", ...: O innermost, the copy into XIO; "32b",
// ...: I blocked alone; "64a2b", "8b16a2b", ...: pairs of I innermost; "64b2a", "8a16b2a",
// ...: pairs of O innermost). 1 where the two outputs are equal bit for bit, 0 where not, -1
// where the plan does not apply (or the name is unknown).
int jaxconv_onednn_check_filter_move(const char* blocks, int64_t o, int64_t i,
                                     const int64_t* taps, int n, int element) {
  const std::unique_ptr<MoveCase> c = MoveCase::Make(blocks, o, i, taps, n, element);
  if (!c) return -1;
  dnnl::stream& s = Stream();
  c->reorder.execute(s, c->src, c->want);
  s.wait();
  // bytes the move must overwrite, the padding's zeros included
  std::memset(c->got.get(), 0xa5, c->to.get_size());
  c->Move();
  return std::memcmp(c->got.get(), c->want.get_data_handle(), c->to.get_size()) == 0 ? 1 : 0;
}

// The same move's time and oneDNN's reorder's, the best of `reps` calls each, interleaved, the
// source written afresh before each call (as XLA writes a filter before the call that reads
// it), and where `read_after` each followed by a read of the whole result inside the timing
// (as the next operation reads it: streaming stores leave it in memory, not in the caches),
// into `seconds` (jaxconv's, oneDNN's). 1, or -1 where the plan does not apply.
int jaxconv_onednn_time_filter_move(const char* blocks, int64_t o, int64_t i,
                                    const int64_t* taps, int n, int element, int reps,
                                    int read_after, double* seconds) {
  const std::unique_ptr<MoveCase> c = MoveCase::Make(blocks, o, i, taps, n, element);
  if (!c) return -1;
  dnnl::stream& s = Stream();
  seconds[0] = seconds[1] = 1e30;
  volatile uint64_t sink = 0;
  for (int r = 0; r < reps; ++r)
    for (int which = 0; which < 2; ++which) {
      c->Fill(r + which);
      const auto start = std::chrono::steady_clock::now();
      if (which == 0) {
        c->Move();
      } else {
        c->reorder.execute(s, c->src, c->want);
        s.wait();
      }
      if (read_after != 0) {
        const auto* out = static_cast<const uint64_t*>(which == 0 ? c->got.get()
                                                                  : c->want.get_data_handle());
        uint64_t x = 0;
        for (size_t k = 0, words = c->to.get_size() / 8; k < words; ++k) x ^= out[k];
        sink = sink ^ x;
      }
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      seconds[which] = std::min(seconds[which], took.count());
    }
  return 1;
}

// The cache's choices (Cache::Choices) into `out` of `size` bytes, NUL-terminated where it
// fits; the bytes they need, without the NUL.
int64_t jaxconv_onednn_choices(char* out, int64_t size) {
  const std::string text = TheCache().Choices();
  if (size > static_cast<int64_t>(text.size())) std::memcpy(out, text.c_str(), text.size() + 1);
  return static_cast<int64_t>(text.size());
}

void jaxconv_onednn_set_cache_capacity(int64_t capacity) { TheCache().SetCapacity(capacity); }

// Earlier processes' layout verdicts (trial.h, Remember), one per line of `text`: the
// problem's key text, the activations (0 caller, 1 any, 2 blocked, 3 the caller's filter too,
// 4 tap products) and the impl, separated
// by tabs; lines that do not parse are skipped. The number remembered.
int64_t jaxconv_onednn_remember(const char* text) {
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key, where, impl;
    if (!std::getline(fields, key, '\t') || !std::getline(fields, where, '\t') ||
        !std::getline(fields, impl) || key.empty() || impl.empty() ||
        where.size() != 1 || where[0] < '0' || where[0] > '4')
      continue;
    Remember(key, static_cast<Activations>(where[0] - '0'), impl);
    ++n;
  }
  return n;
}

// Forgets every remembered verdict (trial.h) and drops the cached primitives, so that each
// problem's next first call chooses again.
void jaxconv_onednn_forget() {
  Forget();
  TheCache().Clear();
}

// Whether first calls run the layout trial (trial.h, SetTrial).
void jaxconv_onednn_set_trial(int on) { SetTrial(on != 0); }

}  // extern "C"
