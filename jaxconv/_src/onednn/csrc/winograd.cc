// Winograd F(m x m, 3 x 3) on float32 NHWC buffers (winograd.h).
//
// The matrices (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016):
// F(2, 3) interpolates at 0, 1, -1 and infinity, F(4, 3) at 0, 1, -1, 2, -2 and infinity
// (lowering/winograd.py holds them as matrices; the tests compare). Each transform below is
// its matrix written out, applied to rows of channels: a loop over a channel block that the
// compiler vectorises. Every pass is compiled for AVX-512, for AVX2 and for neither, and the
// CPU's features pick one when the library loads.
#include "winograd.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "execute.h"
#include "openmp.h"

namespace jaxconv_onednn {

const char* WinogradShape::Invalid() const {
  if (m != 2 && m != 4) return "the tile size must be 2 or 4";
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

constexpr int64_t kBlock = 64;  // channels per transform row (a block stays in L1)

#define JAXCONV_ROWS _Pragma("GCC ivdep") for (int64_t i = 0; i < n; ++i)

// Elements of the caller's buffers (float32, or bfloat16: the passes compute in float32).
inline float FromBf16(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rounded to the nearest bfloat16, ties to even; a NaN stays a (quiet) NaN.
inline uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// n elements of buffer `src` from element `at` into floats.
inline __attribute__((always_inline)) void LoadRow(const void* src, int64_t at, float* dst,
                                                   int64_t n, bool bf16) {
  if (!bf16) {
    std::memcpy(dst, static_cast<const float*>(src) + at, n * sizeof(float));
    return;
  }
  const uint16_t* in = static_cast<const uint16_t*>(src) + at;
  JAXCONV_ROWS dst[i] = FromBf16(in[i]);
}

inline __attribute__((always_inline)) void StoreRow(const float* src, void* dst, int64_t at,
                                                    int64_t n, bool bf16) {
  if (!bf16) {
    std::memcpy(static_cast<float*>(dst) + at, src, n * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst) + at;
  JAXCONV_ROWS out[i] = ToBf16(src[i]);
}

inline float Get(const void* src, int64_t at, bool bf16) {
  return bf16 ? FromBf16(static_cast<const uint16_t*>(src)[at]) : static_cast<const float*>(src)[at];
}

inline void Put(void* dst, int64_t at, float v, bool bf16) {
  if (bf16) static_cast<uint16_t*>(dst)[at] = ToBf16(v);
  else static_cast<float*>(dst)[at] = v;
}

template <int M>
struct Tile;

template <>
struct Tile<2> {
  static constexpr int kAlpha = 4;
  // t = B^T d over alpha rows of n channels
  static inline void Input(const float* const* d, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float d0 = d[0][i], d1 = d[1][i], d2 = d[2][i], d3 = d[3][i];
      t[0][i] = d0 - d2;
      t[1][i] = d1 + d2;
      t[2][i] = d2 - d1;
      t[3][i] = d1 - d3;
    }
  }
  // y = A^T s: alpha rows into m
  static inline void Output(const float* const* s, float* const* y, int64_t n) {
    JAXCONV_ROWS {
      const float s1 = s[1][i], s2 = s[2][i];
      y[0][i] = s[0][i] + s1 + s2;
      y[1][i] = s1 - s2 - s[3][i];
    }
  }
  // t = A e: m rows of dy into alpha (the adjoint of Output)
  static inline void Grad(const float* const* e, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float e0 = e[0][i], e1 = e[1][i];
      t[0][i] = e0;
      t[1][i] = e0 + e1;
      t[2][i] = e0 - e1;
      t[3][i] = -e1;
    }
  }
  // t = G g: 3 rows of the filter into alpha
  static inline void Filter(const float* const* g, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float g0 = g[0][i], g1 = g[1][i], g2 = g[2][i];
      const float h = 0.5f * (g0 + g2);
      t[0][i] = g0;
      t[1][i] = h + 0.5f * g1;
      t[2][i] = h - 0.5f * g1;
      t[3][i] = g2;
    }
  }
  // o = G^T d: alpha rows of dU into 3 (the adjoint of Filter)
  static inline void FilterGrad(const float* const* d, float* const* o, int64_t n) {
    JAXCONV_ROWS {
      const float p = 0.5f * (d[1][i] + d[2][i]);
      o[0][i] = d[0][i] + p;
      o[1][i] = 0.5f * (d[1][i] - d[2][i]);
      o[2][i] = p + d[3][i];
    }
  }
};

template <>
struct Tile<4> {
  static constexpr int kAlpha = 6;
  static inline void Input(const float* const* d, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float d0 = d[0][i], d1 = d[1][i], d2 = d[2][i], d3 = d[3][i], d4 = d[4][i],
                  d5 = d[5][i];
      const float a = d4 - 4.0f * d2, b = d3 - 4.0f * d1;  // rows 1, 2
      const float c = d4 - d2, e = 2.0f * (d3 - d1);       // rows 3, 4
      t[0][i] = 4.0f * d0 - 5.0f * d2 + d4;
      t[1][i] = a + b;
      t[2][i] = a - b;
      t[3][i] = c + e;
      t[4][i] = c - e;
      t[5][i] = 4.0f * d1 - 5.0f * d3 + d5;
    }
  }
  static inline void Output(const float* const* s, float* const* y, int64_t n) {
    JAXCONV_ROWS {
      const float p12 = s[1][i] + s[2][i], m12 = s[1][i] - s[2][i];
      const float p34 = s[3][i] + s[4][i], m34 = s[3][i] - s[4][i];
      y[0][i] = s[0][i] + p12 + p34;
      y[1][i] = m12 + 2.0f * m34;
      y[2][i] = p12 + 4.0f * p34;
      y[3][i] = m12 + 8.0f * m34 + s[5][i];
    }
  }
  static inline void Grad(const float* const* e, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float e0 = e[0][i], e1 = e[1][i], e2 = e[2][i], e3 = e[3][i];
      const float p02 = e0 + e2, p13 = e1 + e3;
      const float q02 = e0 + 4.0f * e2, q13 = 2.0f * e1 + 8.0f * e3;
      t[0][i] = e0;
      t[1][i] = p02 + p13;
      t[2][i] = p02 - p13;
      t[3][i] = q02 + q13;
      t[4][i] = q02 - q13;
      t[5][i] = e3;
    }
  }
  static inline void Filter(const float* const* g, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float g0 = g[0][i], g1 = g[1][i], g2 = g[2][i];
      const float p = g0 + g2, q = g0 * (1.0f / 24) + g2 * (1.0f / 6), r = g1 * (1.0f / 12);
      t[0][i] = 0.25f * g0;
      t[1][i] = -(p + g1) * (1.0f / 6);
      t[2][i] = -(p - g1) * (1.0f / 6);
      t[3][i] = q + r;
      t[4][i] = q - r;
      t[5][i] = g2;
    }
  }
  static inline void FilterGrad(const float* const* d, float* const* o, int64_t n) {
    JAXCONV_ROWS {
      const float p12 = d[1][i] + d[2][i], m12 = d[2][i] - d[1][i];
      const float p34 = d[3][i] + d[4][i], m34 = d[3][i] - d[4][i];
      o[0][i] = 0.25f * d[0][i] - p12 * (1.0f / 6) + p34 * (1.0f / 24);
      o[1][i] = m12 * (1.0f / 6) + m34 * (1.0f / 12);
      o[2][i] = (p34 - p12) * (1.0f / 6) + d[5][i];
    }
  }
};

