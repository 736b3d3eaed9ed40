// jaxconv's oneDNN lowering: XLA FFI handlers for the three kernels of a convolution problem.
//
// Each handler receives the two operands and the result of one kernel as dense row-major
// buffers in the caller's layout, and the problem as attributes:
//
//   data_axes    (N, C, X1..Xn): the buffer axis of each role, for every data tensor (x, y)
//   filter_axes  (O, I, X1..Xn): the buffer axis of the forward convolution's O role (all
//                out channels) and I role (in channels per group) in the filter buffer
//   strides, dilations (1 = none), pads_begin, pads_end: one per spatial axis
//   groups, op (the jaxconv op, for messages)
//
// The roles are mapped onto oneDNN's logical dims by memory descriptors with strides (no
// copies of the caller's data); oneDNN picks its own weight format (a reorder in and out),
// and the activations stay in the caller's layout or are reordered into oneDNN's, whichever
// ran faster on the problem's first call (Choose).  A small problem runs whole, single-
// threaded, on the calling thread; a forward or data gradient whose batch splits, and whose
// filter is lighter than a chunk's activations, runs as single-threaded chunks on XLA's own
// thread pool (RunOnPool, Chunks); a weight gradient, and the rest, as one OpenMP call; one
// full-width call at a time.
// Primitives are cached by problem in a bounded LRU cache (thread-safe; an entry stays alive
// while a thread executes it); working memory is each thread's own.  Every oneDNN error
// becomes an ffi::Error whose message names the op: XLA raises it in Python.

#include <dlfcn.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <exception>
#include <initializer_list>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using dnnl::memory;

namespace {

enum class Kernel { kForward = 0, kData = 1, kWeight = 2 };

dnnl::engine& Engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

struct Problem {
  Kernel kernel;
  memory::data_type dtype;
  int64_t groups;
  std::vector<int64_t> x_dims, y_dims, w_dims;  // buffer shapes (x, y data; w filter)
  std::vector<int64_t> data_axes, filter_axes, strides, dilations, pads_begin, pads_end;
  int threads = 0;  // 1: created for one thread (a chunk on XLA's pool); 0: OpenMP's own

  // The cache's key: every field, each list after its length. (Built as a string through a
  // std::ostringstream it cost 2.7 us a call on a 2-core Zen 3 EPYC, a fifth of a small call's
  // time in the handler.)
  using Key = std::vector<int64_t>;
  Key MakeKey() const {
    Key key{threads, static_cast<int64_t>(kernel), static_cast<int64_t>(dtype), groups};
    key.reserve(4 + 9 * (1 + x_dims.size()));
    for (const auto* v : {&x_dims, &y_dims, &w_dims, &data_axes, &filter_axes, &strides,
                          &dilations, &pads_begin, &pads_end}) {
      key.push_back(static_cast<int64_t>(v->size()));
      key.insert(key.end(), v->begin(), v->end());
    }
    return key;
  }
};

struct KeyHash {
  size_t operator()(const Problem::Key& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t v : key) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

double Elements(const std::vector<int64_t>& dims) {
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>(d);
  return n;
}

size_t ElementSize(memory::data_type t) { return t == memory::data_type::f32 ? 4 : 2; }

// A data tensor (N, C, X...) of a buffer whose axes hold the roles at `axes`.
memory::desc DataMd(const std::vector<int64_t>& dims, const std::vector<int64_t>& axes,
                    memory::data_type dtype) {
  auto st = RowMajorStrides(dims);
  memory::dims d, s;
  for (int64_t a : axes) {
    d.push_back(dims[a]);
    s.push_back(st[a]);
  }
  return memory::desc(d, dtype, s);
}

// The filter (G, O/G, I/G, X...) (or (O, I, X...) for one group) of the filter buffer.
memory::desc FilterMd(const Problem& p) {
  auto st = RowMajorStrides(p.w_dims);
  const int64_t o = p.w_dims[p.filter_axes[0]], i = p.w_dims[p.filter_axes[1]];
  const int64_t so = st[p.filter_axes[0]], si = st[p.filter_axes[1]];
  memory::dims d, s;
  if (p.groups > 1) {
    d = {p.groups, o / p.groups, i};
    s = {so * (o / p.groups), so, si};
  } else {
    d = {o, i};
    s = {so, si};
  }
  for (size_t k = 2; k < p.filter_axes.size(); ++k) {
    d.push_back(p.w_dims[p.filter_axes[k]]);
    s.push_back(st[p.filter_axes[k]]);
  }
  return memory::desc(d, p.dtype, s);
}

// Where the activations live for a primitive: the caller's buffers, oneDNN's own choice, or
// oneDNN's channel-blocked layout (nChw16c on AVX-512, nChw8c below), which its direct kernels
// run fastest on for many problems but which "any" does not pick where a kernel also takes
// the caller's layout.
enum class Activations { kCaller, kAny, kBlocked };

memory::desc Blocked(const memory::desc& md) {
  using tag = memory::format_tag;
  const bool wide = dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core;
  switch (md.get_ndims()) {
    case 3: return memory::desc(md.get_dims(), md.get_data_type(), wide ? tag::nCw16c : tag::nCw8c);
    case 4: return memory::desc(md.get_dims(), md.get_data_type(), wide ? tag::nChw16c : tag::nChw8c);
    default:
      return memory::desc(md.get_dims(), md.get_data_type(), wide ? tag::nCdhw16c : tag::nCdhw8c);
  }
}

memory::desc Any(const memory::desc& md) {
  return memory::desc(md.get_dims(), md.get_data_type(), memory::format_tag::any);
}

// The OpenMP runtime oneDNN was loaded with (none: a oneDNN without OpenMP), found at run time:
// jaxconv's own parallel loops (the filter moves, FilterMove) run on oneDNN's team, not on a
// second one.
struct OpenMp {
  int (*get_max_threads)() = nullptr;
  void (*set_num_threads)(int) = nullptr;
  int (*thread_num)() = nullptr;
  int (*num_threads)() = nullptr;
  // what `#pragma omp parallel` compiles to: fn(data) on each thread of a team of the given
  // size (0: the calling thread's omp_get_max_threads())
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;

