// jaxconv's own filter moves (filter_move.h).
#include "filter_move.h"

#include <immintrin.h>

#include <cstring>

#include "descriptors.h"
#include "openmp.h"

namespace jaxconv_onednn {

std::atomic<int64_t> filter_transposes{0}, filter_copies{0};

namespace {

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

// The transpose into w[0..15] of the 16 x 16 tile of 4-byte units whose rows start `row`
// apart at `in`, the tile after next prefetched into L1 (a prefetch past the rows' end never
// faults).
__attribute__((target("avx512f"))) inline void LoadTransposed(const float* in, int64_t row,
                                                              __m512* w) {
  __m512 r[16];
  for (int b = 0; b < 16; ++b)
    _mm_prefetch(reinterpret_cast<const char*>(in + 32 + b * row), _MM_HINT_T0);
  for (int b = 0; b < 16; ++b) r[b] = _mm512_loadu_ps(in + b * row);
  Transpose16(r, w);
}

// kTranspose's I tiles [ib0, ib1) (16 channels each) of every tap: the 16 I values of
// (o, ib*16 .. ib*16 + 15) are contiguous on the blocked side, XIO's row ib*16 + b holds the
// 16 O values (ob*16 .. ob*16 + 15, b).
__attribute__((target("avx512f"))) void TransposeBlocks(const FilterMove& t, const void* from,
                                                        void* to, int64_t ib0, int64_t ib1) {
  const auto* src = static_cast<const float*>(from);
  auto* dst = static_cast<float*>(to);
  // the plan's fields in locals: read through `t`, each would be read again after every
  // vector store (which may alias anything)
  const int64_t tiles_o = t.o / 16, xio_i = t.xio_i, tile_o = t.tile_o;
  const int64_t *o_off = t.o_off.data(), *i_off = t.i_off.data();
  __m512 w[16];
  for (int64_t tap = 0, n = Taps(t); tap < n; ++tap) {
    int64_t s_off, d_off;
    TapOffsets(t, tap, s_off, d_off);
    for (int64_t ib = ib0; ib < ib1; ++ib)
      for (int64_t ob = 0; ob < tiles_o; ++ob) {
        LoadTransposed(src + s_off + ib * 16 * xio_i + ob * 16, xio_i, w);
        // the 16 O of a tile lie in one O block, tile_o apart
        float* out = dst + d_off + i_off[ib * 16] + o_off[ob * 16];
        for (int a = 0; a < 16; ++a) _mm512_stream_ps(out + a * tile_o, w[a]);
      }
  }
  _mm_sfence();  // the streaming stores are visible before the primitive reads the filter
}

// kTransposeRowPairs' I pairs [p0, p1) of every tap: XIO's rows 2p and 2p + 1, 16 O at a
// time, interleaved into the 32 elements (o, 2p), (o, 2p + 1), (o + 1, 2p), ... that are
// contiguous on the blocked side; zeros where O's blocks pad it.
__attribute__((target("avx512f"))) void TransposeRowPairs(const FilterMove& t, const void* from,
                                                          void* to, int64_t p0, int64_t p1) {
  const auto* src = static_cast<const uint16_t*>(from);
  auto* dst = static_cast<uint16_t*>(to);
  const int64_t o = t.o, o_padded = t.o_padded, xio_i = t.xio_i;  // locals: TransposeBlocks
  const int64_t *o_off = t.o_off.data(), *i_off = t.i_off.data();
  for (int64_t tap = 0, n = Taps(t); tap < n; ++tap) {
    int64_t s_off, d_off;
    TapOffsets(t, tap, s_off, d_off);
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* even = src + s_off + 2 * p * xio_i;
      const uint16_t* odd = even + xio_i;
      uint16_t* out = dst + d_off + i_off[2 * p];
      for (int64_t oc = 0; oc < o; oc += 16) {
        const __m512i e = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + oc)));
        const __m512i d = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd + oc)));
        _mm512_stream_si512(reinterpret_cast<__m512i*>(out + o_off[oc]),
                            _mm512_or_si512(e, _mm512_slli_epi32(d, 16)));
      }
      for (int64_t oc = o; oc < o_padded; oc += 16)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(out + o_off[oc]), _mm512_setzero_si512());
    }
  }
  _mm_sfence();
}

