// The passes over Winograd's tiles (winograd_passes.h): each transform compiled for AVX-512,
// for AVX2 and for neither, the CPU's features picking one when the library loads
// (runtime/isa.h's IsaForCpu), and one entry per pass that dispatches on the tile side.
#include "winograd_passes.h"

#include <algorithm>
#include <cstring>

#include "winograd_product.h"
#include "winograd_tiles.h"

namespace jaxconv_onednn {

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

}  // namespace

void InputPass(int m, const WinogradShape& s, const void* x, const Rows& v, int64_t p0,
               int64_t p1) {
  JAXCONV_WINOGRAD_BY_TILE(Input, m, s, x, v, p0, p1);
}

void OutputPass(int m, const WinogradShape& s, const Rows& mm, void* y, int64_t ldy, int64_t p0,
                int64_t p1) {
  JAXCONV_WINOGRAD_BY_TILE(Output, m, s, mm, y, ldy, p0, p1);
}

void GradPass(int m, const WinogradShape& s, const void* dy, const Rows& dm, int64_t p0,
              int64_t p1) {
  JAXCONV_WINOGRAD_BY_TILE(Grad, m, s, dy, dm, p0, p1);
}

void FilterPass(int m, const WinogradShape& s, const void* g, float* u, int64_t plane,
                int64_t ld, int64_t c0, int64_t c1, int64_t k0, int64_t k1, float* scratch) {
  JAXCONV_WINOGRAD_BY_TILE(Filter, m, s, g, u, plane, ld, c0, c1, k0, k1, scratch);
}

void FilterGradPass(int m, const WinogradShape& s, const float* du, int64_t plane, int64_t ld,
                    void* g, int64_t c0, int64_t c1, int64_t k0, int64_t k1) {
  JAXCONV_WINOGRAD_BY_TILE(FilterGrad, m, s, du, plane, ld, g, c0, c1, k0, k1);
}

}  // namespace jaxconv_onednn
