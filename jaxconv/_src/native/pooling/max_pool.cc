// The max pool's forward and argmax (max_pool.h): per output pixel, its channels as one
// vectorised loop per tap, in float32 (bfloat16 widened on load, exactly).
#include "max_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "isa.h"

namespace jaxconv_onednn {
namespace {

#define JAXCONV_POOL_INLINE inline __attribute__((always_inline))

// A bfloat16 of y: one of x's values (its top half exactly), a NaN, or -inf.
JAXCONV_POOL_INLINE uint16_t Narrow(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

JAXCONV_POOL_INLINE const float* Values(const float* in, float*, int64_t) { return in; }
// A bfloat16 tap widened into `widened`: its bits shifted into a float32's upper half (written
// through a view that may alias the floats).
typedef uint32_t __attribute__((may_alias)) FloatBits;
JAXCONV_POOL_INLINE const float* Values(const uint16_t* in, float* widened, int64_t c) {
  FloatBits* bits = reinterpret_cast<FloatBits*>(widened);
  for (int64_t k = 0; k < c; ++k) bits[k] = static_cast<uint32_t>(in[k]) << 16;
  return widened;
}
JAXCONV_POOL_INLINE void Store(float* out, float v) { *out = v; }
JAXCONV_POOL_INLINE void Store(uint16_t* out, float v) { *out = Narrow(v); }

// Per output pixel: its channels' running maximum (m), argmax (a) and whether a NaN was
// seen (bad), all float32 so that each tap's loop is one vectorised compare and three blends.
template <typename T>
JAXCONV_POOL_INLINE void Rows(const PoolShape& s, const T* x, T* y, int8_t* arg, int64_t begin,
                              int64_t end) {
  const int64_t c = s.c;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> best(c), tap(c), which(c), seen_nan(c);
  float* __restrict m = best.data();
  float* __restrict a = which.data();
  float* __restrict bad = seen_nan.data();
  for (int64_t row = begin; row < end; ++row) {
    const int64_t b = row / s.oh, oy = row % s.oh;
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      std::fill(a, a + c, 0.0f);
      std::fill(bad, bad + c, 0.0f);
      int64_t t = 0;
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t iy = oy * s.sh + i - s.pad_top;
        for (int64_t j = 0; j < s.kw; ++j, ++t) {
          const int64_t ix = ox * s.sw + j - s.pad_left;
          if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) {
            // -inf: the first maximum only as the window's first tap
            if (t == 0) std::fill(m, m + c, -inf);
            continue;
          }
          const float* __restrict v =
              Values(x + ((b * s.h + iy) * s.w + ix) * c, tap.data(), c);
          if (t == 0) {
            for (int64_t k = 0; k < c; ++k) m[k] = v[k];
            for (int64_t k = 0; k < c; ++k) bad[k] = v[k] != v[k] ? 1.0f : 0.0f;
            continue;
          }
          const float n = static_cast<float>(t);
          for (int64_t k = 0; k < c; ++k) {
            const bool better = v[k] > m[k];  // strictly: the first maximum stays
            a[k] = better ? n : a[k];
            m[k] = better ? v[k] : m[k];
            bad[k] = v[k] != v[k] ? 1.0f : bad[k];
          }
        }
      }
      T* out = y + (row * s.ow + ox) * c;
      int8_t* out_arg = arg + (row * s.ow + ox) * c;
      for (int64_t k = 0; k < c; ++k) Store(out + k, bad[k] != 0.0f ? nan : m[k]);
      for (int64_t k = 0; k < c; ++k) out_arg[k] = static_cast<int8_t>(a[k]);
    }
  }
}

// Each dtype's rows compiled for AVX-512, AVX2 and no vector ISA, one chosen by the running CPU
// (isa.h; GCC's target_clones on these internal functions ran the baseline's: bfloat16 at 3x
// float32's time, its widening without SSE4.1's zero-extends).
#define JAXCONV_POOL_ISA(NAME, TARGET)                                                        \
  TARGET void RowsF32##NAME(const PoolShape& s, const float* x, float* y, int8_t* arg,        \
                            int64_t begin, int64_t end) {                                    \
    Rows(s, x, y, arg, begin, end);                                                          \
  }                                                                                          \
  TARGET void RowsBf16##NAME(const PoolShape& s, const uint16_t* x, uint16_t* y, int8_t* arg, \
                             int64_t begin, int64_t end) {                                   \
    Rows(s, x, y, arg, begin, end);                                                          \
  }
JAXCONV_POOL_ISA(Avx512, __attribute__((target("avx512f,avx512bw,avx512vl,fma"))))
JAXCONV_POOL_ISA(Avx2, __attribute__((target("avx2,fma"))))
JAXCONV_POOL_ISA(Plain, )

}  // namespace

void MaxPoolRows(const PoolShape& s, const void* x, void* y, int8_t* arg, int64_t begin,
                 int64_t end) {
  const Isa isa = IsaForCpu();
  if (s.bfloat16) {
    const auto* in = static_cast<const uint16_t*>(x);
    auto* out = static_cast<uint16_t*>(y);
    if (isa == Isa::kAvx512) return RowsBf16Avx512(s, in, out, arg, begin, end);
    if (isa == Isa::kAvx2) return RowsBf16Avx2(s, in, out, arg, begin, end);
    return RowsBf16Plain(s, in, out, arg, begin, end);
  }
  const auto* in = static_cast<const float*>(x);
  auto* out = static_cast<float*>(y);
  if (isa == Isa::kAvx512) return RowsF32Avx512(s, in, out, arg, begin, end);
  if (isa == Isa::kAvx2) return RowsF32Avx2(s, in, out, arg, begin, end);
  RowsF32Plain(s, in, out, arg, begin, end);
}

int64_t PoolParts(const PoolShape& s, int64_t pool_threads) {
  const int64_t work = s.n * s.oh * s.ow * s.c * s.kh * s.kw;
  const int64_t units = std::max<int64_t>(1, work / kMinPoolPartWork);
  return std::max<int64_t>(1, std::min<int64_t>({pool_threads, s.n * s.oh, units}));
}

}  // namespace jaxconv_onednn