// The tile p's position: image, first output row and column.
struct At {
  int64_t n, oy, ox;
};

inline At TileAt(const WinogradShape& s, int64_t p) {
  const int64_t th = s.tiles_h(), tw = s.tiles_w();
  return {p / (th * tw), (p / tw) % th * s.m, p % tw * s.m};
}

// Where a pass writes or reads tile p's alpha^2 rows: row (xi * plane + p - first) of `ld`
// floats each, at base.
struct Rows {
  float* base;
  int64_t plane, first, ld;
  float* at(int xi, int64_t p) const { return base + (xi * plane + p - first) * ld; }
};

// The separable 2D transform of one tile's block of channels: f (NIN rows of channels into
// NOUT) down each of the NIN columns of src (src(i, j): row i, column j) into t, then along
// each of t's NOUT rows into dst(r, q).
template <int NIN, int NOUT, typename F, typename Src, typename Dst>
inline __attribute__((always_inline)) void Separable(F f, const Src& src, const Dst& dst,
                                                     float* t, int64_t n) {
  const float* rows[NIN];
  float* outs[NOUT];
  for (int j = 0; j < NIN; ++j) {
    for (int i = 0; i < NIN; ++i) rows[i] = src(i, j);
    for (int r = 0; r < NOUT; ++r) outs[r] = t + (r * NIN + j) * kBlock;
    f(rows, outs, n);
  }
  for (int r = 0; r < NOUT; ++r) {
    for (int j = 0; j < NIN; ++j) rows[j] = t + (r * NIN + j) * kBlock;
    for (int q = 0; q < NOUT; ++q) outs[q] = dst(r, q);
    f(rows, outs, n);
  }
}

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

