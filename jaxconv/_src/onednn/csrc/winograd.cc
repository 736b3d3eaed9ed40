// Winograd F(m x m, 3 x 3) on float32 or bfloat16 NHWC buffers, computed in float32
// (winograd.h): the passes over tiles (transforms: winograd_tiles.h; products:
// winograd_product.h), each compiled for AVX-512, for AVX2 and for neither, the CPU's features
// picking one when the library loads, and the calls that run them on oneDNN's OpenMP team.
#include "winograd.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "execute.h"
#include "openmp.h"
#include "winograd_product.h"
#include "winograd_tiles.h"

namespace jaxconv_onednn {

const char* WinogradShape::Invalid() const {
  if (m < 2 || m > 4) return "the tile size must be 2, 3 or 4";
  if (n < 1 || h < 1 || w < 1 || c < 1 || k < 1 || oh < 1 || ow < 1) return "empty operand";
  if (pad_top < 0 || pad_left < 0 || pad_top > 2 || pad_left > 2) return "pads out of [0, 2]";
  if (oh > h + 2 * 2 - 2 || ow > w + 2 * 2 - 2) return "output larger than the padded input";
  if (filter_elements != 9 * c * k) return "the filter must have 3 x 3 x C x K elements";
  int64_t lo = filter.offset, hi = filter.offset;  // the farthest corners of the view
  for (int64_t stride : {2 * filter.row, 2 * filter.col, (c - 1) * filter.in,
                         (k - 1) * filter.out})
    (stride < 0 ? lo : hi) += stride;
  if (lo < 0 || hi >= filter_elements) return "the filter's strides leave its buffer";
  return "";
}

namespace {

// V rows of tiles [p0, p1): (B^T d B)[xi], d the tile's alpha x alpha inputs of x (zeros
// outside it).
template <int M>
inline __attribute__((always_inline)) void InputTiles(const WinogradShape& s, const void* x,
                                                      const Rows& v, int64_t p0, int64_t p1) {
  constexpr int A = Tile<M>::kAlpha;
  alignas(64) float d[A * A * kBlock], t[A * A * kBlock];
  for (int64_t p = p0; p < p1; ++p) {
    const At at = TileAt(s, p);
    for (int64_t c0 = 0; c0 < s.c; c0 += kBlock) {
      const int64_t nc = std::min(kBlock, s.c - c0);
      for (int i = 0; i < A; ++i) {
        const int64_t hh = at.oy - s.pad_top + i;
        for (int j = 0; j < A; ++j) {
          const int64_t ww = at.ox - s.pad_left + j;
          float* dst = d + (i * A + j) * kBlock;
          if (hh >= 0 && hh < s.h && ww >= 0 && ww < s.w)
            LoadRow(x, ((at.n * s.h + hh) * s.w + ww) * s.c + c0, dst, nc, s.bf16);
          else
            std::memset(dst, 0, nc * sizeof(float));
        }
      }
      Separable<A, A>(
          Tile<M>::Input, [&](int i, int j) { return d + (i * A + j) * kBlock; },
          [&](int xi, int nu) { return v.at(xi * A + nu, p) + c0; }, t, nc);
    }
  }
}

// y's tiles [p0, p1) from M: A^T M A, the positions inside y only; s.k columns of M's rows
// into y's rows of ldy.
template <int M>
inline __attribute__((always_inline)) void OutputTiles(const WinogradShape& s, const Rows& mm,
                                                       void* y, int64_t ldy, int64_t p0,
                                                       int64_t p1) {
  constexpr int A = Tile<M>::kAlpha;
  alignas(64) float t[M * A * kBlock], o[M * M * kBlock];
  for (int64_t p = p0; p < p1; ++p) {
    const At at = TileAt(s, p);
    for (int64_t k0 = 0; k0 < s.k; k0 += kBlock) {
      const int64_t nk = std::min(kBlock, s.k - k0);
      // float32 straight into y (where inside it), bfloat16 through o, rounded
      const auto inside = [&](int i, int j) { return at.oy + i < s.oh && at.ox + j < s.ow; };
      const auto out = [&](int i, int j) {
        return ((at.n * s.oh + at.oy + i) * s.ow + at.ox + j) * ldy + k0;
      };
      Separable<A, M>(
          Tile<M>::Output, [&](int xi, int nu) { return mm.at(xi * A + nu, p) + k0; },
          [&](int i, int j) {
            return inside(i, j) && !s.bf16 ? static_cast<float*>(y) + out(i, j)
                                           : o + (i * M + j) * kBlock;
          },
          t, nk);
      if (s.bf16)
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < M; ++j)
            if (inside(i, j)) StoreRow(o + (i * M + j) * kBlock, y, out(i, j), nk, true);
    }
  }
}

// dM rows of tiles [p0, p1): (A e A^T)[xi], e the tile's m x m values of dy (zeros outside
// it and in the padded columns K..ld).
template <int M>
inline __attribute__((always_inline)) void GradTiles(const WinogradShape& s, const void* dy,
                                                     const Rows& dm, int64_t p0, int64_t p1) {
  constexpr int A = Tile<M>::kAlpha;
  alignas(64) float e[M * M * kBlock], t[A * M * kBlock];
  for (int64_t p = p0; p < p1; ++p) {
    const At at = TileAt(s, p);
    for (int64_t k0 = 0; k0 < dm.ld; k0 += kBlock) {
      const int64_t nk = std::min(kBlock, dm.ld - k0), valid = std::clamp(s.k - k0, int64_t{0}, nk);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < M; ++j) {
          const int64_t yy = at.oy + i, xx = at.ox + j;
          float* dst = e + (i * M + j) * kBlock;
          const bool inside = yy < s.oh && xx < s.ow;
          if (inside)
            LoadRow(dy, ((at.n * s.oh + yy) * s.ow + xx) * s.k + k0, dst, valid, s.bf16);
          std::memset(dst + (inside ? valid : 0), 0, (nk - (inside ? valid : 0)) * sizeof(float));
        }
      Separable<M, A>(
          Tile<M>::Grad, [&](int i, int j) { return e + (i * M + j) * kBlock; },
          [&](int xi, int nu) { return dm.at(xi * A + nu, p) + k0; }, t, nk);
    }
  }
}