  OpenMp() {
    void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (gomp == nullptr) return;
    get_max_threads = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_max_threads"));
    set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(gomp, "omp_set_num_threads"));
    thread_num = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_thread_num"));
    num_threads = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_num_threads"));
    parallel = reinterpret_cast<void (*)(void (*)(void*), void*, unsigned, unsigned)>(
        dlsym(gomp, "GOMP_parallel"));
  }
  bool ok() const { return get_max_threads != nullptr && set_num_threads != nullptr; }
  bool teams() const {
    return parallel != nullptr && thread_num != nullptr && num_threads != nullptr;
  }
};

const OpenMp& Omp() {
  static OpenMp* omp = new OpenMp();
  return *omp;
}

// jaxconv's own moves of a filter between the caller's XIO layout (O innermost, then I, then
// the spatial axes: flax's HWIO) and oneDNN's blocked layouts, where oneDNN 3.2's reorders of
// those directions were slow (2-core AVX-512 Xeon, 2 threads):
// - into a forward's or data gradient's layout with I innermost in each tile (ABcd16a16b,
//   ...): a transpose of each 16x16 tile (FilterTranspose). oneDNN's took 0.73 ms for a 3x3
//   512 -> 512 filter against 0.39 from torch's OIHW: ResNet-18's layer-4 data gradient ran
//   at 1.07x torch's time. This one (AVX-512 register transposes on oneDNN's OpenMP team,
//   one thread per range of I tiles, each reading its rows in order, the tile after next
//   prefetched, streaming stores) took 0.50 ms a call in a loop whose filter XLA wrote
//   afresh each call, oneDNN's 1.2.
// - out of a weight gradient's layout with O innermost in each tile (ABcd16b16a, ...): a
//   copy of 64-byte rows in XIO's order (FilterCopy), each row of XIO written start to end.
//   oneDNN's took 0.05-0.09 ms for the 128 x 64 filter of ResNet-18's 1x1 stride-2 weight
//   gradient, a 0.38 ms primitive; torch's reorder of the same filter after its primitive
//   0.007 (ONEDNN_VERBOSE on both sides). In the blocked side's order (16 rows of a tile
//   2-8 KB apart in XIO) the copy lost to oneDNN's reorder from 1 MiB on: 0.89 against
//   0.73 ms on the 3x3x3 512 -> 256 filter; in XIO's order 0.63, with streaming stores 0.53.
struct FilterMove {
  bool on = false;
  int64_t o = 0, i = 0;                   // channels, multiples of 16
  std::vector<int64_t> taps;              // the filter's spatial extents
  std::vector<int64_t> xio_tap, blk_tap;  // each spatial axis's stride (elements) on each side
  int64_t xio_i = 0;                      // XIO's stride of I (O's is 1)
  // the blocked side's offset of (o, i) at tap offset 0 is o_off[o] + i_off[i] (tables made
  // with the plan: divisions per 64-byte row took the copy of a 14 MB filter from 0.53 ms to
  // 1.0)
  std::vector<int64_t> o_off, i_off;
  int64_t tile_o = 0;  // the blocked side's stride of O within a tile
};

// The plan of a move between `xio` (the caller's filter) and `blk` (the primitive's), whose
// tiles block both O and I by multiples of 16, I innermost (`i_inner`: the transpose's) or O
// innermost (the copy's); or one that is off where it does not apply (oneDNN's reorder then
// runs). Where only I is blocked (brgconv's Bcdea32b, Bcda64b, ...), oneDNN's reorder from
// XIO was the faster: 0.75 ms against 0.86 (3x3x3 512 -> 256), 0.50 against 0.58 (3x3
// 512 -> 512), 0.05 against 0.10 (1x1 1024 -> 256), in streaming stores or not, 16 or 32
// channels of I at a time; 2-core AVX-512 Xeon.
FilterMove PlanFilterMove(const memory::desc& xio, const memory::desc& blk, bool i_inner) {
  FilterMove t;
  const int n = xio.get_ndims();
  if (xio.get_data_type() != memory::data_type::f32 || blk.get_data_type() != xio.get_data_type()
      || n < 3 || n > 5 || blk.get_ndims() != n)
    return t;
  if (xio.get_format_kind() != memory::format_kind::blocked ||
      blk.get_format_kind() != memory::format_kind::blocked || xio.get_inner_nblks() != 0 ||
      blk.get_padded_dims() != blk.get_dims() || blk.get_submemory_offset() != 0 ||
      xio.get_submemory_offset() != 0)
    return t;
  const int nblks = blk.get_inner_nblks();
  const memory::dims idxs = blk.get_inner_idxs(), blks = blk.get_inner_blks();
  const int64_t inner_dim = i_inner ? 1 : 0;
  if (nblks != 2 || idxs[0] != 1 - inner_dim || idxs[1] != inner_dim || blks[0] % 16 != 0 ||
      blks[1] % 16 != 0)
    return t;
  const memory::dims dims = xio.get_dims(), xs = xio.get_strides(), bs = blk.get_strides();
  if (dims != blk.get_dims() || dims[0] % 16 != 0 || dims[1] % 16 != 0 || xs[0] != 1 ||
      xs[1] != dims[0])
    return t;
  t.o = dims[0];
  t.i = dims[1];
  t.xio_i = xs[1];
  // O's and I's blocks within a tile, the innermost one's index varying fastest
  const int64_t bo = blks[i_inner ? 0 : 1], bi = blks[i_inner ? 1 : 0];
  t.tile_o = i_inner ? bi : 1;
  for (int64_t oc = 0; oc < t.o; ++oc)
    t.o_off.push_back((oc / bo) * bs[0] + (oc % bo) * (i_inner ? bi : 1));
  for (int64_t ic = 0; ic < t.i; ++ic)
    t.i_off.push_back((ic / bi) * bs[1] + (ic % bi) * (i_inner ? 1 : bo));
  for (int a = 2; a < n; ++a) {
    t.taps.push_back(dims[a]);
    t.xio_tap.push_back(xs[a]);
    t.blk_tap.push_back(bs[a]);
  }
  t.on = true;
  return t;
}

// The offsets (elements) of spatial position `tap` (row-major over the taps) on each side.
void TapOffsets(const FilterMove& t, int64_t tap, int64_t& xio, int64_t& blk) {
  xio = blk = 0;
  for (size_t a = t.taps.size(); a-- > 0;) {
    const int64_t idx = tap % t.taps[a];
    tap /= t.taps[a];
    xio += idx * t.xio_tap[a];
    blk += idx * t.blk_tap[a];
  }
}

int64_t Taps(const FilterMove& t) {
  int64_t n = 1;
  for (int64_t k : t.taps) n *= k;
  return n;
}

// r[0..15] (16 rows of 16) into w[0..15], its transpose: three rounds of interleaving.
__attribute__((target("avx512f"))) inline void Transpose16(const __m512* r, __m512* w) {
  __m512 t[16], u[16], v[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * k + 2]), d = _mm512_castps_pd(t[4 * k + 3]);
    u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k) {
      v[8 * h + k] = _mm512_shuffle_f32x4(u[8 * h + k], u[8 * h + 4 + k], 0x88);
      v[8 * h + 4 + k] = _mm512_shuffle_f32x4(u[8 * h + k], u[8 * h + 4 + k], 0xdd);
    }
  for (int k = 0; k < 8; ++k) {
    w[k] = _mm512_shuffle_f32x4(v[k], v[8 + k], 0x88);
    w[8 + k] = _mm512_shuffle_f32x4(v[k], v[8 + k], 0xdd);
  }
}

// FilterTranspose's I tiles [ib0, ib1) (16 channels each) of every tap: the 16 I values of
// (o, ib*16 .. ib*16 + 15) are contiguous on the blocked side, XIO's row ib*16 + b holds the
// 16 O values (ob*16 .. ob*16 + 15, b).
__attribute__((target("avx512f"))) void TransposeBlocks(const FilterMove& t, const float* src,
                                                        float* dst, int64_t ib0, int64_t ib1) {
  // the plan's fields in locals: a vector store may alias anything, so read through `t` each
  // would be read again after every store (0.70 ms against 0.61 for a 14 MB filter)
  const int64_t tiles_o = t.o / 16, xio_i = t.xio_i, tile_o = t.tile_o;
  const int64_t *o_off = t.o_off.data(), *i_off = t.i_off.data();
  __m512 r[16], w[16];
  for (int64_t tap = 0, n = Taps(t); tap < n; ++tap) {
    int64_t s_off, d_off;
    TapOffsets(t, tap, s_off, d_off);
    for (int64_t ib = ib0; ib < ib1; ++ib)
      for (int64_t ob = 0; ob < tiles_o; ++ob) {
        const float* in = src + s_off + ib * 16 * xio_i + ob * 16;
        // the tile after next, into L1 (a prefetch past the rows' end never faults): 0.50 ms
        // a call against 0.73 without, for a filter fresh from XLA each call (3x3 512 -> 512)
        for (int b = 0; b < 16; ++b)
          _mm_prefetch(reinterpret_cast<const char*>(in + 32 + b * xio_i), _MM_HINT_T0);
        for (int b = 0; b < 16; ++b) r[b] = _mm512_loadu_ps(in + b * xio_i);
        Transpose16(r, w);
        // the 16 O of a tile lie in one O block, tile_o apart
        float* out = dst + d_off + i_off[ib * 16] + o_off[ob * 16];
        for (int a = 0; a < 16; ++a) _mm512_stream_ps(out + a * tile_o, w[a]);
      }
  }
  _mm_sfence();  // the streaming stores are visible before the primitive reads the filter
}

// FilterCopy's I tiles [ib0, ib1) of every tap, in XIO's order: row i of a tap takes its 16
// O values (ob*16 .. ob*16 + 15, i) from the blocked side, where they are contiguous.
void CopyRows(const FilterMove& t, const float* src, float* dst, int64_t ib0, int64_t ib1) {
  const int64_t o = t.o, xio_i = t.xio_i;  // in locals, as in TransposeBlocks
  const int64_t *o_off = t.o_off.data(), *i_off = t.i_off.data();
  for (int64_t tap = 0, n = Taps(t); tap < n; ++tap) {
    int64_t d_off, s_off;
    TapOffsets(t, tap, d_off, s_off);
    for (int64_t ic = ib0 * 16; ic < ib1 * 16; ++ic) {
      float* out = dst + d_off + ic * xio_i;
      const float* in = src + s_off + i_off[ic];
      for (int64_t oc = 0; oc < o; oc += 16)
        std::memcpy(out + oc, in + o_off[oc], 16 * sizeof(float));
    }
  }
}

