// Winograd F(m x m, 3 x 3) on float32 or bfloat16 NHWC buffers, computed in float32
// (winograd.h): the drivers, which run the passes (winograd_passes.h) and the products
// (winograd_product.h) split between threads (OnTeam: the OpenMP team, or parts on XLA's pool
// where the caller set that), in the order winograd_decisions.h chooses.
#include "winograd.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "buffers.h"
#include "openmp.h"
#include "winograd_passes.h"
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

// The calls' shared buffers: 0 and 1 V and M (or dM) of the staged passes, or the threads'
// dU of the fused weight gradient; 2 U or dU; 3 a dense copy of the filter.
Buffer& Shared(int which) {
  static Buffer* w = new Buffer[4]{Buffer(kWinogradKeepBytes), Buffer(kWinogradKeepBytes),
                                   Buffer(kWinogradKeepBytes), Buffer(kWinogradKeepBytes)};
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
  float* copy = Shared(3).Floats(9 * s.c * s.k);
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
  float* u = Shared(2).Floats(a2 * s.u_plane() * kp);
  const void* from;
  const WinogradShape fs = ReadableFilter(s, g, &from);
  const bool runs = fs.filter.out != 1;  // FilterRows transposes runs of input channels
  const int64_t cb = WinogradFilterBlockRows(s.c, TeamThreads());
  OnTeam((s.c + cb - 1) / cb, [&](int64_t b0, int64_t b1) {
    thread_local Buffer scratch_work{kWinogradKeepBytes};
    float* scratch = runs ? scratch_work.Floats(kWinogradFilterScratch) : nullptr;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * cb, c1 = std::min(s.c, c0 + cb);
      FilterPass(s.m, fs, from, u + c0 * kp, s.u_plane(), kp, c0, c1, 0,
                               kp, scratch);
    }
  });
  return u;
}

}  // namespace