// U of input channels [c0, c1) and output channels [k0, k1): (G g G^T)[xi] for each, zeros in
// the padded columns (k >= K); element (xi, c, k) at u[(xi * plane + c - c0) * ld + k - k0].
// The filter's output channels are contiguous, or else its input channels are (the data
// gradient's view, the channels swapped: ReadableFilter); those are read in runs of input
// channels into `scratch` (kWinogradFilterScratch floats; c1 - c0 <= kWinogradFilterBlock) and
// transposed there.
template <int M>
inline __attribute__((always_inline)) void FilterRows(const WinogradShape& s, const void* g,
                                                      float* u, int64_t plane, int64_t ld,
                                                      int64_t c0, int64_t c1, int64_t k0,
                                                      int64_t k1, float* scratch) {
  constexpr int A = Tile<M>::kAlpha;
  const FilterView& f = s.filter;
  const bool runs_of_c = f.out != 1;
  const int64_t nc = c1 - c0;
  float* runs = scratch;                            // [ij][q][c - c0]
  float* cols = scratch + 9 * kBlock * nc;          // [c - c0][ij][q]
  alignas(64) float d[9 * kBlock], t[A * 3 * kBlock];
  for (int64_t kb = k0; kb < k1; kb += kBlock) {
    const int64_t nk = std::min(kBlock, k1 - kb), valid = std::clamp(s.k - kb, int64_t{0}, nk);
    if (runs_of_c) {  // tap ij of (c, kb + q) read in runs of c, transposed in 8 x 8 blocks
      // float32 runs are transposed where they are, bfloat16 ones widened into `runs` first
      const auto tap = [&](int ij, int64_t q) { return f.at(ij, c0, kb + q); };
      if (s.bf16)
        for (int ij = 0; ij < 9; ++ij)
          for (int64_t q = 0; q < valid; ++q) {
            if (q + kPrefetch < valid) Prefetch(g, tap(ij, q + kPrefetch), nc, true);
            LoadRow(g, tap(ij, q), runs + (ij * kBlock + q) * nc, nc, true);
          }
      const float* from = s.bf16 ? runs : static_cast<const float*>(g);
      const auto run = [&](int ij, int64_t q) {
        return s.bf16 ? (ij * kBlock + q) * nc : tap(ij, q);
      };
      const int64_t lds = s.bf16 ? nc : f.out;
      for (int ij = 0; ij < 9; ++ij)
        for (int64_t q0 = 0; q0 < valid; q0 += 8) {
          if (!s.bf16)
            for (int64_t q = q0 + 8; q < std::min(valid, q0 + 16); ++q)
              Prefetch(g, tap(ij, q), nc, false);
          for (int64_t b0 = 0; b0 < nc; b0 += 8) {
            if (q0 + 8 <= valid && b0 + 8 <= nc) {
              Transpose8(from + run(ij, q0) + b0, lds, cols + (b0 * 9 + ij) * kBlock + q0,
                         9 * kBlock);
              continue;
            }
            for (int64_t q = q0; q < std::min(valid, q0 + 8); ++q)
              for (int64_t b = b0; b < std::min(nc, b0 + 8); ++b)
                cols[(b * 9 + ij) * kBlock + q] = from[run(ij, q) + b];
          }
        }
    }
    for (int64_t c = c0; c < c1; ++c) {
      float* rows = runs_of_c ? cols + (c - c0) * 9 * kBlock : d;
      const float* taps[9];
      for (int ij = 0; ij < 9; ++ij) {
        float* dst = rows + ij * kBlock;
        taps[ij] = dst;
        if (!runs_of_c) {
          const int64_t src = f.at(ij, c, kb);  // f.out == 1
          if (c + kPrefetch < c1) Prefetch(g, src + kPrefetch * f.in, valid, s.bf16);
          if (!s.bf16 && valid == nk) {  // a whole float32 run, read where it is
            taps[ij] = static_cast<const float*>(g) + src;
            continue;
          }
          LoadRow(g, src, dst, valid, s.bf16);
        }
        if (valid < nk) std::memset(dst + valid, 0, (nk - valid) * sizeof(float));
      }
      Separable<3, A>(
          Tile<M>::Filter, [&](int i, int j) { return taps[i * 3 + j]; },
          [&](int xi, int nu) { return u + ((xi * A + nu) * plane + c - c0) * ld + kb - k0; },
          t, nk);
    }
  }
}