// CopyRows by streaming stores, into a 64-byte aligned dst: a function of its own, since
// AVX-512 code must sit in a function compiled for it (one loop with SSE's 16-byte streaming
// stores instead took 0.57 ms against 0.50 on the 14 MB filter).
__attribute__((target("avx512f"))) void StreamRows(const FilterMove& t, const float* src,
                                                   float* dst, int64_t ib0, int64_t ib1) {
  const int64_t o = t.o, xio_i = t.xio_i;
  const int64_t *o_off = t.o_off.data(), *i_off = t.i_off.data();
  for (int64_t tap = 0, n = Taps(t); tap < n; ++tap) {
    int64_t d_off, s_off;
    TapOffsets(t, tap, d_off, s_off);
    for (int64_t ic = ib0 * 16; ic < ib1 * 16; ++ic) {
      float* out = dst + d_off + ic * xio_i;
      const float* in = src + s_off + i_off[ic];
      for (int64_t oc = 0; oc < o; oc += 16)
        _mm512_stream_ps(out + oc, _mm512_loadu_ps(in + o_off[oc]));
    }
  }
  _mm_sfence();  // the streaming stores are visible before XLA's next operation reads them
}

using BlockRange = void (*)(const FilterMove&, const float*, float*, int64_t, int64_t);

struct MoveJob {
  BlockRange range;
  const FilterMove* t;
  const float* src;
  float* dst;
  int64_t blocks;
};

void MoveOnTeam(void* data) {  // one OpenMP thread's share of the blocks
  const auto& job = *static_cast<MoveJob*>(data);
  const int64_t k = Omp().thread_num(), n = Omp().num_threads();
  job.range(*job.t, job.src, job.dst, job.blocks * k / n, job.blocks * (k + 1) / n);
}

// Runs `range` over [0, blocks) on the calling thread's OpenMP team (a team of one where the
// call runs single-threaded), or on the calling thread alone where `team` is false.
void RunMove(BlockRange range, const FilterMove& t, const void* src, void* dst, int64_t blocks,
             bool team) {
  MoveJob job{range, &t, static_cast<const float*>(src), static_cast<float*>(dst), blocks};
  if (team && Omp().teams()) Omp().parallel(MoveOnTeam, &job, 0, 0);
  else range(t, job.src, job.dst, 0, blocks);
}

std::atomic<int64_t> filter_transposes{0}, filter_copies{0};  // calls that ran them, for the tests

FilterMove PlanFilterTranspose(const memory::desc& xio, const memory::desc& blk) {
  return __builtin_cpu_supports("avx512f") ? PlanFilterMove(xio, blk, true) : FilterMove();
}

FilterMove PlanFilterCopy(const memory::desc& blk, const memory::desc& xio) {
  return PlanFilterMove(xio, blk, false);
}

// The filters the handler transposes itself: from 1 MiB, where its gain was measured (3x3
// 512 -> 512, 9.4 MB). Smaller ones keep oneDNN's reorder: on a 221 KB filter (MobileNetV2's
// 1x1 96 -> 576) neither was measured faster, that row's spread between processes (0.81-1.13
// of torch's time, the handler of before the transpose included) hiding any difference.
constexpr size_t kFilterTransposeMinBytes = size_t{1} << 20;

// The transpose of plan `t` from src (XIO) into dst (blocked, 64-byte aligned), on the team.
void RunFilterTranspose(const FilterMove& t, const void* src, void* dst) {
  ++filter_transposes;
  RunMove(TransposeBlocks, t, src, dst, t.i / 16, true);
}

// The copy of plan `t` from src (blocked) into dst (XIO): a filter under kFilterCopyTeamBytes
// on the calling thread, a larger one on its OpenMP team; from kFilterCopyStreamBytes by
// streaming stores (on AVX-512, into an aligned dst). On the 2-core AVX-512 Xeon (2 MiB of L2
// a core) streaming took 0.53 ms against 0.63 on the 3x3x3 512 -> 256 filter (14 MB), 0.35
// against 0.41 on the 3x3 512 -> 512 (9.4 MB), but 0.27 against 0.23 on a 4 MiB 1x1 2048 ->
// 512, each followed by a read of the whole filter as XLA's next operation would.
constexpr int64_t kFilterCopyTeamBytes = int64_t{1} << 20;
constexpr int64_t kFilterCopyStreamBytes = int64_t{8} << 20;
void RunFilterCopy(const FilterMove& t, const void* src, void* dst) {
  ++filter_copies;
  const int64_t bytes = t.o * t.i * Taps(t) * static_cast<int64_t>(sizeof(float));
  const bool stream = bytes >= kFilterCopyStreamBytes && __builtin_cpu_supports("avx512f") &&
                      reinterpret_cast<uintptr_t>(dst) % 64 == 0;
  RunMove(stream ? StreamRows : CopyRows, t, src, dst, t.i / 16, bytes >= kFilterCopyTeamBytes);
}

// One cached primitive: its descriptors, and whether each operand needs a reorder.
struct Entry {
  dnnl::primitive prim;
  memory::desc user_x, user_y, user_w;  // the caller's buffers
  memory::desc prim_x, prim_y, prim_w, scratch;
  // Reorders between the caller's layouts and the primitive's (empty where they agree), made
  // once: made per call, each went through oneDNN's primitive cache (hashing the descriptors,
  // a lookup, a primitive object), 8-10 us of the 13 us a call of a 2x2 problem spent in the
  // handler (2-core Zen 3 EPYC).
  dnnl::reorder to_x, to_y, to_w, from_x, from_y, from_w;
  FilterMove w_transpose;  // in place of to_w where it applies (FilterTranspose)
  FilterMove w_copy;       // in place of from_w where it applies (FilterCopy)
  std::string impl;
  bool on_callers = false;  // the primitive reads and writes the caller's activation layouts
  Activations where = Activations::kCaller;  // the activation layouts it was created for
  // What Choose decided, for choices(): the problem, and each candidate's layouts, impl and
  // best trial time (tab-separated; see Describe).
  std::string choice;
  // A spread data gradient (Spread): dx's bytes (0 otherwise), and for SpreadCopy dx's and
  // the grid's buffer shapes and byte strides, and the grid's spacing along each buffer axis.
  size_t spread_bytes = 0;
  std::vector<int64_t> dx_dims, dx_strides, grid_dims, grid_strides, spacing;

  // The memory objects of one call (the caller's buffers, the primitive's copies, the
  // scratchpad), made once and pointed at each call's buffers: making one cost ~0.7 us,
  // pointing one ~0.01 (seven a call; 2-core Zen 3 EPYC). A call takes a set from the pool
  // and puts it back, so there are as many sets as calls of this entry ever ran at once.
  struct Memories {
    memory ux, uy, uw, mx, my, mw, scratch;
  };
  std::unique_ptr<Memories> Take() const {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (!pool.empty()) {
        std::unique_ptr<Memories> m = std::move(pool.back());
        pool.pop_back();
        return m;
      }
    }
    auto m = std::make_unique<Memories>();
    auto make = [](const memory::desc& md) { return memory(md, Engine(), nullptr); };
    m->ux = make(user_x); m->uy = make(user_y); m->uw = make(user_w);
    m->mx = make(prim_x); m->my = make(prim_y); m->mw = make(prim_w);
    m->scratch = make(scratch);
    return m;
  }
  void Give(std::unique_ptr<Memories> m) const {
    std::lock_guard<std::mutex> lock(pool_mu);
    pool.push_back(std::move(m));
  }

 private:
  mutable std::mutex pool_mu;
  mutable std::vector<std::unique_ptr<Memories>> pool;
};

dnnl::primitive_attr Attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

memory::dims Dims(const std::vector<int64_t>& v) { return memory::dims(v.begin(), v.end()); }

