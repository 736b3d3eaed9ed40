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

// The transpose's I tiles [ib0, ib1) (16 channels each) of every tap: the 16 I values of
// (o, ib*16 .. ib*16 + 15) are contiguous on the blocked side, XIO's row ib*16 + b holds the
// 16 O values (ob*16 .. ob*16 + 15, b).
__attribute__((target("avx512f"))) void TransposeBlocks(const FilterMove& t, const float* src,
                                                        float* dst, int64_t ib0, int64_t ib1) {
  // the plan's fields in locals: read through `t`, each would be read again after every
  // vector store (which may alias anything)
  const int64_t tiles_o = t.o / 16, xio_i = t.xio_i, tile_o = t.tile_o;
  const int64_t *o_off = t.o_off.data(), *i_off = t.i_off.data();
  __m512 r[16], w[16];
  for (int64_t tap = 0, n = Taps(t); tap < n; ++tap) {
    int64_t s_off, d_off;
    TapOffsets(t, tap, s_off, d_off);
    for (int64_t ib = ib0; ib < ib1; ++ib)
      for (int64_t ob = 0; ob < tiles_o; ++ob) {
        const float* in = src + s_off + ib * 16 * xio_i + ob * 16;
        // the tile after next, into L1 (a prefetch past the rows' end never faults)
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

// The copy's I tiles [ib0, ib1) of every tap, in XIO's order: row i of a tap takes its 16 O
// values (ob*16 .. ob*16 + 15, i) from the blocked side, where they are contiguous.
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

// CopyRows by streaming stores into a 64-byte aligned dst: a function of its own, since
// AVX-512 code must sit in a function compiled for it.
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
  RunMove(TransposeBlocks, t, src, dst, t.i / 16, true);
}

void RunFilterCopy(const FilterMove& t, const void* src, void* dst) {
  ++filter_copies;
  const int64_t bytes = t.o * t.i * Taps(t) * static_cast<int64_t>(sizeof(float));
  const bool stream = bytes >= kFilterCopyStreamBytes && __builtin_cpu_supports("avx512f") &&
                      reinterpret_cast<uintptr_t>(dst) % 64 == 0;
  RunMove(stream ? StreamRows : CopyRows, t, src, dst, t.i / 16, bytes >= kFilterCopyTeamBytes);
}

}  // namespace jaxconv_onednn