// dW of input channels [c0, c1) and output channels [k0, k1) from dU: G^T dU G, written
// through the filter's view; element (xi, c, k) of dU at du[(xi * plane + c - c0) * ld + k - k0].
template <int M>
inline __attribute__((always_inline)) void FilterGradRows(const WinogradShape& s,
                                                          const float* du, int64_t plane,
                                                          int64_t ld, void* g, int64_t c0,
                                                          int64_t c1, int64_t k0, int64_t k1) {
  constexpr int A = Tile<M>::kAlpha;
  const FilterView& f = s.filter;
  alignas(64) float t[3 * A * kBlock], o[9 * kBlock];
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t kb = k0; kb < std::min(k1, s.k); kb += kBlock) {
      const int64_t nk = std::min(kBlock, std::min(k1, s.k) - kb);
      Separable<A, 3>(
          Tile<M>::FilterGrad,
          [&](int xi, int nu) { return du + ((xi * A + nu) * plane + c - c0) * ld + kb - k0; },
          [&](int i, int j) { return o + (i * 3 + j) * kBlock; }, t, nk);
      for (int ij = 0; ij < 9; ++ij) {
        const int64_t dst = f.at(ij, c, kb);
        if (f.out == 1) StoreRow(o + ij * kBlock, g, dst, nk, s.bf16);
        else for (int64_t q = 0; q < nk; ++q) Put(g, dst + q * f.out, o[ij * kBlock + q], s.bf16);
      }
    }
}

// ------------------------------------------------------------------------- the passes

#define JAXCONV_WINOGRAD_ISA(SUFFIX, TARGET)                                               \
  template <int M>                                                                        \
  TARGET void Input##SUFFIX(const WinogradShape& s, const void* x, const Rows& v,        \
                            int64_t p0, int64_t p1) { InputTiles<M>(s, x, v, p0, p1); }   \
  template <int M>                                                                        \
  TARGET void Output##SUFFIX(const WinogradShape& s, const Rows& mm, void* y, int64_t ldy, \
                             int64_t p0, int64_t p1) {                                    \
    OutputTiles<M>(s, mm, y, ldy, p0, p1);                                                \
  }                                                                                       \
  template <int M>                                                                        \
  TARGET void Grad##SUFFIX(const WinogradShape& s, const void* dy, const Rows& dm,       \
                           int64_t p0, int64_t p1) { GradTiles<M>(s, dy, dm, p0, p1); }   \
  template <int M>                                                                        \
  TARGET void Filter##SUFFIX(const WinogradShape& s, const void* g, float* u, int64_t plane, \
                             int64_t ld, int64_t c0, int64_t c1, int64_t k0, int64_t k1,  \
                             float* scratch) {                                            \
    FilterRows<M>(s, g, u, plane, ld, c0, c1, k0, k1, scratch);                           \
  }                                                                                       \
  template <int M>                                                                        \
  TARGET void FilterGrad##SUFFIX(const WinogradShape& s, const float* du, int64_t plane,  \
                                 int64_t ld, void* g, int64_t c0, int64_t c1, int64_t k0, \
                                 int64_t k1) {                                            \
    FilterGradRows<M>(s, du, plane, ld, g, c0, c1, k0, k1);                               \
  }