dnnl::reorder Reorder(const memory::desc& from, const memory::desc& to) {
  if (from == to) return dnnl::reorder();
  return dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

// A strided 1x1 data gradient without pads_begin writes dx only at x = t*S (t < O along each
// axis), and zeros between: it is the unit-stride 1x1 data gradient, a product of matrices,
// whose O^rank results SpreadCopy puts S apart into dx with the zeros, in the same chunk.
// oneDNN 3.2's strided 1x1 data gradient ("brgconv_strided") writes the zeros itself at 1.4x
// jax.vjp's time (2-core Zen 3 EPYC, AVX2). The unit-stride one put back on the grid by XLA's
// interior pad made that pad a pass of its own over dx: ResNet-18's 1x1 stride-2 projection
// (batch 8, 64 -> 128 channels, 56x56) took 0.43 ms for the call and 0.45 for the pad.
// (2-core AVX-512 Xeon; measurements in SpreadCopy and lowering/onednn.py.)
bool Spread(const Problem& p) {
  if (p.kernel != Kernel::kData) return false;
  bool strided = false;
  for (size_t i = 0; i < p.strides.size(); ++i) {
    const int64_t in = p.x_dims[p.data_axes[i + 2]], out = p.y_dims[p.data_axes[i + 2]];
    if (p.w_dims[p.filter_axes[i + 2]] != 1 || p.pads_begin[i] != 0 ||
        (out - 1) * p.strides[i] > in - 1)
      return false;
    strided |= p.strides[i] > 1;
  }
  return strided;
}

// The unit-stride problem of a spread one: dx on the grid, O^rank per example.
Problem Unit(const Problem& p) {
  Problem u = p;
  for (size_t i = 0; i < p.strides.size(); ++i) {
    const int64_t axis = p.data_axes[i + 2];
    u.x_dims[axis] = p.y_dims[axis];
    u.strides[i] = 1;
    u.pads_end[i] = 0;
  }
  return u;
}

// The reorders of kernel k: its inputs into the primitive's layouts, its output back (a
// spread data gradient's into the caller's layout of its unit-stride problem, for SpreadCopy).
std::shared_ptr<Entry> WithReorders(std::shared_ptr<Entry> e, const Problem& spread) {
  const Kernel k = spread.kernel;
  e->on_callers = e->prim_x == e->user_x && e->prim_y == e->user_y;
  if (Spread(spread)) {  // the unit-stride dx (in the caller's layout) goes onto dx's grid
    const size_t es = ElementSize(spread.dtype);
    e->spread_bytes = static_cast<size_t>(Elements(spread.x_dims)) * es;
    e->dx_dims = spread.x_dims;
    e->grid_dims = Unit(spread).x_dims;
    e->dx_strides = RowMajorStrides(e->dx_dims);
    e->grid_strides = RowMajorStrides(e->grid_dims);
    e->spacing.assign(e->dx_dims.size(), 1);
    for (size_t a = 0; a < e->dx_dims.size(); ++a) {
      e->dx_strides[a] *= static_cast<int64_t>(es);
      e->grid_strides[a] *= static_cast<int64_t>(es);
    }
    for (size_t i = 0; i < spread.strides.size(); ++i)
      e->spacing[spread.data_axes[i + 2]] = spread.strides[i];
  }
  if (k == Kernel::kData) {
    e->from_x = Reorder(e->prim_x, e->user_x);
  } else {
    e->to_x = Reorder(e->user_x, e->prim_x);
  }
  if (k == Kernel::kForward) e->from_y = Reorder(e->prim_y, e->user_y);
  else e->to_y = Reorder(e->user_y, e->prim_y);
  if (k == Kernel::kWeight) {
    e->from_w = Reorder(e->prim_w, e->user_w);
    if (e->from_w) e->w_copy = PlanFilterCopy(e->prim_w, e->user_w);
  } else {
    e->to_w = Reorder(e->user_w, e->prim_w);
    if (e->to_w && e->user_w.get_size() >= kFilterTransposeMinBytes)
      e->w_transpose = PlanFilterTranspose(e->user_w, e->prim_w);
  }
  return e;
}

std::shared_ptr<Entry> Create(const Problem& spread, Activations where) {
  const Problem p = Spread(spread) ? Unit(spread) : spread;  // the problem the primitive computes
  auto e = std::make_shared<Entry>();
  e->where = where;
  e->user_x = DataMd(p.x_dims, p.data_axes, p.dtype);
  e->user_y = DataMd(p.y_dims, p.data_axes, p.dtype);
  e->user_w = FilterMd(p);
  memory::dims dil;
  for (int64_t d : p.dilations) dil.push_back(d - 1);  // oneDNN: 0 = no dilation
  const auto st = Dims(p.strides), pb = Dims(p.pads_begin), pe = Dims(p.pads_end);
  auto place = [where](const memory::desc& md) {
    return where == Activations::kCaller ? md
           : where == Activations::kAny  ? Any(md)
                                         : Blocked(md);
  };
  const auto x = place(e->user_x), y = place(e->user_y);
  const auto w = Any(e->user_w);
  const auto algo = dnnl::algorithm::convolution_direct;
  auto attr = Attr();
  if (p.kernel == Kernel::kForward) {
    dnnl::convolution_forward::primitive_desc pd(Engine(), dnnl::prop_kind::forward_training,
                                                 algo, x, w, y, st, dil, pb, pe, attr);
    e->prim = dnnl::convolution_forward(pd);
    e->prim_x = pd.src_desc(); e->prim_w = pd.weights_desc(); e->prim_y = pd.dst_desc();
    e->scratch = pd.scratchpad_desc(); e->impl = pd.impl_info_str();
    return WithReorders(e, spread);
  }
  dnnl::convolution_forward::primitive_desc hint(Engine(), dnnl::prop_kind::forward_training,
                                                 algo, x, w, y, st, dil, pb, pe);
  if (p.kernel == Kernel::kData) {
    dnnl::convolution_backward_data::primitive_desc pd(Engine(), algo, x, w, y, st, dil, pb, pe,
                                                       hint, attr);
    e->prim = dnnl::convolution_backward_data(pd);
    e->prim_x = pd.diff_src_desc(); e->prim_w = pd.weights_desc(); e->prim_y = pd.diff_dst_desc();
    e->scratch = pd.scratchpad_desc(); e->impl = pd.impl_info_str();
    return WithReorders(e, spread);
  }
  dnnl::convolution_backward_weights::primitive_desc pd(Engine(), algo, x, w, y, st, dil, pb,
                                                        pe, hint, attr);
  e->prim = dnnl::convolution_backward_weights(pd);
  e->prim_x = pd.src_desc(); e->prim_w = pd.diff_weights_desc(); e->prim_y = pd.diff_dst_desc();
  e->scratch = pd.scratchpad_desc(); e->impl = pd.impl_info_str();
  return WithReorders(e, spread);
}

// Working memory of the calling thread, kept between calls: a fresh allocation of an
// activation's size costs a page fault per 4 KiB, and zero-filling it is wasted work. Each
// thread runs one primitive at a time; a buffer larger than kKeepBytes is released after use.
constexpr size_t kKeepBytes = size_t{64} << 20;

// Memory on a cache line of its own start, as oneDNN's own allocations and XLA's buffers are:
// new[] gives 16-byte alignment, and a reordered copy that started off a cache line split
// every 64-byte vector load in two. Its offset came from the heap's state, so the same call
// ran at two speeds in different processes (ResNet-50's 3x3 stride-2 512 -> 512 forward,
// batch 8: its primitive 3.8-4.0 ms in some processes, 2.8 in others and in torch, on an
// AVX-512 Xeon).
constexpr size_t kAlign = 64;

struct FreeAligned {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t[], FreeAligned>;

AlignedBytes Allocate(size_t bytes, bool zeroed) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kAlign, rounded));
  if (p == nullptr) throw std::bad_alloc();
  if (zeroed) std::memset(p, 0, rounded);
  return AlignedBytes(p);
}

class Buffer {
 public:
  uint8_t* Get(size_t bytes) {
    if (bytes > size_) {
      data_ = Allocate(bytes, false);
      size_ = bytes;
    }
    return data_.get();
  }
  void Trim() {
    if (size_ > kKeepBytes) {
      data_.reset();
      size_ = 0;
    }
  }

 private:
  AlignedBytes data_;
  size_t size_ = 0;
};

// A primitive run on `s` with `args`, through oneDNN's C API (its C++ execute() builds a hash
// map of the arguments first); an error status throws dnnl::error, as the C++ API does.
void Exec(const dnnl::primitive& prim, dnnl::stream& s,
          std::initializer_list<dnnl_exec_arg_t> args) {
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(prim.get(), s.get(), static_cast<int>(args.size()), args.begin()),
      "could not execute a primitive");
}

