// jaxconv's register-blocked products for the Winograd passes (winograd_product.h).
#include "winograd_product.h"

#include <immintrin.h>

#include <algorithm>

namespace jaxconv_onednn {
namespace {

// The lines of a Prefetches a kernel call asks for: at most one every other step of `inner`,
// its cursor kept in registers and written back at the end.
class Fetcher {
 public:
  Fetcher(Prefetches* p, int64_t inner) : p_(p) {
    if (p_ == nullptr || p_->r >= p_->rows) return;
    left_ = std::min<int64_t>((inner + 1) / 2,
                              ((p_->rows - p_->r) * p_->taps - p_->t) * p_->lines - p_->l);
    t_ = p_->t, l_ = p_->l;
    at_ = p_->base + p_->r * p_->row + p_->tap[t_] + l_ * 64;
  }
  ~Fetcher() {
    if (p_ != nullptr) p_->t = t_, p_->l = l_;
  }
  __attribute__((always_inline)) void Step(int64_t i) {
    if ((i & 1) != 0 || left_ == 0) return;
    _mm_prefetch(at_, _MM_HINT_T0);
    --left_;
    if (++l_ < p_->lines) {
      at_ += 64;
      return;
    }
    l_ = 0;
    if (++t_ == p_->taps) t_ = 0, ++p_->r;
    at_ = p_->base + p_->r * p_->row + p_->tap[t_];
  }

 private:
  Prefetches* p_;
  const char* at_ = nullptr;
  int64_t left_ = 0;
  int t_ = 0, l_ = 0;
};

// c (rows x cols, row stride ldc) = or += a (rows x inner: element (r, i) at a[r*ar + i*ai])
// times b (inner x cols, row stride ldb); cols a multiple of 32. Each kernel call keeps a
// block of rows x 32 columns of c in registers over the whole inner loop: b's two (AVX-512)
// or four (AVX2) vectors a step, a's element broadcast per row.

template <int R>
__attribute__((target("avx512f"), always_inline)) inline void Block512(
    const Operands& o, int64_t inner, bool accumulate) {
  __m512 s[R][2];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v)
      s[r][v] = accumulate ? _mm512_loadu_ps(o.c + r * o.ldc + 16 * v) : _mm512_setzero_ps();
  const float* a = o.a;
  const float* b = o.b;
  Fetcher fetch(o.prefetch, inner);
  for (int64_t i = 0; i < inner; ++i, a += o.ai, b += o.ldb) {
    fetch.Step(i);
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
    Fetcher fetch(o.prefetch, inner);
    for (int64_t i = 0; i < inner; ++i, a += o.ai, b += o.ldb) {
      fetch.Step(i);
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

JAXCONV_WINOGRAD_PRODUCT(ProductAvx512, Block512, 12, __attribute__((target("avx512f,avx512vl,fma"))))
JAXCONV_WINOGRAD_PRODUCT(ProductAvx2, Block256, 6, __attribute__((target("avx2,fma"))))
JAXCONV_WINOGRAD_PRODUCT(ProductPlain, BlockPlain, 4, )

}  // namespace

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

}  // namespace jaxconv_onednn