// AVX-512 with BW: without its 16-bit packs, GCC rounded bfloat16 results four at a time
// (xmm), and the output pass, mostly that rounding, took about a fifth of a bfloat16 forward's
// samples at 56x56 x 64 channels (perf, 2-core Zen 4); with them 32 at a time
// (docs/lowerings.md, "Winograd")
JAXCONV_WINOGRAD_ISA(Avx512, __attribute__((target("avx512f,avx512vl,avx512bw,fma"))))
JAXCONV_WINOGRAD_ISA(Avx2, __attribute__((target("avx2,fma"))))
JAXCONV_WINOGRAD_ISA(Plain, )

#define JAXCONV_WINOGRAD_DISPATCH(PASS, M, ...)                    \
  do {                                                             \
    switch (IsaForCpu()) {                                         \
      case Isa::kAvx512: PASS##Avx512<M>(__VA_ARGS__); break;      \
      case Isa::kAvx2: PASS##Avx2<M>(__VA_ARGS__); break;          \
      default: PASS##Plain<M>(__VA_ARGS__); break;                 \
    }                                                              \
  } while (0)

#define JAXCONV_WINOGRAD_BY_TILE(PASS, m, ...)                          \
  do {                                                                  \
    if ((m) == 2) JAXCONV_WINOGRAD_DISPATCH(PASS, 2, __VA_ARGS__);      \
    else if ((m) == 3) JAXCONV_WINOGRAD_DISPATCH(PASS, 3, __VA_ARGS__); \
    else JAXCONV_WINOGRAD_DISPATCH(PASS, 4, __VA_ARGS__);               \
  } while (0)

// The threads OnTeam splits work between.
int64_t TeamThreads() { return Omp().teams() ? std::max(1, Omp().get_max_threads()) : 1; }

// Blocks of kWinogradFilterColumns output channels over K padded.
int64_t ColumnGroups(const WinogradShape& s) {
  return (s.k_padded() + kWinogradFilterColumns - 1) / kWinogradFilterColumns;
}

// Runs fn(first, end) over [0, n) split between the OpenMP team's threads (the calling thread
// alone without a team).
template <typename Fn>
void OnTeam(int64_t n, const Fn& fn) {
  struct Job {
    const Fn* fn;
    int64_t n;
  } job{&fn, n};
  auto run = [](void* data) {
    const auto& j = *static_cast<Job*>(data);
    const int64_t t = Omp().thread_num(), k = Omp().num_threads();
    (*j.fn)(j.n * t / k, j.n * (t + 1) / k);
  };
  if (Omp().teams()) Omp().parallel(run, &job, 0, 0);
  else fn(0, n);
}

// A working buffer kept between calls up to kWinogradKeepBytes (one per thread, or guarded by
// the caller's RunMutex).
class Work {
 public:
  float* Get(size_t floats) {
    const size_t bytes = std::max<size_t>(floats, 1) * sizeof(float);
    if (bytes > size_) data_ = Allocate(bytes, true), size_ = bytes;
    return reinterpret_cast<float*>(data_.get());
  }
  void Trim() {
    if (size_ > kWinogradKeepBytes) data_.reset(), size_ = 0;
  }

 private:
  AlignedBytes data_;
  size_t size_ = 0;
};

// The calls' shared buffers: 0 and 1 V and M (or dM) of the staged passes, or the threads'
// dU of the fused weight gradient; 2 U or dU; 3 a dense copy of the filter.
Work& Shared(int which) {
  static Work* w = new Work[4];
  return w[which];
}

// The filter as the transforms read it (FilterRows): the caller's where its output or its input
// channels are contiguous (the forward's, the data gradient's swapped view), else a dense
// float32 3 x 3 x C x K copy made in 16 x 16 blocks of channels, so that the transform reads
// whole rows (gathered element by element, it took a third of a 14x14 256-channel data
// gradient). Returns the shape that reads it.
WinogradShape ReadableFilter(const WinogradShape& s, const void* g, const void** from) {
  *from = g;
  if (s.filter.out == 1 || s.filter.in == 1) return s;
  float* copy = Shared(3).Get(9 * s.c * s.k);
  const FilterView& f = s.filter;
  OnTeam(9 * ((s.c + 15) / 16), [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t ij = w % 9, c0 = w / 9 * 16, c1 = std::min(s.c, c0 + 16);
      const int64_t tap = f.at(ij, 0, 0);
      for (int64_t k0 = 0; k0 < s.k; k0 += 16)
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t k = k0; k < std::min(s.k, k0 + 16); ++k)
            copy[(ij * s.c + c) * s.k + k] = Get(g, tap + c * f.in + k * f.out, s.bf16);
    }
  });
  WinogradShape dense = s;
  dense.filter = {0, 3 * s.c * s.k, s.c * s.k, s.k, 1};
  dense.bf16 = false;
  *from = copy;
  return dense;
}

