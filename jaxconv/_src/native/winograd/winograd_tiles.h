// The transforms of Winograd's F(m x m, 3 x 3) (winograd.h): each matrix written out and
// applied to rows of channels (a loop over a channel block that the compiler vectorises), the
// separable 2D transform of a tile, and the bfloat16 loads and stores of the caller's buffers.
//
// The matrices are Toom-Cook's (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2016): F(2, 3) interpolates at 0, 1, -1 and infinity, F(3, 3) at 0, 1, -1, 2 and
// infinity, F(4, 3) at 0, 1, -1, 2, -1/2 and infinity: for F(3, 3) and F(4, 3), among sets of
// small rationals, one whose float32 error measured smallest (F(4, 3)'s 2.5x below 0, +-1,
// +-2; the method of Barabasz et al., "Error Analysis and Improving the Accuracy of Winograd
// Convolution for Deep Neural Networks", 2020; docs/precision.md, "Winograd").
// lowering/winograd.py holds them as matrices; tests/lowering/test_winograd.py compares.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "winograd.h"

namespace jaxconv_onednn {

constexpr int64_t kBlock = 64;  // channels per transform row (a block stays in L1)

#define JAXCONV_ROWS _Pragma("GCC ivdep") for (int64_t i = 0; i < n; ++i)

// Every function here is compiled into each ISA's pass (winograd_passes.cc) that calls it: left
// to GCC's inlining limits, which count the whole file, the transforms were called out of line,
// compiled for no ISA (a bfloat16 forward took 1.7x as long once the passes had a file of their
// own).
#define JAXCONV_INLINE inline __attribute__((always_inline))

// Elements of the caller's buffers (float32, or bfloat16: the passes compute in float32).
JAXCONV_INLINE float FromBf16(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rounded to the nearest bfloat16, ties to even; a NaN stays a (quiet) NaN.
JAXCONV_INLINE uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// n floats, in vectors of 16 (a memcpy of a length known only at run time compiled to
// `rep movs`, whose start-up took half of a filter transform's time).
JAXCONV_INLINE void CopyFloats(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) std::memcpy(dst + i, src + i, 16 * sizeof(float));
  for (; i < n; ++i) dst[i] = src[i];
}

// n elements of buffer `src` from element `at` into floats.
JAXCONV_INLINE void LoadRow(const void* src, int64_t at, float* dst,
                                                   int64_t n, bool bf16) {
  if (!bf16) {
    CopyFloats(static_cast<const float*>(src) + at, dst, n);
    return;
  }
  const uint16_t* in = static_cast<const uint16_t*>(src) + at;
  JAXCONV_ROWS dst[i] = FromBf16(in[i]);
}

JAXCONV_INLINE void StoreRow(const float* src, void* dst, int64_t at,
                                                    int64_t n, bool bf16) {
  if (!bf16) {
    CopyFloats(src, static_cast<float*>(dst) + at, n);
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst) + at;
  JAXCONV_ROWS out[i] = ToBf16(src[i]);
}

// dst (8 x 8, row stride ldd) = the transpose of src (row stride lds), in vectors of 8 floats:
// interleave pairs of rows, then pairs of pairs, then the halves (GCC's vector extension: the
// shuffles of the ISA the caller is compiled for).
JAXCONV_INLINE void Transpose8(const float* src, int64_t lds, float* dst,
                                                      int64_t ldd) {
  typedef float V __attribute__((vector_size(32)));
  typedef int I __attribute__((vector_size(32)));
  V r[8], t[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&r[i], src + i * lds, sizeof(V));
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shuffle(r[i], r[i + 1], I{0, 8, 1, 9, 4, 12, 5, 13});
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], I{2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      r[i + h] = __builtin_shuffle(t[i + h], t[i + h + 2], I{0, 1, 8, 9, 4, 5, 12, 13});
      r[i + h + 2] = __builtin_shuffle(t[i + h], t[i + h + 2], I{2, 3, 10, 11, 6, 7, 14, 15});
    }
  // r[0..3]: columns (0, 4), (2, 6), (1, 5), (3, 7) of rows 0-3, likewise r[4..7] of rows 4-7
  constexpr int kColumn[4] = {0, 2, 1, 3};
  for (int j = 0; j < 4; ++j) {
    const V lo = __builtin_shuffle(r[j], r[j + 4], I{0, 1, 2, 3, 8, 9, 10, 11});
    const V hi = __builtin_shuffle(r[j], r[j + 4], I{4, 5, 6, 7, 12, 13, 14, 15});
    std::memcpy(dst + kColumn[j] * ldd, &lo, sizeof(V));
    std::memcpy(dst + (kColumn[j] + 4) * ldd, &hi, sizeof(V));
  }
}