// This thread's stream (a CPU stream runs in order, on the thread that submits).
dnnl::stream& Stream() {
  thread_local dnnl::stream s(Engine());
  return s;
}

// Puts a spread data gradient's unit-stride result `grid` (dense, the caller's layout) on dx's
// grid from buffer axis `a` on: element i of an axis is the grid's i / spacing where the
// spacing divides i (within the grid), else zero. Every byte of dx is written once, each run
// of zeros by one memset. (A zero-fill of the whole of dx, then oneDNN's reorder onto the grid,
// wrote a quarter of a stride-2 2D dx twice: for ResNet-18's projection, per chunk of 4, the
// fill took 0.20-0.27 ms and the reorder 0.07-0.11 beside the primitive's 0.31-0.36.
// Streaming stores were faster only into a cold dx: where XLA reused dx's buffer and the next
// operation read it, the call took 0.66-0.70 ms against 0.60; 2-core AVX-512 Xeon.)
template <typename T>
void SpreadCopy(const Entry& e, size_t a, const uint8_t* grid, uint8_t* dx) {
  const int64_t n = e.dx_dims[a], g = e.grid_dims[a], f = e.spacing[a];
  const int64_t ds = e.dx_strides[a], gs = e.grid_strides[a];
  if (a + 1 == e.dx_dims.size()) {  // the innermost axis: ds == gs == sizeof(T)
    if (f == 1) {
      std::memcpy(dx, grid, g * ds);
      std::memset(dx + g * ds, 0, (n - g) * ds);
      return;
    }
    T* out = reinterpret_cast<T*>(dx);
    const T* in = reinterpret_cast<const T*>(grid);
    std::memset(dx, 0, n * ds);
    for (int64_t t = 0; t < g; ++t) out[t * f] = in[t];
    return;
  }
  for (int64_t i = 0; i < n;) {
    if (i % f == 0 && i / f < g) {
      SpreadCopy<T>(e, a + 1, grid + (i / f) * gs, dx + i * ds);
      ++i;
      continue;
    }
    int64_t j = i + 1;  // the run of zeros: up to the next grid point (or the end)
    while (j < n && !(j % f == 0 && j / f < g)) ++j;
    std::memset(dx + i * ds, 0, (j - i) * ds);
    i = j;
  }
}

// Runs entry `e` of kernel `k` on the caller's buffers (x, y, w: which are read and which
// written depends on k), reordering where the primitive wants another layout.
void Execute(const Entry& e, Kernel k, void* x, void* y, void* w) {
  dnnl::stream& s = Stream();
  std::unique_ptr<Entry::Memories> m = e.Take();
  // this thread's own (no state shared between threads): reordered copies and the scratchpad
  thread_local Buffer bx, by, bw, bs, bg;
  const bool forward = k == Kernel::kForward, data = k == Kernel::kData;
  // The memory the primitive reads or writes: the caller's buffer where the primitive takes
  // its layout (the entry holds no reorder for it), else this thread's copy in the
  // primitive's layout, an input reordered into it first.
  // An input's reorder is `transpose` instead where that plan is on (the filter's).
  auto bind = [&](memory& user, memory& mine, void* buffer, const dnnl::reorder& r,
                  const memory::desc& want, Buffer& buf, bool input,
                  const FilterMove* transpose = nullptr) {
    user.set_data_handle(buffer);
    if (!r) return user.get();
    mine.set_data_handle(buf.Get(want.get_size()));
    if (input && transpose != nullptr && transpose->on)
      RunFilterTranspose(*transpose, buffer, mine.get_data_handle());
    else if (input)
      Exec(r, s, {{DNNL_ARG_FROM, user.get()}, {DNNL_ARG_TO, mine.get()}});
    return mine.get();
  };
  const dnnl::reorder& rx = data ? e.from_x : e.to_x;
  const dnnl::reorder& ry = forward ? e.from_y : e.to_y;
  const dnnl::reorder& rw = k == Kernel::kWeight ? e.from_w : e.to_w;
  // a spread data gradient's unit-stride dx: in this thread's buffer, SpreadCopy puts it on x
  const bool spread = data && e.spread_bytes > 0;
  uint8_t* grid = spread ? bg.Get(e.user_x.get_size()) : nullptr;
  const dnnl_memory_t mx = bind(m->ux, m->mx, spread ? grid : x, rx, e.prim_x, bx, !data);
  const dnnl_memory_t my = bind(m->uy, m->my, y, ry, e.prim_y, by, !forward);
  const dnnl_memory_t mw = bind(m->uw, m->mw, w, rw, e.prim_w, bw, k != Kernel::kWeight,
                                &e.w_transpose);
  m->scratch.set_data_handle(bs.Get(e.scratch.get_size() + 1));
  const dnnl_memory_t scratch = m->scratch.get();
  // the output, reordered back into the caller's buffer where it was computed in a copy
  auto back = [&](const dnnl::reorder& r, const memory& mine, const memory& user) {
    if (r) Exec(r, s, {{DNNL_ARG_FROM, mine.get()}, {DNNL_ARG_TO, user.get()}});
  };
  if (forward) {
    Exec(e.prim, s, {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, my},
                     {DNNL_ARG_SCRATCHPAD, scratch}});
    back(ry, m->my, m->uy);
  } else if (data) {
    Exec(e.prim, s, {{DNNL_ARG_DIFF_DST, my}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DIFF_SRC, mx},
                     {DNNL_ARG_SCRATCHPAD, scratch}});
    back(rx, m->mx, m->ux);
    if (spread) {
      s.wait();
      auto* out = static_cast<uint8_t*>(x);
      if (ElementSize(e.prim_x.get_data_type()) == 4) SpreadCopy<uint32_t>(e, 0, grid, out);
      else SpreadCopy<uint16_t>(e, 0, grid, out);
    }
  } else {
    Exec(e.prim, s, {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DIFF_DST, my}, {DNNL_ARG_DIFF_WEIGHTS, mw},
                     {DNNL_ARG_SCRATCHPAD, scratch}});
    if (e.w_copy.on) {
      s.wait();
      RunFilterCopy(e.w_copy, m->mw.get_data_handle(), w);
    } else {
      back(rw, m->mw, m->uw);
    }
  }
  s.wait();
  e.Give(std::move(m));
  for (Buffer* b : {&bx, &by, &bw, &bs, &bg}) b->Trim();
}

// The primitive for `p`. oneDNN may implement a kernel on the caller's activations, on the
// layout "any" gives, and on its channel-blocked layout (the activations reordered in and
// out); which is fastest depends on the problem and the ISA (on AVX-512: a strided 1x1
// weight gradient 19 ms on NHWC, 12.5 ms blocked with its reorders; resnet_50's 1x1 forward
// 2.2 ms NHWC, 1.7 blocked), so where they differ each runs on zero-filled buffers (after a
// warm-up, the best of alternating trials) and the fastest is kept: once per problem and
// process, as XLA autotunes GPU kernels. The trials go on until each candidate has run
// kTrialRounds times and for kTrialSeconds in all (at most kTrialMaxRounds): with two rounds
// a sub-millisecond problem was misjudged in one process of four on a 2-core AVX-512 Xeon
// VM (ResNet-18's 1x1 stride-2 weight gradient kept the blocked layout, 0.76 ms a call, over
// the caller's, 0.47). Problems whose buffers exceed kTrialBytes take the first candidate without a trial.
// With torch's OpenMP threads spinning after its calls (libgomp spins for milliseconds),
// both candidates of that problem took ~4 ms in 2 trials of 12 (0 of 12 with
// OMP_WAIT_POLICY=PASSIVE): a tie there keeps the caller's layout (kTrialMargin). A problem
// of at least kTrialLargeMacs multiply-adds (by its size, not by a trial time that contention
// can inflate) takes the faster layout from 1% (kTrialMarginLarge): ResNet-18's 3x3 512 -> 512
// data gradient at 7x7 (9.2e8) ran 3-5% faster blocked (5.44-5.51 ms, the filter transposed by
// FilterTranspose, against 5.59-5.75 on the caller's layout; 2-core AVX-512 Xeon), and the 5%
// margin kept the caller's layout in 7 processes of 8.
//
// A reference implementation ("ref:...", oneDNN's plain loop nest) is a candidate only where
// nothing else implements the problem, and then it is not timed: on resnet_50's conv1 (3 -> 64
// channels, 7x7 stride 2; AVX2) the blocked layouts fell to "ref:any", whose weight gradient
// took 15 s for N2 against 3-8 ms for "jit:avx2" on the caller's layout, and its three trial
// runs made the first call of N16 take 95-250 s. A candidate whose warm-up run took over
// kTrialSlower times the fastest warm-up, and over kTrialSlowerFloor seconds, is not timed
// further either. (Without the floor a sub-millisecond candidate's warm-up, which pays its
// first run's costs, fell out by chance: in 1 process of 3 each, MobileNetV2's 3x3 depthwise
// 192-channel data gradient lost its caller's layout, 0.86 ms a call against 0.56, and a 1x1
// 64 -> 384 forward its brgconv_1x1 kernel, 0.51 against 0.37; 2-core AVX-512 Xeon.)
constexpr size_t kTrialBytes = size_t{1} << 29;
constexpr double kTrialSlower = 4.0, kTrialSlowerFloor = 0.02;
constexpr int kTrialRounds = 3, kTrialMaxRounds = 25;
constexpr double kTrialSeconds = 0.01, kTrialMargin = 0.05, kTrialLargeMacs = 2.68e8,
                 kTrialMarginLarge = 0.01;