// kTransposePairs' I tiles [ib0, ib1) of every tap: on 4-byte units (O pairs), XIO's rows
// ib*16 .. ib*16 + 15 hold 16 pairs (qb*16 .. qb*16 + 15) each; the 16 I values of a pair are
// contiguous on the blocked side, each pair at its own offset; zeros for the tiles past I
// where I's blocks pad it.
__attribute__((target("avx512f"))) void TransposePairs(const FilterMove& t, const void* from,
                                                       void* to, int64_t ib0, int64_t ib1) {
  const auto* src = static_cast<const float*>(from);  // pairs of 2-byte elements, as bits
  auto* dst = static_cast<uint16_t*>(to);
  const int64_t tiles_q = t.o / 32, row = t.xio_i / 2;  // XIO's I stride in pairs
  const int64_t tiles_i = t.i / 16;
  const int64_t *o_off = t.o_off.data(), *i_off = t.i_off.data();
  __m512 w[16];
  for (int64_t tap = 0, n = Taps(t); tap < n; ++tap) {
    int64_t s_off, d_off;
    TapOffsets(t, tap, s_off, d_off);
    for (int64_t ib = ib0; ib < ib1; ++ib)
      for (int64_t qb = 0; qb < tiles_q; ++qb) {
        if (ib >= tiles_i) {  // I's padding
          uint16_t* out = dst + d_off + i_off[ib * 16];
          for (int a = 0; a < 16; ++a)
            _mm512_stream_ps(reinterpret_cast<float*>(out + o_off[2 * (qb * 16 + a)]),
                             _mm512_setzero_ps());
          continue;
        }
        LoadTransposed(src + s_off / 2 + ib * 16 * row + qb * 16, row, w);
        uint16_t* out = dst + d_off + i_off[ib * 16];
        for (int a = 0; a < 16; ++a)
          _mm512_stream_ps(reinterpret_cast<float*>(out + o_off[2 * (qb * 16 + a)]), w[a]);
      }
  }
  _mm_sfence();
}

// kCopy's I tiles [ib0, ib1) of every tap, in XIO's order: row i of a tap takes its 16 O
// values (ob*16 .. ob*16 + 15, i) from the blocked side, where they are contiguous.
void CopyRows(const FilterMove& t, const void* from, void* to, int64_t ib0, int64_t ib1) {
  const auto* src = static_cast<const float*>(from);
  auto* dst = static_cast<float*>(to);
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

// CopyRows by streaming stores into a 64-byte aligned dst: a function of its own, since
// AVX-512 code must sit in a function compiled for it.
__attribute__((target("avx512f"))) void StreamRows(const FilterMove& t, const void* from,
                                                   void* to, int64_t ib0, int64_t ib1) {
  const auto* src = static_cast<const float*>(from);
  auto* dst = static_cast<float*>(to);
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

using BlockRange = void (*)(const FilterMove&, const void*, void*, int64_t, int64_t);

// Runs `range` over [0, blocks) on the calling thread's OpenMP team (a team of one where the
// call runs single-threaded), or on the calling thread alone where `team` is false.
void RunMove(BlockRange range, const FilterMove& t, const void* src, void* dst, int64_t blocks,
             bool team) {
  OnTeam(blocks, [&](int64_t b0, int64_t b1) { range(t, src, dst, b0, b1); }, team);
}

}  // namespace

FilterMove PlanFilterTranspose(const memory::desc& xio, const memory::desc& blk) {
  return __builtin_cpu_supports("avx512f") ? PlanFilterMove(LayoutOf(xio), LayoutOf(blk), true)
                                           : FilterMove();
}

FilterMove PlanFilterCopy(const memory::desc& blk, const memory::desc& xio) {
  return PlanFilterMove(LayoutOf(xio), LayoutOf(blk), false);
}

void RunFilterTranspose(const FilterMove& t, const void* src, void* dst) {
  ++filter_transposes;
  if (t.kind == MoveKind::kTransposeRowPairs)
    RunMove(TransposeRowPairs, t, src, dst, t.i / 2, true);
  else if (t.kind == MoveKind::kTransposePairs)
    RunMove(TransposePairs, t, src, dst, t.i_padded / 16, true);
  else
    RunMove(TransposeBlocks, t, src, dst, t.i / 16, true);
}

void RunFilterCopy(const FilterMove& t, const void* src, void* dst) {
  ++filter_copies;
  const int64_t bytes = t.o * t.i * Taps(t) * static_cast<int64_t>(sizeof(float));  // kCopy
  const bool stream = bytes >= kFilterCopyStreamBytes && __builtin_cpu_supports("avx512f") &&
                      reinterpret_cast<uintptr_t>(dst) % 64 == 0;
  RunMove(stream ? StreamRows : CopyRows, t, src, dst, t.i / 16, bytes >= kFilterCopyTeamBytes);
}

}  // namespace jaxconv_onednn