// U rows of input channels [c0, c1): (G g G^T)[xi] for each, zeros in the padded columns.
template <int M>
inline __attribute__((always_inline)) void FilterRows(const WinogradShape& s, const void* g,
                                                      float* u, int64_t c0, int64_t c1) {
  constexpr int A = Tile<M>::kAlpha;
  const int64_t kp = s.k_padded();
  const FilterView& f = s.filter;
  alignas(64) float d[9 * kBlock], t[A * 3 * kBlock];
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t k0 = 0; k0 < kp; k0 += kBlock) {
      const int64_t nk = std::min(kBlock, kp - k0), valid = std::clamp(s.k - k0, int64_t{0}, nk);
      for (int ij = 0; ij < 9; ++ij) {
        const int64_t src = f.offset + ij / 3 * f.row + ij % 3 * f.col + c * f.in + k0 * f.out;
        float* dst = d + ij * kBlock;
        if (f.out == 1) LoadRow(g, src, dst, valid, s.bf16);
        else for (int64_t q = 0; q < valid; ++q) dst[q] = Get(g, src + q * f.out, s.bf16);
        std::memset(dst + valid, 0, (nk - valid) * sizeof(float));
      }
      Separable<3, A>(
          Tile<M>::Filter, [&](int i, int j) { return d + (i * 3 + j) * kBlock; },
          [&](int xi, int nu) { return u + ((xi * A + nu) * s.c + c) * kp + k0; }, t, nk);
    }
}

// dW of input channels [c0, c1) from dU: G^T dU G, written through the filter's view.
template <int M>
inline __attribute__((always_inline)) void FilterGradRows(const WinogradShape& s,
                                                          const float* du, void* g,
                                                          int64_t c0, int64_t c1) {
  constexpr int A = Tile<M>::kAlpha;
  const int64_t kp = s.k_padded();
  const FilterView& f = s.filter;
  alignas(64) float t[3 * A * kBlock], o[9 * kBlock];
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t k0 = 0; k0 < s.k; k0 += kBlock) {
      const int64_t nk = std::min(kBlock, s.k - k0);
      Separable<A, 3>(
          Tile<M>::FilterGrad,
          [&](int xi, int nu) { return du + ((xi * A + nu) * s.c + c) * kp + k0; },
          [&](int i, int j) { return o + (i * 3 + j) * kBlock; }, t, nk);
      for (int ij = 0; ij < 9; ++ij) {
        const int64_t dst = f.offset + ij / 3 * f.row + ij % 3 * f.col + c * f.in + k0 * f.out;
        if (f.out == 1) StoreRow(o + ij * kBlock, g, dst, nk, s.bf16);
        else for (int64_t q = 0; q < nk; ++q) Put(g, dst + q * f.out, o[ij * kBlock + q], s.bf16);
      }
    }
}

// ------------------------------------------------------------------------- the products
//
// c (rows x cols, row stride ldc) = or += a (rows x inner: element (r, i) at a[r*ar + i*ai])
// times b (inner x cols, row stride ldb); cols a multiple of 32. Each kernel call keeps a
// block of rows x 32 columns of c in registers over the whole inner loop: b's two (AVX-512)
// or four (AVX2) vectors a step, a's element broadcast per row.
struct Operands {
  const float* a;
  int64_t ar, ai;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
};

template <int R>
__attribute__((target("avx512f"), always_inline)) inline void Block512(
    const Operands& o, int64_t inner, bool accumulate) {
  __m512 s[R][2];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v)
      s[r][v] = accumulate ? _mm512_loadu_ps(o.c + r * o.ldc + 16 * v) : _mm512_setzero_ps();
  const float* a = o.a;
  const float* b = o.b;
  for (int64_t i = 0; i < inner; ++i, a += o.ai, b += o.ldb) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * o.ar]);
      s[r][0] = _mm512_fmadd_ps(x, b0, s[r][0]);
      s[r][1] = _mm512_fmadd_ps(x, b1, s[r][1]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v) _mm512_storeu_ps(o.c + r * o.ldc + 16 * v, s[r][v]);
}