std::atomic<int64_t> reference_skipped{0}, reference_trials{0};

bool Reference(const Entry& e) { return e.impl.rfind("ref", 0) == 0; }

double Seconds(const Entry& e, Kernel k, void* x, void* y, void* w) {
  const auto t0 = std::chrono::steady_clock::now();
  Execute(e, k, x, y, w);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Macs(const Problem& p);

// Records on found[kept] what Choose decided, one line for choices(): the kernel, the
// buffers' shapes, strides, dilations, groups and threading ("single": created for one
// thread, a chunk of the batch or a whole small call; "openmp": oneDNN's team), then per
// candidate its activation layouts, impl and best trial time in ms ("-" where it was not
// timed), the kept one first.
std::shared_ptr<Entry> Describe(const Problem& p, const std::vector<std::shared_ptr<Entry>>& found,
                                const std::vector<double>& best, const std::vector<bool>& racing,
                                size_t kept) {
  static const char* const kernels[] = {"forward", "data", "weight"};
  static const char* const wheres[] = {"caller", "any", "blocked"};
  std::ostringstream out;
  auto list = [&out](const std::vector<int64_t>& v) {
    for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
    out << '\t';
  };
  out << kernels[static_cast<int>(p.kernel)] << '\t';
  for (const auto* v : {&p.x_dims, &p.y_dims, &p.w_dims, &p.strides, &p.dilations}) list(*v);
  out << p.groups << '\t' << (p.threads == 1 ? "single" : "openmp");
  std::vector<size_t> order{kept};
  for (size_t c = 0; c < found.size(); ++c) if (c != kept) order.push_back(c);
  for (size_t c : order) {
    out << '\t' << wheres[static_cast<int>(found[c]->where)] << ' ' << found[c]->impl << ' ';
    if (c < best.size() && racing[c]) out << best[c] * 1e3;
    else out << '-';
  }
  found[kept]->choice = out.str();
  return found[kept];
}

std::shared_ptr<Entry> Choose(const Problem& p) {
  std::vector<std::shared_ptr<Entry>> found;
  for (Activations where : {Activations::kCaller, Activations::kAny, Activations::kBlocked}) {
    std::shared_ptr<Entry> e;
    try {
      e = Create(p, where);
    } catch (const dnnl::error&) {  // no implementation there
      if (where == Activations::kBlocked && found.empty()) throw;
      continue;
    }
    bool same = false;  // the same activation layouts as an earlier candidate
    for (const auto& f : found) same |= f->prim_x == e->prim_x && f->prim_y == e->prim_y;
    if (!same) found.push_back(e);
  }
  if (std::any_of(found.begin(), found.end(), [](const auto& f) { return !Reference(*f); })) {
    const auto before = found.size();
    found.erase(std::remove_if(found.begin(), found.end(),
                               [](const auto& f) { return Reference(*f); }), found.end());
    reference_skipped += static_cast<int64_t>(before - found.size());
  }
  const Entry& first = *found.front();
  const size_t bytes = first.user_x.get_size() + first.user_y.get_size() + first.user_w.get_size();
  if (found.size() == 1 || bytes > kTrialBytes || Reference(first))
    return Describe(p, found, {}, {}, 0);
  // zero-filled, and aligned as XLA's buffers are: the trial times what the calls will get
  const AlignedBytes bx = Allocate(std::max(first.user_x.get_size(), first.spread_bytes), true),
                     by = Allocate(first.user_y.get_size(), true),
                     bw = Allocate(first.user_w.get_size(), true);
  std::vector<double> best(found.size(), 1e300);
  for (size_t c = 0; c < found.size(); ++c) {  // the warm-up
    reference_trials += Reference(*found[c]);
    best[c] = Seconds(*found[c], p.kernel, bx.get(), by.get(), bw.get());
  }
  const double fastest = *std::min_element(best.begin(), best.end());
  std::vector<bool> racing(found.size());
  for (size_t c = 0; c < found.size(); ++c) {
    // else out, with its warm-up time
    racing[c] = best[c] <= kTrialSlower * fastest || best[c] <= kTrialSlowerFloor;
    if (racing[c]) best[c] = 1e300;
  }
  std::vector<double> spent(found.size(), 0.0);
  for (int round = 0; round < kTrialMaxRounds; ++round) {
    bool enough = round >= kTrialRounds;
    for (size_t c = 0; c < found.size(); ++c)
      enough &= !racing[c] || spent[c] >= kTrialSeconds;
    if (enough) break;
    for (size_t c = 0; c < found.size(); ++c) {
      if (!racing[c]) continue;
      const double t = Seconds(*found[c], p.kernel, bx.get(), by.get(), bw.get());
      best[c] = std::min(best[c], t);
      spent[c] += t;
    }
  }
  // Another layout replaces the caller's only when it ran faster by more than kTrialMargin:
  // under contention (another OpenMP runtime's threads spinning beside the team) every
  // candidate of a sub-millisecond problem took a whole time slice, ~4 ms, and the order
  // was chance; the caller's layout needs no reorders of the activations.
  const size_t fastest_at = std::min_element(best.begin(), best.end()) - best.begin();
  const double margin = Macs(p) >= kTrialLargeMacs ? kTrialMarginLarge : kTrialMargin;
  size_t kept = fastest_at;
  for (size_t c = 0; c < found.size(); ++c) {
    if (found[c]->on_callers && racing[c] && best[c] <= (1 + margin) * best[fastest_at]) {
      kept = c;
      break;
    }
  }
  return Describe(p, found, best, racing, kept);
}

// The bounded LRU cache of primitives (XLA may call a handler from several threads).
class Cache {
 public:
  std::shared_ptr<Entry> Get(const Problem& p) {
    const Problem::Key key = p.MakeKey();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        order_.splice(order_.begin(), order_, it->second.second);
        ++hits_;
        return it->second.first;
      }
    }
    // Created outside the lock (primitive creation JIT-compiles, Choose runs trials): two
    // threads may both create one; the second insert finds the first and keeps it.
    std::shared_ptr<Entry> e = Choose(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second.first;
    ++misses_;
    order_.push_front(key);
    map_.emplace(key, std::make_pair(e, order_.begin()));
    Evict();
    return e;
  }

  void SetCapacity(int64_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = capacity < 1 ? 1 : capacity;
    Evict();
  }

  void Stats(int64_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    out[0] = static_cast<int64_t>(map_.size());
    out[1] = capacity_;
    out[2] = hits_;
    out[3] = misses_;
  }

  // The cached entries' choices, one line each, most recently used first.
  std::string Choices() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& key : order_) out += map_.at(key).first->choice + '\n';
    return out;
  }

  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
    order_.clear();
  }

 private:
  void Evict() {  // mu_ held
    while (static_cast<int64_t>(map_.size()) > capacity_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
  }

  std::mutex mu_;
  int64_t capacity_ = 256;
  int64_t hits_ = 0, misses_ = 0;
  std::list<Problem::Key> order_;
  std::unordered_map<Problem::Key,
                     std::pair<std::shared_ptr<Entry>, std::list<Problem::Key>::iterator>,
                     KeyHash>
      map_;
};