// The lines FilterRows reads for U's block of input channels [c0, c0 + kWinogradFilterBlock)
// and output channels [k0, k0 + kWinogradFilterColumns) of the filter view fs at `from`: per
// tap, rows of output channels where those are contiguous, else rows of input channels (one
// line more than their length, for rows that do not start a line).
Prefetches FilterBlockLines(const WinogradShape& fs, const void* from, int64_t c0, int64_t k0) {
  const FilterView& f = fs.filter;
  const int64_t bytes = fs.bf16 ? 2 : 4;
  const int64_t nc = std::min(kWinogradFilterBlock, fs.c - c0);
  const int64_t nk = std::min(kWinogradFilterColumns, fs.k - k0);
  Prefetches p;
  if (nc <= 0 || nk <= 0) return p;
  p.base = static_cast<const char*>(from) + f.at(0, c0, k0) * bytes;
  p.taps = 9;
  for (int ij = 0; ij < 9; ++ij) p.tap[ij] = (f.at(ij, c0, k0) - f.at(0, c0, k0)) * bytes;
  const bool by_c = f.out == 1;  // rows of output channels, one per input channel
  p.row = (by_c ? f.in : f.out) * bytes;
  p.rows = by_c ? nc : nk;
  p.lines = static_cast<int>(((by_c ? nk : nc) * bytes + 63) / 64 + 1);
  return p;
}

// U = G g G^T (alpha^2 x C x K padded), on the team, in blocks of input channels.
float* TransformFilter(const WinogradShape& s, const void* g) {
  const int64_t a2 = s.alpha() * s.alpha(), kp = s.k_padded();
  float* u = Shared(2).Get(a2 * s.u_plane() * kp);
  const void* from;
  const WinogradShape fs = ReadableFilter(s, g, &from);
  const bool runs = fs.filter.out != 1;  // FilterRows transposes runs of input channels
  const int64_t threads = TeamThreads();
  const int64_t cb = std::clamp<int64_t>((s.c + 4 * threads - 1) / (4 * threads), 16,
                                         kWinogradFilterBlock);
  OnTeam((s.c + cb - 1) / cb, [&](int64_t b0, int64_t b1) {
    thread_local Work scratch_work;
    float* scratch = runs ? scratch_work.Get(kWinogradFilterScratch) : nullptr;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * cb, c1 = std::min(s.c, c0 + cb);
      JAXCONV_WINOGRAD_BY_TILE(Filter, s.m, fs, from, u + c0 * kp, s.u_plane(), kp, c0, c1, 0,
                               kp, scratch);
    }
  });
  return u;
}

}  // namespace