template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void Block256(
    const Operands& o, int64_t inner, bool accumulate) {
  __m256 s[R][2];
  for (int half = 0; half < 2; ++half) {  // 32 columns as two blocks of 16
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 2; ++v)
        s[r][v] = accumulate ? _mm256_loadu_ps(o.c + r * o.ldc + 16 * half + 8 * v)
                             : _mm256_setzero_ps();
    const float* a = o.a;
    const float* b = o.b + 16 * half;
    for (int64_t i = 0; i < inner; ++i, a += o.ai, b += o.ldb) {
      const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(a + r * o.ar);
        s[r][0] = _mm256_fmadd_ps(x, b0, s[r][0]);
        s[r][1] = _mm256_fmadd_ps(x, b1, s[r][1]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 2; ++v) _mm256_storeu_ps(o.c + r * o.ldc + 16 * half + 8 * v, s[r][v]);
  }
}

template <int R>
inline void BlockPlain(const Operands& o, int64_t inner, bool accumulate) {
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < 32; ++q) {
      float sum = accumulate ? o.c[r * o.ldc + q] : 0.0f;
      for (int64_t i = 0; i < inner; ++i) sum += o.a[r * o.ar + i * o.ai] * o.b[i * o.ldb + q];
      o.c[r * o.ldc + q] = sum;
    }
}

// rows x cols of c, in blocks of kRows (AVX-512: 12, AVX2: 6) rows x 32 columns.
#define JAXCONV_WINOGRAD_PRODUCT(NAME, BLOCK, ROWS, TARGET)                               \
  TARGET void NAME(Operands o, int64_t rows, int64_t inner, int64_t cols, bool accumulate) { \
    for (int64_t j = 0; j < cols; j += 32) {                                              \
      Operands q = o;                                                                     \
      q.b = o.b + j, q.c = o.c + j;                                                       \
      int64_t r = 0;                                                                      \
      for (; r + ROWS <= rows; r += ROWS, q.a += ROWS * o.ar, q.c += ROWS * o.ldc)        \
        BLOCK<ROWS>(q, inner, accumulate);                                                \
      switch (rows - r) {                                                                 \
        case 11: BLOCK<11 % ROWS>(q, inner, accumulate); break;                           \
        case 10: BLOCK<10 % ROWS>(q, inner, accumulate); break;                           \
        case 9: BLOCK<9 % ROWS>(q, inner, accumulate); break;                             \
        case 8: BLOCK<8 % ROWS>(q, inner, accumulate); break;                             \
        case 7: BLOCK<7 % ROWS>(q, inner, accumulate); break;                             \
        case 6: BLOCK<6 % ROWS>(q, inner, accumulate); break;                             \
        case 5: BLOCK<5>(q, inner, accumulate); break;                                    \
        case 4: BLOCK<4>(q, inner, accumulate); break;                                    \
        case 3: BLOCK<3>(q, inner, accumulate); break;                                    \
        case 2: BLOCK<2>(q, inner, accumulate); break;                                    \
        case 1: BLOCK<1>(q, inner, accumulate); break;                                    \
        default: break;                                                                   \
      }                                                                                   \
    }                                                                                     \
  }

template <>
inline void Block512<0>(const Operands&, int64_t, bool) {}
template <>
inline void Block256<0>(const Operands&, int64_t, bool) {}
template <>
inline void BlockPlain<0>(const Operands&, int64_t, bool) {}

// ------------------------------------------------------------------------- the passes

enum class Isa { kAvx512, kAvx2, kPlain };

// Every pass, compiled for one ISA.
#define JAXCONV_WINOGRAD_ISA(SUFFIX, BLOCK, ROWS, TARGET)                                  \
  JAXCONV_WINOGRAD_PRODUCT(Product##SUFFIX, BLOCK, ROWS, TARGET)                          \
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
  TARGET void Filter##SUFFIX(const WinogradShape& s, const void* g, float* u, int64_t c0, \
                             int64_t c1) { FilterRows<M>(s, g, u, c0, c1); }              \
  template <int M>                                                                        \
  TARGET void FilterGrad##SUFFIX(const WinogradShape& s, const float* du, void* g,       \
                                 int64_t c0, int64_t c1) {                                \
    FilterGradRows<M>(s, du, g, c0, c1);                                                  \
  }

