// The handler's pure decisions (decisions.h): no oneDNN call here.
#include "decisions.h"

#include <algorithm>

namespace jaxconv_onednn {

double WorkUnits(const Problem& p) {
  const double bytes = (Elements(p.x_dims) + Elements(p.y_dims)) * ElementSize(p.dtype);
  return std::max(Macs(p) / kMinChunkMacs, bytes / kMinChunkBytes);
}

int64_t Chunks(const Problem& p, int64_t pool_threads, bool openmp) {
  if (!openmp || p.data_axes[0] != 0) return 0;
  const double work = WorkUnits(p);
  // a weight gradient by its bytes too: the layout trial keeps the caller's layout where that
  // is faster, so a memory-bound one is worth a team
  if (p.kernel == Kernel::kWeight) return work >= 1 ? 0 : 1;
  const int64_t by_work = std::max<int64_t>(1, static_cast<int64_t>(work));
  const int64_t n = std::min<int64_t>({pool_threads, p.x_dims[0], by_work});
  if (n == 1 && work >= 1) return 0;  // one large example: OpenMP's team
  if (n > 1 && Elements(p.w_dims) * n > Elements(p.x_dims) + Elements(p.y_dims))
    return 0;  // the filter outweighs a chunk's activations: one call reorders it once
  return n;
}

bool KeepSpinning(int64_t finished, int64_t chunks, std::chrono::nanoseconds waited) {
  return finished < chunks && waited < kSpin;
}

std::vector<bool> Racing(const std::vector<double>& warmup) {
  const double fastest = *std::min_element(warmup.begin(), warmup.end());
  std::vector<bool> racing(warmup.size());
  for (size_t c = 0; c < warmup.size(); ++c)
    racing[c] = warmup[c] <= kTrialSlower * fastest || warmup[c] <= kTrialSlowerFloor;
  return racing;
}

bool TrialDone(int round, const std::vector<double>& spent, const std::vector<bool>& racing) {
  if (round >= kTrialMaxRounds) return true;
  bool enough = round >= kTrialRounds;
  for (size_t c = 0; c < spent.size(); ++c) enough &= !racing[c] || spent[c] >= kTrialSeconds;
  return enough;
}

size_t Pick(const std::vector<double>& best, const std::vector<bool>& racing,
            const std::vector<bool>& on_callers, double macs) {
  const size_t fastest = std::min_element(best.begin(), best.end()) - best.begin();
  const double margin = macs >= kTrialLargeMacs ? kTrialMarginLarge : kTrialMargin;
  for (size_t c = 0; c < best.size(); ++c)
    if (on_callers[c] && racing[c] && best[c] <= (1 + margin) * best[fastest]) return c;
  return fastest;
}

FilterMove PlanFilterMove(const Blocking& xio, const Blocking& blk, bool i_inner) {
  FilterMove t;
  const size_t n = xio.dims.size();
  if (!xio.f32 || !blk.f32 || n < 3 || n > 5 || blk.dims.size() != n) return t;
  if (!xio.blocked || !blk.blocked || !xio.inner_blks.empty() || !blk.unpadded ||
      !blk.offset0 || !xio.offset0)
    return t;
  const std::vector<int64_t>& idxs = blk.inner_idxs;
  const std::vector<int64_t>& blks = blk.inner_blks;
  const int64_t inner_dim = i_inner ? 1 : 0;
  if (blks.size() != 2 || idxs.size() != 2 || idxs[0] != 1 - inner_dim ||
      idxs[1] != inner_dim || blks[0] % 16 != 0 || blks[1] % 16 != 0)
    return t;
  const std::vector<int64_t>& dims = xio.dims;
  const std::vector<int64_t>& xs = xio.strides;
  const std::vector<int64_t>& bs = blk.strides;
  if (dims != blk.dims || dims[0] % 16 != 0 || dims[1] % 16 != 0 || xs[0] != 1 ||
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
  for (size_t a = 2; a < n; ++a) {
    t.taps.push_back(dims[a]);
    t.xio_tap.push_back(xs[a]);
    t.blk_tap.push_back(bs[a]);
  }
  t.on = true;
  return t;
}

int64_t Taps(const FilterMove& t) {
  int64_t n = 1;
  for (int64_t k : t.taps) n *= k;
  return n;
}

void TapOffsets(const FilterMove& t, int64_t tap, int64_t& xio, int64_t& blk) {
  xio = blk = 0;
  for (size_t a = t.taps.size(); a-- > 0;) {
    const int64_t idx = tap % t.taps[a];
    tap /= t.taps[a];
    xio += idx * t.xio_tap[a];
    blk += idx * t.blk_tap[a];
  }
}

}  // namespace jaxconv_onednn