namespace {

std::atomic<size_t> chunk_bytes{kWinogradChunkBytes};

// Tiles a chunk of the staged passes: its V and M (or dM) within the chunk's bytes.
int64_t ChunkTiles(const WinogradShape& s) {
  const int64_t a2 = s.alpha() * s.alpha();
  return std::clamp<int64_t>(
      chunk_bytes.load() / (a2 * (s.c + s.k_padded()) * sizeof(float)), 1, s.tiles());
}

// The forward in three passes over chunks of tiles (V and M of a chunk within
// kWinogradChunkBytes): V; the products; then y. A chunk of more than kWinogradBlockedMaxTiles
// tiles is multiplied by the whole U, the threads sharing positions and blocks of 32 output
// channels; a smaller one per block of kWinogradFilterColumns output channels (and of rows,
// where the blocks are fewer than twice the threads), each transforming its block of U from
// the filter kWinogradFilterBlock input channels at a time into its cache (written and read
// back from memory, the whole U cost more than the products at 7x7).
void ForwardStaged(const WinogradShape& s, const void* x, const void* g, void* y) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), rows = RowsPerBlock(), chunk = ChunkTiles(s);
  const int64_t threads = TeamThreads();
  const int64_t groups = ColumnGroups(s);
  const int64_t splits = std::max<int64_t>(1, (2 * threads + groups - 1) / groups);
  const Rows v{Shared(0).Get(a2 * chunk * s.c), chunk, 0, s.c};
  const Rows mm{Shared(1).Get(a2 * chunk * kp), chunk, 0, kp};
  const bool blocked = std::min(chunk, P) <= kWinogradBlockedMaxTiles;
  const float* u = blocked ? nullptr : TransformFilter(s, g);
  const void* from = g;
  const WinogradShape fs = blocked ? ReadableFilter(s, g, &from) : s;
  const int64_t cols = kp / 32;
  for (int64_t first = 0; first < P; first += chunk) {
    const int64_t end = std::min(P, first + chunk), n = end - first;
    const Rows vc{v.base, chunk, first, s.c}, mc{mm.base, chunk, first, kp};
    OnTeam(n, [&](int64_t p0, int64_t p1) {
      JAXCONV_WINOGRAD_BY_TILE(Input, s.m, s, x, vc, first + p0, first + p1);
    });
    if (!blocked) OnTeam(a2 * cols, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int xi = static_cast<int>(w / cols);
        const int64_t k0 = w % cols * 32;
        const Run r = Using(s, xi, first, end);
        if (r.hi > r.lo)
          Product({vc.at(xi, r.lo), s.c, 1, u + xi * s.u_plane() * kp + k0, kp,
                   mc.at(xi, r.lo) + k0, kp}, r.hi - r.lo, s.c, 32, false);
      }
    });
    else OnTeam(groups * splits, [&](int64_t w0, int64_t w1) {
      thread_local Work u_work;
      constexpr int64_t plane = kWinogradFilterBlock + 1;  // rows a position (u_plane)
      float* ub = u_work.Get(a2 * plane * kWinogradFilterColumns + kWinogradFilterScratch);
      float* scratch = ub + a2 * plane * kWinogradFilterColumns;
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t k0 = w / splits * kWinogradFilterColumns, part = w % splits;
        const int64_t nk = std::min(kWinogradFilterColumns, kp - k0);
        const int64_t r0 = first + (n * part / splits) / rows * rows;
        const int64_t r1 = part + 1 == splits ? end : first + (n * (part + 1) / splits) / rows * rows;
        if (r0 >= r1) continue;
        for (int64_t c0 = 0; c0 < s.c; c0 += kWinogradFilterBlock) {
          const int64_t c1 = std::min(s.c, c0 + kWinogradFilterBlock);
          JAXCONV_WINOGRAD_BY_TILE(Filter, s.m, fs, from, ub, plane, nk, c0, c1, k0, k0 + nk,
                                   scratch);
          // the products fetch the lines of this thread's next block of the filter (its next
          // input channels, else its next column group's first) as they run: the transform
          // had spent most of its time waiting for them (docs/lowerings.md, "Winograd")
          const bool last = c0 + kWinogradFilterBlock >= s.c;
          const int64_t next = last ? w + 1 : w;
          Prefetches lines;
          if (next < w1)
            lines = FilterBlockLines(fs, from, last ? 0 : c0 + kWinogradFilterBlock,
                                     next / splits * kWinogradFilterColumns);
          for (int xi = 0; xi < a2; ++xi) {
            const Run r = Using(s, xi, r0, r1);
            if (r.hi > r.lo)
              Product({vc.at(xi, r.lo) + c0, s.c, 1, ub + xi * plane * nk, nk,
                       mc.at(xi, r.lo) + k0, kp, &lines}, r.hi - r.lo, c1 - c0, nk, c0 > 0);
          }
        }
      }
      u_work.Trim();
    });
    OnTeam(n, [&](int64_t p0, int64_t p1) {
      JAXCONV_WINOGRAD_BY_TILE(Output, s.m, s, mc, y, s.k, first + p0, first + p1);
    });
  }
}

// The forward fused per block of tiles: each thread transforms a block into V, multiplies it
// by all of U, and transforms M into y while the block is in its cache.
void ForwardFused(const WinogradShape& s, const void* x, const float* u, void* y) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), rows = RowsPerBlock(), P = s.tiles();
  const int64_t fit = kWinogradBlockBytes / (a2 * (s.c + kp) * sizeof(float));
  const int64_t block = std::min((P + rows - 1) / rows, std::max<int64_t>(1, fit / rows)) * rows;
  OnTeam((P + block - 1) / block, [&](int64_t b0, int64_t b1) {
    thread_local Work v_work, m_work;
    float* v = v_work.Get(a2 * block * s.c);
    float* mm = m_work.Get(a2 * block * kp);
    for (int64_t p = b0 * block; p < std::min(P, b1 * block); p += block) {
      const int64_t end = std::min(P, p + block);
      const Rows vr{v, block, p, s.c}, mr{mm, block, p, kp};
      JAXCONV_WINOGRAD_BY_TILE(Input, s.m, s, x, vr, p, end);
      for (int xi = 0; xi < a2; ++xi) {
        const Run r = Using(s, xi, p, end);
        if (r.hi > r.lo)
          Product({vr.at(xi, r.lo), s.c, 1, u + xi * s.u_plane() * kp, kp, mr.at(xi, r.lo), kp},
                  r.hi - r.lo, s.c, kp, false);
      }
      JAXCONV_WINOGRAD_BY_TILE(Output, s.m, s, mr, y, s.k, p, end);
    }
    v_work.Trim();
    m_work.Trim();
  });
}

}  // namespace