JAXCONV_WINOGRAD_ISA(Avx512, Block512, 12, __attribute__((target("avx512f,avx512vl,fma"))))
JAXCONV_WINOGRAD_ISA(Avx2, Block256, 6, __attribute__((target("avx2,fma"))))
JAXCONV_WINOGRAD_ISA(Plain, BlockPlain, 4, )

// The widest ISA this CPU has, or a narrower one named by JAXCONV_WINOGRAD_ISA ("avx2",
// "plain"; read once): the tests run every path on one machine.
Isa IsaForCpu() {
  static const Isa isa = [] {
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    Isa found = __builtin_cpu_supports("avx512f") ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kPlain;
    const char* asked = std::getenv("JAXCONV_WINOGRAD_ISA");
    if (asked != nullptr && std::strcmp(asked, "plain") == 0) found = Isa::kPlain;
    if (asked != nullptr && std::strcmp(asked, "avx2") == 0 && found == Isa::kAvx512)
      found = Isa::kAvx2;
    return found;
  }();
  return isa;
}

int RowsPerBlock() {
  return IsaForCpu() == Isa::kAvx512 ? 12 : IsaForCpu() == Isa::kAvx2 ? 6 : 4;
}

void Product(const Operands& o, int64_t rows, int64_t inner, int64_t cols, bool accumulate) {
  switch (IsaForCpu()) {
    case Isa::kAvx512: return ProductAvx512(o, rows, inner, cols, accumulate);
    case Isa::kAvx2: return ProductAvx2(o, rows, inner, cols, accumulate);
    default: return ProductPlain(o, rows, inner, cols, accumulate);
  }
}

#define JAXCONV_WINOGRAD_DISPATCH(PASS, M, ...)                    \
  do {                                                             \
    switch (IsaForCpu()) {                                         \
      case Isa::kAvx512: PASS##Avx512<M>(__VA_ARGS__); break;      \
      case Isa::kAvx2: PASS##Avx2<M>(__VA_ARGS__); break;          \
      default: PASS##Plain<M>(__VA_ARGS__); break;                 \
    }                                                              \
  } while (0)

#define JAXCONV_WINOGRAD_BY_TILE(PASS, m, ...)                     \
  do {                                                             \
    if ((m) == 2) JAXCONV_WINOGRAD_DISPATCH(PASS, 2, __VA_ARGS__); \
    else JAXCONV_WINOGRAD_DISPATCH(PASS, 4, __VA_ARGS__);          \
  } while (0)

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

// U = G g G^T (alpha^2 x C x K padded), on the team. A filter whose output channels are not
// contiguous (the data gradient's view, the channels swapped) is first copied into a dense
// float32 3 x 3 x C x K buffer in 16 x 16 blocks of channels, so that the transform reads
// whole rows (gathered element by element, it took a third of a 14x14 256-channel data
// gradient).
float* TransformFilter(const WinogradShape& s, const void* g) {
  const int64_t a2 = s.alpha() * s.alpha();
  float* u = Shared(2).Get(a2 * s.c * s.k_padded());
  WinogradShape dense = s;
  const void* from = g;
  if (s.filter.out != 1) {
    float* copy = Shared(3).Get(9 * s.c * s.k);
    const FilterView& f = s.filter;
    OnTeam(9 * ((s.c + 15) / 16), [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t ij = w % 9, c0 = w / 9 * 16, c1 = std::min(s.c, c0 + 16);
        const int64_t tap = f.offset + ij / 3 * f.row + ij % 3 * f.col;
        for (int64_t k0 = 0; k0 < s.k; k0 += 16)
          for (int64_t c = c0; c < c1; ++c)
            for (int64_t k = k0; k < std::min(s.k, k0 + 16); ++k)
              copy[(ij * s.c + c) * s.k + k] = Get(g, tap + c * f.in + k * f.out, s.bf16);
      }
    });
    dense.filter = {0, 3 * s.c * s.k, s.c * s.k, s.k, 1};
    dense.bf16 = false;
    from = copy;
  }
  OnTeam(s.c, [&](int64_t c0, int64_t c1) {
    JAXCONV_WINOGRAD_BY_TILE(Filter, dense.m, dense, from, u, c0, c1);
  });
  return u;
}

}  // namespace