// Asks for the cache lines of n elements of `src` from element `at`, kPrefetch rows ahead of
// a loop over rows that the hardware's prefetcher does not follow (runs of a few lines, far
// apart: the filter's taps).
constexpr int64_t kPrefetch = 4;
JAXCONV_INLINE void Prefetch(const void* src, int64_t at, int64_t n,
                                                    bool bf16) {
  const char* p = static_cast<const char*>(src) + at * (bf16 ? 2 : 4);
  for (int64_t b = 0; b < n * (bf16 ? 2 : 4); b += 64) __builtin_prefetch(p + b);
}

JAXCONV_INLINE float Get(const void* src, int64_t at, bool bf16) {
  return bf16 ? FromBf16(static_cast<const uint16_t*>(src)[at]) : static_cast<const float*>(src)[at];
}

JAXCONV_INLINE void Put(void* dst, int64_t at, float v, bool bf16) {
  if (bf16) static_cast<uint16_t*>(dst)[at] = ToBf16(v);
  else static_cast<float*>(dst)[at] = v;
}

template <int M>
struct Tile;

template <>
struct Tile<2> {
  static constexpr int kAlpha = 4;
  // t = B^T d over alpha rows of n channels
  static JAXCONV_INLINE void Input(const float* const* d, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float d0 = d[0][i], d1 = d[1][i], d2 = d[2][i], d3 = d[3][i];
      t[0][i] = d0 - d2;
      t[1][i] = d1 + d2;
      t[2][i] = d2 - d1;
      t[3][i] = d1 - d3;
    }
  }
  // y = A^T s: alpha rows into m
  static JAXCONV_INLINE void Output(const float* const* s, float* const* y, int64_t n) {
    JAXCONV_ROWS {
      const float s1 = s[1][i], s2 = s[2][i];
      y[0][i] = s[0][i] + s1 + s2;
      y[1][i] = s1 - s2 - s[3][i];
    }
  }
  // t = A e: m rows of dy into alpha (the adjoint of Output)
  static JAXCONV_INLINE void Grad(const float* const* e, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float e0 = e[0][i], e1 = e[1][i];
      t[0][i] = e0;
      t[1][i] = e0 + e1;
      t[2][i] = e0 - e1;
      t[3][i] = -e1;
    }
  }
  // t = G g: 3 rows of the filter into alpha
  static JAXCONV_INLINE void Filter(const float* const* g, float* const* t, int64_t n) {
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
  static JAXCONV_INLINE void FilterGrad(const float* const* d, float* const* o, int64_t n) {
    JAXCONV_ROWS {
      const float p = 0.5f * (d[1][i] + d[2][i]);
      o[0][i] = d[0][i] + p;
      o[1][i] = 0.5f * (d[1][i] - d[2][i]);
      o[2][i] = p + d[3][i];
    }
  }
};

template <>
struct Tile<3> {
  static constexpr int kAlpha = 5;
  static JAXCONV_INLINE void Input(const float* const* d, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float d0 = d[0][i], d1 = d[1][i], d2 = d[2][i], d3 = d[3][i], d4 = d[4][i];
      t[0][i] = 2.0f * (d0 - d2) - d1 + d3;
      t[1][i] = d3 - d2 - 2.0f * d1;
      t[2][i] = d3 - 3.0f * d2 + 2.0f * d1;
      t[3][i] = d3 - d1;
      t[4][i] = d4 - d2 + 2.0f * (d1 - d3);
    }
  }
  static JAXCONV_INLINE void Output(const float* const* s, float* const* y, int64_t n) {
    JAXCONV_ROWS {
      const float s1 = s[1][i], s2 = s[2][i], s3 = s[3][i];
      const float p12 = s1 + s2;
      y[0][i] = s[0][i] + p12 + s3;
      y[1][i] = s1 - s2 + 2.0f * s3;
      y[2][i] = p12 + 4.0f * s3 + s[4][i];
    }
  }
  static JAXCONV_INLINE void Grad(const float* const* e, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float e0 = e[0][i], e1 = e[1][i], e2 = e[2][i];
      const float p02 = e0 + e2;
      t[0][i] = e0;
      t[1][i] = p02 + e1;
      t[2][i] = p02 - e1;
      t[3][i] = e0 + 2.0f * e1 + 4.0f * e2;
      t[4][i] = e2;
    }
  }
  static JAXCONV_INLINE void Filter(const float* const* g, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float g0 = g[0][i], g1 = g[1][i], g2 = g[2][i];
      const float p = g0 + g2;
      t[0][i] = 0.5f * g0;
      t[1][i] = -0.5f * (p + g1);
      t[2][i] = (g1 - p) * (1.0f / 6);
      t[3][i] = (g0 + 2.0f * g1 + 4.0f * g2) * (1.0f / 6);
      t[4][i] = g2;
    }
  }
  static JAXCONV_INLINE void FilterGrad(const float* const* d, float* const* o, int64_t n) {
    JAXCONV_ROWS {
      const float d1 = d[1][i], d2 = d[2][i], d3 = d[3][i];
      const float h = -0.5f * d1, m23 = (d3 - d2) * (1.0f / 6);
      o[0][i] = 0.5f * d[0][i] + h + m23;
      o[1][i] = h + (d2 + 2.0f * d3) * (1.0f / 6);
      o[2][i] = h + m23 + 0.5f * d3 + d[4][i];
    }
  }
};