int WinogradIsa() { return static_cast<int>(IsaForCpu()); }

void SetWinogradChunkBytes(size_t bytes) {
  chunk_bytes = bytes == 0 ? kWinogradChunkBytes : bytes;
}

void WinogradForward(const WinogradShape& s, const void* x, const void* g, void* y) {
  const size_t u_bytes = s.alpha() * s.alpha() * s.c * s.k_padded() * sizeof(float);
  if (u_bytes <= kWinogradFusedMaxFilterBytes) ForwardFused(s, x, TransformFilter(s, g), y);
  else ForwardStaged(s, x, g, y);
  for (int i = 0; i < 4; ++i) Shared(i).Trim();
}

namespace {

// dU of the weight gradient over chunks of tiles: transform a chunk (V and dM), then the
// products per position and row block of C, the chunk's sum over tiles in registers.
void WeightStaged(const WinogradShape& s, const void* x, const void* dy, float* du) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), rows = RowsPerBlock(), chunk = ChunkTiles(s);
  float* v = Shared(0).Get(a2 * chunk * s.c);
  float* dm = Shared(1).Get(a2 * chunk * kp);
  const int64_t blocks = (s.c + rows - 1) / rows;
  for (int64_t first = 0; first < P; first += chunk) {
    const int64_t end = std::min(P, first + chunk);
    const Rows vc{v, chunk, first, s.c}, dc{dm, chunk, first, kp};
    OnTeam(end - first, [&](int64_t p0, int64_t p1) {
      JAXCONV_WINOGRAD_BY_TILE(Input, s.m, s, x, vc, first + p0, first + p1);
      JAXCONV_WINOGRAD_BY_TILE(Grad, s.m, s, dy, dc, first + p0, first + p1);
    });
    OnTeam(a2 * blocks, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int xi = static_cast<int>(w / blocks);
        const int64_t c0 = w % blocks * rows, n = std::min(rows, s.c - c0);
        const Run r = Using(s, xi, first, end);
        float* out = du + (xi * s.c + c0) * kp;
        if (r.hi > r.lo)
          Product({vc.at(xi, r.lo) + c0, 1, s.c, dc.at(xi, r.lo), kp, out, kp}, n, r.hi - r.lo,
                  kp, first > 0);
        else if (first == 0)
          std::memset(out, 0, n * kp * sizeof(float));
      }
    });
  }
}

// The input channels of WeightBlocked's blocks: kWinogradWeightRows, fewer where the blocks
// would not keep the threads busy.
int64_t WeightBlockRows(const WinogradShape& s) {
  const int64_t threads = TeamThreads();
  const int64_t groups = ColumnGroups(s);
  int64_t cb = kWinogradWeightRows;
  while (cb > RowsPerBlock() && (s.c + cb - 1) / cb * groups < 4 * threads) cb -= RowsPerBlock();
  return cb;
}

// dW where all tiles fit one chunk: transform them (V and dM), then, per block of cb input
// channels and kWinogradFilterColumns output channels, every position's products into a block
// of dU in the thread's cache and G^T dU G from there. dU is never written whole, but each
// block of input channels reads all of dM's columns of its block: C / cb times dM's P rows
// against WeightStaged's writing and reading back dU's C rows, so the caller takes this where
// P <= 2 cb. (Measured on a 2-core Zen 4 only: at 8 x 5 x 5 x 512, 32 tiles, writing dU's
// 26 MB and reading it back took a third of the weight gradient, and blocks lost from 128
// tiles; docs/lowerings.md, "Winograd".)
void WeightBlocked(const WinogradShape& s, const void* x, const void* dy, void* dw,
                   int64_t cb) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles();
  const Rows vc{Shared(0).Get(a2 * P * s.c), P, 0, s.c};
  const Rows dc{Shared(1).Get(a2 * P * kp), P, 0, kp};
  OnTeam(P, [&](int64_t p0, int64_t p1) {
    JAXCONV_WINOGRAD_BY_TILE(Input, s.m, s, x, vc, p0, p1);
    JAXCONV_WINOGRAD_BY_TILE(Grad, s.m, s, dy, dc, p0, p1);
  });
  const int64_t groups = ColumnGroups(s);
  const int64_t plane = cb + 1;  // as U's (WinogradShape::u_plane)
  OnTeam((s.c + cb - 1) / cb * groups, [&](int64_t w0, int64_t w1) {
    thread_local Work du_work;
    float* db = du_work.Get(a2 * plane * kWinogradFilterColumns);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t c0 = w / groups * cb, c1 = std::min(s.c, c0 + cb);
      const int64_t k0 = w % groups * kWinogradFilterColumns;
      const int64_t nk = std::min(kWinogradFilterColumns, kp - k0);
      for (int xi = 0; xi < a2; ++xi) {
        const Run r = Using(s, xi, 0, P);
        if (r.hi > r.lo)
          Product({vc.at(xi, r.lo) + c0, 1, s.c, dc.at(xi, r.lo) + k0, kp, db + xi * plane * nk,
                   nk}, c1 - c0, r.hi - r.lo, nk, false);
        else
          std::memset(db + xi * plane * nk, 0, (c1 - c0) * nk * sizeof(float));
      }
      JAXCONV_WINOGRAD_BY_TILE(FilterGrad, s.m, s, db, plane, nk, dw, c0, c1, k0, k0 + nk);
    }
    du_work.Trim();
  });
}