Cache& TheCache() {
  static Cache* cache = new Cache();
  return *cache;
}

// A call that uses the whole machine (one OpenMP call, or chunks on every thread of XLA's
// pool) runs alone: XLA runs independent operations of a program concurrently (a layer's
// data and weight gradients), and an OpenMP team beside a call's chunks puts two threads on
// each core, where a team's barriers wait for preempted threads. A call small enough to run
// whole on its calling thread takes no lock.
std::mutex& RunMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::vector<int64_t> ToVector(ffi::Span<const int64_t> s) {
  return std::vector<int64_t>(s.begin(), s.end());
}

std::vector<int64_t> Shape(const ffi::AnyBuffer& b) { return ToVector(b.dimensions()); }

// XLA's intra-op thread pool runs the rest of the program; oneDNN's OpenMP team would be a
// second pool on the same cores (its idle workers spin after each call: a oneDNN call beside
// an independent XLA computation took 1.13x the two apart). So where the minibatch of a
// forward or data gradient splits, the call runs on XLA's pool: one chunk of the batch per
// thread, each a single-threaded oneDNN primitive (OpenMP's thread count of that thread set
// to 1 while it runs: no team, no spinning). Chunks are claimed from a
// counter by the calling thread and by the tasks it schedules, so a call never waits for a
// task that has not started (XLA may run several handlers on its pool at once).

// Multiply-adds of a problem: y's elements times the taps and input channels each one sums.
double Macs(const Problem& p) {
  const double o = static_cast<double>(p.w_dims[p.filter_axes[0]]);
  return Elements(p.y_dims) / o * Elements(p.w_dims);
}

// Handing a chunk to another thread (waking it, waiting for it) costs about 10-20 us: a chunk
// of fewer multiply-adds than this (~50 us on one AVX-512 core) is not worth it, and a problem
// of fewer than this runs whole on the calling thread (no OpenMP team to start either; on a
// 2-core Zen 5 EPYC, benchdnn's dilated_conv:14, 1.5e5 multiply-adds, took 50 us in two chunks,
// 24 whole, against 23 for XLA's own convolution).
constexpr double kMinChunkMacs = double{1 << 21};

// The same for the bytes of activations a call reads and writes: a depthwise or other
// memory-bound problem takes far longer than its multiply-adds say (MobileNetV2's 3x3 stride-2
// depthwise 576 -> 576 at 14x14, batch 8: 2.0e6 multiply-adds, 4.5 MB; its data gradient whole
// on one thread 0.51 ms, torch's on two 0.17-0.26; 2-core AVX-512 Xeon; in two chunks 0.34-0.36
// against torch's 0.34, and its forward 0.24 -> 0.17 against 0.19). About 50 us of one core's
// memory traffic.
constexpr double kMinChunkBytes = double{1 << 20};

// A problem's work in units of the least worth a thread of its own.
double Work(const Problem& p) {
  const double bytes = (Elements(p.x_dims) + Elements(p.y_dims)) * ElementSize(p.dtype);
  return std::max(Macs(p) / kMinChunkMacs, bytes / kMinChunkBytes);
}

// How the call runs: 0 as one OpenMP call, n >= 1 as n chunks of the batch on XLA's pool (1:
// whole, single-threaded, on the calling thread). The batch must be the data buffers' outer
// axis. A weight gradient past kMinChunkMacs is one OpenMP call: as chunks, each chunk wrote
// a partial gradient in oneDNN's blocked layout that was reordered to the caller's and summed,
// and each ran a quarter-size minibatch (ResNet-18 at batch 8 on a 2-core AMD EPYC, AVX2:
// layer 4's 3x3 512 -> 512 weight gradient 41.9 ms as two chunks, 36.6 as one call, torch
// 36.6; the 1x1 stride-2 projection's 2.79 -> 2.32, torch 2.27). A forward or data gradient
// whose filter outweighs a chunk's activations (x and y) is one OpenMP call too: each chunk
// reordered the whole filter into oneDNN's blocked layout for its share of the work (ResNet-50
// at batch 8, same machine: the 3x3 512 -> 512 forward at 5x5 18.1 ms as two chunks, 14.2 as
// one call, torch 13.5; the 1x1 2048 -> 512 data gradient 8.6 -> 7.0, torch 7.4).
int64_t Chunks(const Problem& p, ffi::ThreadPool& pool) {
  if (!Omp().ok() || p.data_axes[0] != 0) return 0;
  // (a weight gradient by its bytes too, since the layout trial keeps the caller's layout
  // where that is faster: MobileNetV2's 3x3 stride-2 depthwise 576 -> 576 one above, 2.0e6
  // multiply-adds and 4.5 MB, took 0.19 ms whole on one thread, 0.09 as one OpenMP call on
  // the caller's layout, torch 0.17; before the trial oneDNN 3.2 reordered x and dy into its
  // blocked layout, 0.35 ms)
  if (p.kernel == Kernel::kWeight) return Work(p) >= 1 ? 0 : 1;
  const double work = Work(p);
  const int64_t by_work = std::max<int64_t>(1, static_cast<int64_t>(work));
  const int64_t n = std::min<int64_t>({pool.num_threads(), p.x_dims[0], by_work});
  if (n == 1 && work >= 1) return 0;  // one large example: OpenMP's team
  if (n > 1 && Elements(p.w_dims) * n > Elements(p.x_dims) + Elements(p.y_dims))
    return 0;  // the filter outweighs a chunk's activations: one call reorders it once
  return n;
}

struct Job {  // shared by the caller and its tasks
  Problem p;
  int64_t chunks;
  char *x, *y, *w;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int64_t> finished{0};  // read without the lock by the spinning caller
  std::exception_ptr error;
};

// Runs `q` single-threaded on the calling thread (OpenMP's thread count of this thread set
// to 1 while it runs).
void RunSingleThreaded(Problem& q, void* x, void* y, void* w) {
  q.threads = 1;
  const int saved = Omp().get_max_threads();
  Omp().set_num_threads(1);
  try {
    Execute(*TheCache().Get(q), q.kernel, x, y, w);
  } catch (...) {
    Omp().set_num_threads(saved);
    throw;
  }
  Omp().set_num_threads(saved);
}

void RunChunk(Job& job, int64_t i) {
  Problem q = job.p;
  const int64_t n = q.x_dims[0], begin = i * n / job.chunks, end = (i + 1) * n / job.chunks;
  const size_t bytes = ElementSize(q.dtype);
  size_t xs = bytes, ys = bytes;  // one example of x and of y, in bytes
  for (size_t a = 1; a < q.x_dims.size(); ++a) {
    xs *= q.x_dims[a];
    ys *= q.y_dims[a];
  }
  q.x_dims[0] = q.y_dims[0] = end - begin;
  try {  // a forward or data gradient: each chunk reads the whole filter
    RunSingleThreaded(q, job.x + begin * xs, job.y + begin * ys, job.w);
  } catch (...) {
    std::lock_guard<std::mutex> lock(job.mu);
    if (!job.error) job.error = std::current_exception();
  }
}

void Work(const std::shared_ptr<Job>& job) {
  for (int64_t i; (i = job->next.fetch_add(1)) < job->chunks;) {
    RunChunk(*job, i);
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->finished.fetch_add(1) + 1 == job->chunks) job->cv.notify_all();
  }
}

// The caller's chunk ends about when the others do, the chunks being equal: it spins for
// them up to kSpin before it sleeps. A sleeping thread's wake-up on a VM (an interrupt to a
// halted virtual CPU) took 50-120 us: MobileNetV2's 3x3 depthwise 960 data gradient at 7x7
// (batch 8, two chunks) 0.17-0.26 ms a call asleep, 0.13-0.15 spinning (torch 0.18), and its
// per-layer table's weighted sum 0.945 -> 0.896 of torch's time (2-core AVX-512 Xeon VM).
constexpr std::chrono::microseconds kSpin{200};