template <>
struct Tile<4> {
  static constexpr int kAlpha = 6;
  static JAXCONV_INLINE void Input(const float* const* d, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float d0 = d[0][i], d1 = d[1][i], d2 = d[2][i], d3 = d[3][i], d4 = d[4][i],
                  d5 = d[5][i];
      const float c = d4 - d2, e = d1 - d3;  // rows 3, 4
      t[0][i] = d0 + d4 + 1.5f * e - 2.0f * d2;
      t[1][i] = d4 - d1 - 2.5f * d2 - 0.5f * d3;
      t[2][i] = d4 + d1 + 0.5f * d2 - 2.5f * d3;
      t[3][i] = c - 0.5f * e;
      t[4][i] = c + 2.0f * e;
      t[5][i] = d5 + d1 + 1.5f * (d2 - d4) - 2.0f * d3;
    }
  }
  static JAXCONV_INLINE void Output(const float* const* s, float* const* y, int64_t n) {
    JAXCONV_ROWS {
      const float s3 = s[3][i], s4 = s[4][i];
      const float p12 = s[1][i] + s[2][i], m12 = s[1][i] - s[2][i];
      y[0][i] = s[0][i] + p12 + s3 + s4;
      y[1][i] = m12 + 2.0f * s3 - 0.5f * s4;
      y[2][i] = p12 + 4.0f * s3 + 0.25f * s4;
      y[3][i] = m12 + 8.0f * s3 - 0.125f * s4 + s[5][i];
    }
  }
  static JAXCONV_INLINE void Grad(const float* const* e, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float e0 = e[0][i], e1 = e[1][i], e2 = e[2][i], e3 = e[3][i];
      const float p02 = e0 + e2, p13 = e1 + e3;
      t[0][i] = e0;
      t[1][i] = p02 + p13;
      t[2][i] = p02 - p13;
      t[3][i] = e0 + 2.0f * e1 + 4.0f * e2 + 8.0f * e3;
      t[4][i] = e0 - 0.5f * e1 + 0.25f * e2 - 0.125f * e3;
      t[5][i] = e3;
    }
  }
  static JAXCONV_INLINE void Filter(const float* const* g, float* const* t, int64_t n) {
    JAXCONV_ROWS {
      const float g0 = g[0][i], g1 = g[1][i], g2 = g[2][i];
      const float p = g0 + g2;
      t[0][i] = g0;
      t[1][i] = -(p + g1) * (1.0f / 3);
      t[2][i] = (p - g1) * (1.0f / 3);
      t[3][i] = (g0 + 2.0f * g1 + 4.0f * g2) * (1.0f / 15);
      t[4][i] = (8.0f * g1 - 16.0f * g0 - 4.0f * g2) * (1.0f / 15);
      t[5][i] = g2;
    }
  }
  static JAXCONV_INLINE void FilterGrad(const float* const* d, float* const* o, int64_t n) {
    JAXCONV_ROWS {
      const float d1 = d[1][i], d2 = d[2][i], d3 = d[3][i], d4 = d[4][i];
      const float m21 = (d2 - d1) * (1.0f / 3);
      o[0][i] = d[0][i] + m21 + (d3 - 16.0f * d4) * (1.0f / 15);
      o[1][i] = -(d1 + d2) * (1.0f / 3) + (2.0f * d3 + 8.0f * d4) * (1.0f / 15);
      o[2][i] = m21 + (4.0f * d3 - 4.0f * d4) * (1.0f / 15) + d[5][i];
    }
  }
};