// dU of the weight gradient fused per block of tiles: each thread transforms a block (V and
// dM within kWinogradBlockBytes) and adds its products into its own dU, kept in its cache;
// the threads' dU are then summed.
void WeightFused(const WinogradShape& s, const void* x, const void* dy, float* du) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), size = a2 * s.c * kp;
  const int64_t block = std::clamp<int64_t>(
      kWinogradBlockBytes / (a2 * (s.c + kp) * sizeof(float)), 1, P);
  const int64_t threads = TeamThreads();
  float* partial = Shared(0).Get(threads * size);
  OnTeam(threads, [&](int64_t t0, int64_t t1) {  // one share of the blocks per thread
    const int64_t blocks = (P + block - 1) / block;
    for (int64_t t = t0; t < t1; ++t) {
      float* mine = partial + t * size;
      std::memset(mine, 0, size * sizeof(float));
      thread_local Work v_work, m_work;
      float* v = v_work.Get(a2 * block * s.c);
      float* dm = m_work.Get(a2 * block * kp);
      for (int64_t b = blocks * t / threads; b < blocks * (t + 1) / threads; ++b) {
        const int64_t p = b * block, end = std::min(P, p + block);
        const Rows vr{v, block, p, s.c}, dr{dm, block, p, kp};
        JAXCONV_WINOGRAD_BY_TILE(Input, s.m, s, x, vr, p, end);
        JAXCONV_WINOGRAD_BY_TILE(Grad, s.m, s, dy, dr, p, end);
        for (int xi = 0; xi < a2; ++xi) {
          const Run r = Using(s, xi, p, end);
          if (r.hi > r.lo)
            Product({vr.at(xi, r.lo), 1, s.c, dr.at(xi, r.lo), kp, mine + xi * s.c * kp, kp},
                    s.c, r.hi - r.lo, kp, true);
        }
      }
      v_work.Trim();
      m_work.Trim();
    }
  });
  OnTeam(size / 16 + 1, [&](int64_t e0, int64_t e1) {
    const int64_t lo = std::min(size, e0 * 16), hi = std::min(size, e1 * 16);
    for (int64_t e = lo; e < hi; ++e) {
      float sum = partial[e];
      for (int64_t t = 1; t < threads; ++t) sum += partial[t * size + e];
      du[e] = sum;
    }
  });
}

}  // namespace

void WinogradWeight(const WinogradShape& s, const void* x, const void* dy, void* dw) {
  const int64_t kp = s.k_padded();
  const size_t du_bytes = s.alpha() * s.alpha() * s.c * kp * sizeof(float);
  const int64_t rows = WeightBlockRows(s);
  if (du_bytes > kWinogradFusedMaxWeightBytes && ChunkTiles(s) >= s.tiles() &&
      s.tiles() <= 2 * rows) {
    WeightBlocked(s, x, dy, dw, rows);
  } else {
    float* du = Shared(2).Get(du_bytes / sizeof(float));
    if (du_bytes <= kWinogradFusedMaxWeightBytes) WeightFused(s, x, dy, du);
    else WeightStaged(s, x, dy, du);
    OnTeam(s.c, [&](int64_t c0, int64_t c1) {
      JAXCONV_WINOGRAD_BY_TILE(FilterGrad, s.m, s, du + c0 * kp, s.c, kp, dw, c0, c1, 0, s.k);
    });
  }
  for (int i = 0; i < 4; ++i) Shared(i).Trim();
}

}  // namespace jaxconv_onednn