void RunOnPool(const Problem& p, int64_t chunks, ffi::ThreadPool& pool, void* x, void* y,
               void* w) {
  auto job = std::make_shared<Job>();
  job->p = p;
  job->chunks = chunks;
  job->x = static_cast<char*>(x);
  job->y = static_cast<char*>(y);
  job->w = static_cast<char*>(w);
  for (int64_t t = 1; t < chunks; ++t) pool.Schedule([job] { Work(job); });
  Work(job);
  // the caller's wait for the other chunks: spinning up to kSpin, then asleep
  const auto t0 = std::chrono::steady_clock::now();
  while (job->finished.load() < job->chunks &&
         std::chrono::steady_clock::now() - t0 < kSpin)
    for (int k = 0; k < 16; ++k) _mm_pause();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->finished == job->chunks; });
  if (job->error) std::rethrow_exception(job->error);
}

// oneDNN's data type of an FFI dtype; undef for the dtypes the lowering does not take.
memory::data_type DataType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return memory::data_type::f32;
    case ffi::DataType::BF16: return memory::data_type::bf16;
    case ffi::DataType::F16: return memory::data_type::f16;
    default: return memory::data_type::undef;
  }
}

// Runs kernel `k` with operands (a, b) -> out; which of x, y, w each is depends on k.
ffi::Error Run(Kernel k, std::string_view op, ffi::AnyBuffer a, ffi::AnyBuffer b,
               ffi::Result<ffi::AnyBuffer> out, ffi::Span<const int64_t> data_axes,
               ffi::Span<const int64_t> filter_axes, ffi::Span<const int64_t> strides,
               ffi::Span<const int64_t> dilations, ffi::Span<const int64_t> pads_begin,
               ffi::Span<const int64_t> pads_end, int64_t groups, int64_t threads,
               ffi::ThreadPool pool) {
  const std::string prefix = std::string(op) + ": oneDNN lowering: ";
  const memory::data_type dtype = DataType(a.element_type());
  if (dtype == memory::data_type::undef || b.element_type() != a.element_type() ||
      out->element_type() != a.element_type())
    return ffi::Error::InvalidArgument(prefix + "operands and result must share one dtype "
                                       "of f32, bf16, f16");
  Problem p;
  p.kernel = k;
  p.dtype = dtype;
  p.groups = groups;
  void *x, *y, *w;
  if (k == Kernel::kForward) {
    p.x_dims = Shape(a); p.w_dims = Shape(b); p.y_dims = Shape(*out);
    x = a.untyped_data(); w = b.untyped_data(); y = out->untyped_data();
  } else if (k == Kernel::kData) {
    p.y_dims = Shape(a); p.w_dims = Shape(b); p.x_dims = Shape(*out);
    y = a.untyped_data(); w = b.untyped_data(); x = out->untyped_data();
  } else {
    p.x_dims = Shape(a); p.y_dims = Shape(b); p.w_dims = Shape(*out);
    x = a.untyped_data(); y = b.untyped_data(); w = out->untyped_data();
  }
  p.data_axes = ToVector(data_axes);
  p.filter_axes = ToVector(filter_axes);
  p.strides = ToVector(strides);
  p.dilations = ToVector(dilations);
  p.pads_begin = ToVector(pads_begin);
  p.pads_end = ToVector(pads_end);
  const size_t rank = p.x_dims.size();
  if (rank < 3 || rank > 5 || p.y_dims.size() != rank || p.w_dims.size() != rank ||
      p.data_axes.size() != rank || p.filter_axes.size() != rank ||
      p.strides.size() != rank - 2 || p.dilations.size() != rank - 2 ||
      p.pads_begin.size() != rank - 2 || p.pads_end.size() != rank - 2 || groups < 1)
    return ffi::Error::InvalidArgument(prefix + "inconsistent ranks or attributes");
  for (size_t i = 0; i < rank; ++i)
    if (p.data_axes[i] < 0 || p.data_axes[i] >= static_cast<int64_t>(rank) ||
        p.filter_axes[i] < 0 || p.filter_axes[i] >= static_cast<int64_t>(rank))
      return ffi::Error::InvalidArgument(prefix + "axis out of range");
  try {
    // threads 1: one device's shard of a program split across several devices of this
    // process, each running its own call at the same time: whole, on the calling thread
    const int64_t chunks = threads == 1 ? 1 : Chunks(p, pool);
    if (chunks == 1) {  // whole, on the calling thread: no job to share with the pool
      RunSingleThreaded(p, x, y, w);
    } else if (chunks > 1) {
      std::lock_guard<std::mutex> one_at_a_time(RunMutex());
      RunOnPool(p, chunks, pool, x, y, w);
    } else {
      std::shared_ptr<Entry> e = TheCache().Get(p);
      std::lock_guard<std::mutex> one_at_a_time(RunMutex());
      Execute(*e, k, x, y, w);
    }
  } catch (const dnnl::error& ex) {
    return ffi::Error::Internal(prefix + ex.what() + " (status " +
                                std::to_string(static_cast<int>(ex.status)) + ")");
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, prefix + "out of memory");
  } catch (const std::exception& ex) {
    return ffi::Error::Internal(prefix + ex.what());
  }
  return ffi::Error::Success();
}

#define JAXCONV_ONEDNN_HANDLER(NAME, KERNEL)                                                \
  ffi::Error NAME##Impl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out, \
                        std::string_view op, ffi::Span<const int64_t> data_axes,            \
                        ffi::Span<const int64_t> filter_axes,                               \
                        ffi::Span<const int64_t> strides, ffi::Span<const int64_t> dilations,\
                        ffi::Span<const int64_t> pads_begin,                                \
                        ffi::Span<const int64_t> pads_end, int64_t groups, int64_t threads, \
                        ffi::ThreadPool pool) {                                             \
    return Run(KERNEL, op, a, b, out, data_axes, filter_axes, strides, dilations,           \
               pads_begin, pads_end, groups, threads, pool);                                \
  }

JAXCONV_ONEDNN_HANDLER(Forward, Kernel::kForward)
JAXCONV_ONEDNN_HANDLER(Data, Kernel::kData)
JAXCONV_ONEDNN_HANDLER(Weight, Kernel::kWeight)

}  // namespace

#define JAXCONV_ONEDNN_BIND(SYMBOL, NAME)                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SYMBOL, NAME##Impl,                                     \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::AnyBuffer>()                              \
                                    .Arg<ffi::AnyBuffer>()                              \
                                    .Ret<ffi::AnyBuffer>()                              \
                                    .Attr<std::string_view>("op")                       \
                                    .Attr<ffi::Span<const int64_t>>("data_axes")        \
                                    .Attr<ffi::Span<const int64_t>>("filter_axes")      \
                                    .Attr<ffi::Span<const int64_t>>("strides")          \
                                    .Attr<ffi::Span<const int64_t>>("dilations")        \
                                    .Attr<ffi::Span<const int64_t>>("pads_begin")       \
                                    .Attr<ffi::Span<const int64_t>>("pads_end")         \
                                    .Attr<int64_t>("groups")                            \
                                    .Attr<int64_t>("threads")                           \
                                    .Ctx<ffi::ThreadPool>());

JAXCONV_ONEDNN_BIND(jaxconv_onednn_forward, Forward)
JAXCONV_ONEDNN_BIND(jaxconv_onednn_data, Data)
JAXCONV_ONEDNN_BIND(jaxconv_onednn_weight, Weight)

namespace {

// The float32 arithmetic peak of this machine, measured: every core runs a loop of independent
// vector FMAs on registers (no memory traffic) for about `seconds`; GFLOP/s over all cores.
// This is cores x FMA units x lanes x 2 x the clock the cores actually run at (turbo
// included), which a VM's /proc/cpuinfo does not tell. AVX-512 where the CPU has it, else AVX2.
// One thread's loop: 12 independent accumulators (more than an FMA's latency times its
// units), a * m + c contracted into one FMA each, checked against the clock every 4096 rounds.
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

double PeakGflops(int threads, double seconds, int* lanes) {
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

}  // namespace

// Plain C for ctypes: the library's version and ISA, the dtypes it computes here, and the
// cache's state and bound.
extern "C" {
double jaxconv_fma_peak_gflops(int threads, double seconds, int* lanes) {
  return PeakGflops(threads, seconds, lanes);
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
// "32a32b": I innermost, FilterTranspose from XIO; "16b16a", ...: O innermost, FilterCopy
// into XIO; "32b", ...: I blocked alone, which keeps oneDNN's reorder). 1 where the two
// outputs are equal bit for bit, 0 where not, -1 where the plan does not apply (or the name
// is not in the table).
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
void jaxconv_onednn_clear_cache() { TheCache().Clear(); }
}