namespace {

std::atomic<size_t> chunk_bytes{kWinogradChunkBytes};

// The forward in three passes over chunks of tiles (V and M of a chunk within
// kWinogradChunkBytes): V, the products per position and column block (the threads share
// them), then y.
void ForwardStaged(const WinogradShape& s, const void* x, const float* u, void* y) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), cols = kp / 32;
  const int64_t chunk = std::clamp<int64_t>(
      chunk_bytes.load() / (a2 * (s.c + kp) * sizeof(float)), 1, P);
  const Rows v{Shared(0).Get(a2 * chunk * s.c), chunk, 0, s.c};
  const Rows mm{Shared(1).Get(a2 * chunk * kp), chunk, 0, kp};
  for (int64_t first = 0; first < P; first += chunk) {
    const int64_t end = std::min(P, first + chunk);
    const Rows vc{v.base, chunk, first, s.c}, mc{mm.base, chunk, first, kp};
    OnTeam(end - first, [&](int64_t p0, int64_t p1) {
      JAXCONV_WINOGRAD_BY_TILE(Input, s.m, s, x, vc, first + p0, first + p1);
    });
    OnTeam(a2 * cols, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int xi = static_cast<int>(w / cols);
        const int64_t k0 = w % cols * 32;
        Product({vc.at(xi, first), s.c, 1, u + xi * s.c * kp + k0, kp, mc.at(xi, first) + k0,
                 kp}, end - first, s.c, 32, false);
      }
    });
    OnTeam(end - first, [&](int64_t p0, int64_t p1) {
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
      for (int xi = 0; xi < a2; ++xi)
        Product({vr.at(xi, p), s.c, 1, u + xi * s.c * kp, kp, mr.at(xi, p), kp}, end - p, s.c,
                kp, false);
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
  const float* u = TransformFilter(s, g);
  const size_t u_bytes = s.alpha() * s.alpha() * s.c * s.k_padded() * sizeof(float);
  if (u_bytes <= kWinogradFusedMaxFilterBytes) ForwardFused(s, x, u, y);
  else ForwardStaged(s, x, u, y);
  for (int i = 0; i < 4; ++i) Shared(i).Trim();
}

namespace {

// dU of the weight gradient over chunks of tiles: transform a chunk (V and dM), then the
// products per position and row block of C, the chunk's sum over tiles in registers.
void WeightStaged(const WinogradShape& s, const void* x, const void* dy, float* du) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), rows = RowsPerBlock();
  const int64_t chunk = std::clamp<int64_t>(
      chunk_bytes.load() / (a2 * (s.c + kp) * sizeof(float)), 1, P);
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
        Product({vc.at(xi, first) + c0, 1, s.c, dc.at(xi, first), kp,
                 du + (xi * s.c + c0) * kp, kp}, n, end - first, kp, first > 0);
      }
    });
  }
}

// dU of the weight gradient fused per block of tiles: each thread transforms a block (V and
// dM within kWinogradBlockBytes) and adds its products into its own dU, kept in its cache;
// the threads' dU are then summed.
void WeightFused(const WinogradShape& s, const void* x, const void* dy, float* du) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), size = a2 * s.c * kp;
  const int64_t block = std::clamp<int64_t>(
      kWinogradBlockBytes / (a2 * (s.c + kp) * sizeof(float)), 1, P);
  const int64_t threads = Omp().teams() ? std::max(1, Omp().get_max_threads()) : 1;
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
        for (int xi = 0; xi < a2; ++xi)
          Product({vr.at(xi, p), 1, s.c, dr.at(xi, p), kp, mine + xi * s.c * kp, kp}, s.c,
                  end - p, kp, true);
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
  const size_t du_bytes = s.alpha() * s.alpha() * s.c * s.k_padded() * sizeof(float);
  float* du = Shared(2).Get(du_bytes / sizeof(float));
  if (du_bytes <= kWinogradFusedMaxWeightBytes) WeightFused(s, x, dy, du);
  else WeightStaged(s, x, dy, du);
  OnTeam(s.c, [&](int64_t c0, int64_t c1) {
    JAXCONV_WINOGRAD_BY_TILE(FilterGrad, s.m, s, du, dw, c0, c1);
  });
  for (int i = 0; i < 4; ++i) Shared(i).Trim();
}

}  // namespace jaxconv_onednn