// The tile p's position: image, first output row and column.
struct At {
  int64_t n, oy, ox;
};

// Short tiles. A tile whose last output row (column) lies past y's last row (column), when
// the output's side is not a multiple of m, skips its position rows (columns) xi = alpha - 1,
// the point at infinity: in every Tile<M>::Output above that row of A^T reaches only the
// tile's last output (y[M - 1]), which y does not keep, and in Grad its dM row is the dy of
// that output, zero. So the forward's kept outputs do not read those products at all (the
// same values bit for bit, the products' rows being independent), and the weight gradient
// adds zeros there; at 5x5 the 3x3 tiles multiply (5 + 4)^2 = 81 transformed values per
// channel pair and image instead of 100, at 7x7 the 4x4 ones (6 + 5)^2 = 121 instead of 144
// (lowering/winograd.py's `products`).
//
// The tiles are numbered by kind (F full, S short; rows first), then image, row and column:
// FS, FF, SF, SS. Position (xi, nu) is used by the FF tiles, the FS ones unless nu is the last,
// the SF ones unless xi is, the SS ones unless either is: in this order one run of tiles each.
struct Kinds {
  int64_t rows_full, rows_short, cols_full, cols_short;
  int64_t ends[4];  // the end of each kind's tiles: FS, FF, SF, SS
};

inline Kinds KindsOf(const WinogradShape& s) {
  Kinds k;
  k.rows_full = s.oh / s.m, k.rows_short = s.tiles_h() - k.rows_full;
  k.cols_full = s.ow / s.m, k.cols_short = s.tiles_w() - k.cols_full;
  const int64_t per[4] = {k.rows_full * k.cols_short, k.rows_full * k.cols_full,
                          k.rows_short * k.cols_full, k.rows_short * k.cols_short};
  int64_t end = 0;
  for (int i = 0; i < 4; ++i) k.ends[i] = end += s.n * per[i];
  return k;
}

inline At TileAt(const WinogradShape& s, int64_t p) {
  const Kinds k = KindsOf(s);
  int kind = 0;
  while (p >= k.ends[kind]) ++kind;
  const int64_t q = p - (kind > 0 ? k.ends[kind - 1] : 0);
  const bool short_rows = kind >= 2, short_cols = kind == 0 || kind == 3;
  const int64_t rows = short_rows ? k.rows_short : k.rows_full;
  const int64_t cols = short_cols ? k.cols_short : k.cols_full;
  const int64_t ty = (q / cols) % rows + (short_rows ? k.rows_full : 0);
  const int64_t tx = q % cols + (short_cols ? k.cols_full : 0);
  return {q / (rows * cols), ty * s.m, tx * s.m};
}

// The run of tiles [lo, hi) of [p0, p1) that use position xi (of alpha^2): empty, lo == hi,
// where none does.
struct Run {
  int64_t lo, hi;
};

inline Run Using(const WinogradShape& s, int xi, int64_t p0, int64_t p1) {
  const Kinds k = KindsOf(s);
  const int last = s.alpha() - 1;
  const bool last_row = xi / s.alpha() == last, last_col = xi % s.alpha() == last;
  // FS..SS where neither is last; FS, FF with the last row; FF, SF with the last column
  const int64_t lo = last_col ? k.ends[0] : 0;
  const int64_t hi = last_row ? k.ends[1] : last_col ? k.ends[2] : k.ends[3];
  const int64_t a = std::max(lo, p0), b = std::min(hi, p1);
  return {a, std::max(a, b)};
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
// each of t's NOUT rows into dst(r, q). A whole block (n == kBlock) is compiled with its
// length known: the rows' loops unrolled, no remainder.
template <int NIN, int NOUT, typename F, typename Src, typename Dst>
JAXCONV_INLINE void SeparableOf(F f, const Src& src, const Dst& dst,
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

template <int NIN, int NOUT, typename F, typename Src, typename Dst>
JAXCONV_INLINE void Separable(F f, const Src& src, const Dst& dst,
                                                     float* t, int64_t n) {
  if (n == kBlock) SeparableOf<NIN, NOUT>(f, src, dst, t, kBlock);
  else SeparableOf<NIN, NOUT>(f, src, dst, t, n);
}

}  // namespace jaxconv_onednn