namespace {

std::atomic<size_t> chunk_bytes{kWinogradChunkBytes};

// Tiles a chunk of the staged passes (winograd_decisions.h).
int64_t ChunkTiles(const WinogradShape& s) {
  return WinogradChunkTiles(s.alpha(), s.c, s.k_padded(), s.tiles(), chunk_bytes.load());
}

// The forward in three passes over chunks of tiles (V and M of a chunk within
// kWinogradChunkBytes): V; the products; then y. A chunk of more than kWinogradBlockedMaxTiles
// tiles is multiplied by the whole U, the threads sharing positions and blocks of 32 output
// channels; a smaller one per block of kWinogradFilterColumns output channels (and of rows,
// where the blocks are fewer than twice the threads), each transforming its block of U from
// the filter kWinogradFilterBlock input channels at a time into its cache (written and read
// back from memory, the whole U cost more than the products at 7x7).
void ForwardStaged(const WinogradShape& s, const void* x, const void* g, void* y, bool blocked) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), rows = RowsPerBlock(), chunk = ChunkTiles(s);
  const int64_t groups = WinogradColumnGroups(kp);
  const int64_t splits = WinogradRowSplits(TeamThreads(), groups);
  const Rows v{Shared(0).Floats(a2 * chunk * s.c), chunk, 0, s.c};
  const Rows mm{Shared(1).Floats(a2 * chunk * kp), chunk, 0, kp};
  const float* u = blocked ? nullptr : TransformFilter(s, g);
  const void* from = g;
  const WinogradShape fs = blocked ? ReadableFilter(s, g, &from) : s;
  const int64_t cols = kp / 32;
  for (int64_t first = 0; first < P; first += chunk) {
    const int64_t end = std::min(P, first + chunk), n = end - first;
    const Rows vc{v.base, chunk, first, s.c}, mc{mm.base, chunk, first, kp};
    OnTeam(n, [&](int64_t p0, int64_t p1) {
      InputPass(s.m, s, x, vc, first + p0, first + p1);
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
      thread_local Buffer u_work{kWinogradKeepBytes};
      constexpr int64_t plane = kWinogradFilterBlock + 1;  // rows a position (u_plane)
      float* ub = u_work.Floats(a2 * plane * kWinogradFilterColumns + kWinogradFilterScratch);
      float* scratch = ub + a2 * plane * kWinogradFilterColumns;
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t k0 = w / splits * kWinogradFilterColumns, part = w % splits;
        const int64_t nk = std::min(kWinogradFilterColumns, kp - k0);
        const int64_t r0 = first + (n * part / splits) / rows * rows;
        const int64_t r1 = part + 1 == splits ? end : first + (n * (part + 1) / splits) / rows * rows;
        if (r0 >= r1) continue;
        for (int64_t c0 = 0; c0 < s.c; c0 += kWinogradFilterBlock) {
          const int64_t c1 = std::min(s.c, c0 + kWinogradFilterBlock);
          FilterPass(s.m, fs, from, ub, plane, nk, c0, c1, k0, k0 + nk,
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
      OutputPass(s.m, s, mc, y, s.k, first + p0, first + p1);
    });
  }
}

// The forward fused per block of tiles: each thread transforms a block into V, multiplies it
// by all of U, and transforms M into y while the block is in its cache.
void ForwardFused(const WinogradShape& s, const void* x, const float* u, void* y) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), rows = RowsPerBlock(), P = s.tiles();
  const int64_t block = WinogradForwardBlockTiles(s.alpha(), s.c, kp, P, rows);
  OnTeam((P + block - 1) / block, [&](int64_t b0, int64_t b1) {
    thread_local Buffer v_work{kWinogradKeepBytes}, m_work{kWinogradKeepBytes};
    float* v = v_work.Floats(a2 * block * s.c);
    float* mm = m_work.Floats(a2 * block * kp);
    for (int64_t p = b0 * block; p < std::min(P, b1 * block); p += block) {
      const int64_t end = std::min(P, p + block);
      const Rows vr{v, block, p, s.c}, mr{mm, block, p, kp};
      InputPass(s.m, s, x, vr, p, end);
      for (int xi = 0; xi < a2; ++xi) {
        const Run r = Using(s, xi, p, end);
        if (r.hi > r.lo)
          Product({vr.at(xi, r.lo), s.c, 1, u + xi * s.u_plane() * kp, kp, mr.at(xi, r.lo), kp},
                  r.hi - r.lo, s.c, kp, false);
      }
      OutputPass(s.m, s, mr, y, s.k, p, end);
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
  const WinogradPlan plan = WinogradForwardPlan(s.alpha(), s.c, s.k_padded(), s.tiles(),
                                                ChunkTiles(s));
  if (plan == WinogradPlan::kFused) ForwardFused(s, x, TransformFilter(s, g), y);
  else ForwardStaged(s, x, g, y, plan == WinogradPlan::kBlocked);
  for (int i = 0; i < 4; ++i) Shared(i).Trim();
}

namespace {

// dU of the weight gradient over chunks of tiles: transform a chunk (V and dM), then the
// products per position and row block of C, the chunk's sum over tiles in registers.
void WeightStaged(const WinogradShape& s, const void* x, const void* dy, float* du) {
  const int a2 = s.alpha() * s.alpha();
  const int64_t kp = s.k_padded(), P = s.tiles(), rows = RowsPerBlock(), chunk = ChunkTiles(s);
  float* v = Shared(0).Floats(a2 * chunk * s.c);
  float* dm = Shared(1).Floats(a2 * chunk * kp);
  const int64_t blocks = (s.c + rows - 1) / rows;
  for (int64_t first = 0; first < P; first += chunk) {
    const int64_t end = std::min(P, first + chunk);
    const Rows vc{v, chunk, first, s.c}, dc{dm, chunk, first, kp};
    OnTeam(end - first, [&](int64_t p0, int64_t p1) {
      InputPass(s.m, s, x, vc, first + p0, first + p1);
      GradPass(s.m, s, dy, dc, first + p0, first + p1);
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
  const Rows vc{Shared(0).Floats(a2 * P * s.c), P, 0, s.c};
  const Rows dc{Shared(1).Floats(a2 * P * kp), P, 0, kp};
  OnTeam(P, [&](int64_t p0, int64_t p1) {
    InputPass(s.m, s, x, vc, p0, p1);
    GradPass(s.m, s, dy, dc, p0, p1);
  });
  const int64_t groups = WinogradColumnGroups(s.k_padded());
  const int64_t plane = cb + 1;  // as U's (WinogradShape::u_plane)
  OnTeam((s.c + cb - 1) / cb * groups, [&](int64_t w0, int64_t w1) {
    thread_local Buffer du_work{kWinogradKeepBytes};
    float* db = du_work.Floats(a2 * plane * kWinogradFilterColumns);
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
      FilterGradPass(s.m, s, db, plane, nk, dw, c0, c1, k0, k0 + nk);
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
  const int64_t block = WinogradWeightBlockTiles(s.alpha(), s.c, kp, P);
  const int64_t threads = TeamThreads();
  float* partial = Shared(0).Floats(threads * size);
  OnTeam(threads, [&](int64_t t0, int64_t t1) {  // one share of the blocks per thread
    const int64_t blocks = (P + block - 1) / block;
    for (int64_t t = t0; t < t1; ++t) {
      float* mine = partial + t * size;
      std::memset(mine, 0, size * sizeof(float));
      thread_local Buffer v_work{kWinogradKeepBytes}, m_work{kWinogradKeepBytes};
      float* v = v_work.Floats(a2 * block * s.c);
      float* dm = m_work.Floats(a2 * block * kp);
      for (int64_t b = blocks * t / threads; b < blocks * (t + 1) / threads; ++b) {
        const int64_t p = b * block, end = std::min(P, p + block);
        const Rows vr{v, block, p, s.c}, dr{dm, block, p, kp};
        InputPass(s.m, s, x, vr, p, end);
        GradPass(s.m, s, dy, dr, p, end);
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
  const int64_t rows = WinogradWeightBlockRows(s.c, kp, TeamThreads(), RowsPerBlock());
  const WinogradPlan plan = WinogradWeightPlan(s.alpha(), s.c, kp, s.tiles(), ChunkTiles(s),
                                               rows);
  if (plan == WinogradPlan::kBlocked) {
    WeightBlocked(s, x, dy, dw, rows);
  } else {
    float* du = Shared(2).Floats(s.alpha() * s.alpha() * s.c * kp);
    if (plan == WinogradPlan::kFused) WeightFused(s, x, dy, du);
    else WeightStaged(s, x, dy, du);
    OnTeam(s.c, [&](int64_t c0, int64_t c1) {
      FilterGradPass(s.m, s, du + c0 * kp, s.c, kp, dw, c0, c1, 0, s.k);
    });
  }
  for (int i = 0; i < 4; ++i) Shared(i).Trim();
}

}  // namespace jaxconv_onednn
