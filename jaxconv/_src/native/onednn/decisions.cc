// The handler's pure decisions (decisions.h): no oneDNN call here.
#include "decisions.h"

#include <algorithm>

namespace jaxconv_onednn {

double WorkUnits(const Problem& p) {
  const double bytes = (Elements(p.x_dims) + Elements(p.y_dims)) * ElementSize(p.dtype);
  return std::max(Macs(p) / kMinChunkMacs, bytes / kMinChunkBytes);
}

bool RowsOuter(const Problem& p) {
  return (p.kernel == Kernel::kForward || p.kernel == Kernel::kData) && p.x_dims.size() >= 3 &&
         p.data_axes[0] == 0 && p.data_axes[2] == 1;
}

bool SplitsRows(const Problem& p) { return RowsOuter(p) && p.x_dims[0] == 1; }

namespace {

// A data gradient whose filter outweighs x and y kRowsFilterRatio times.
bool HeavyFilter(const Problem& p) {
  return p.kernel == Kernel::kData &&
         Elements(p.w_dims) > kRowsFilterRatio * (Elements(p.x_dims) + Elements(p.y_dims));
}

}  // namespace

bool SplitsChannels(const Problem& p) {
  const int64_t rank = static_cast<int64_t>(p.x_dims.size());
  return SplitsRows(p) && HeavyFilter(p) && p.groups == 1 && p.post_ops.empty() &&
         p.data_axes[1] == rank - 1 && p.x_dims.back() % (2 * kChannelBlock) == 0;
}

bool SplitsExampleRows(const Problem& p, int64_t chunks) {
  return RowsOuter(p) && p.x_dims[0] > 1 && chunks > p.x_dims[0];
}

bool MergesPixels(const Problem& p) {
  const size_t n = p.x_dims.size();
  if ((p.kernel != Kernel::kForward && p.kernel != Kernel::kData) || p.x_dims[0] != 1 ||
      n < 4 || p.data_axes[0] != 0 || p.data_axes[1] != static_cast<int64_t>(n) - 1)
    return false;
  for (size_t a = 2; a < n; ++a)  // X1..Xn in order, then C: channels-last
    if (p.data_axes[a] != static_cast<int64_t>(a) - 1) return false;
  for (size_t k = 0; k + 2 < n; ++k)
    if (p.w_dims[p.filter_axes[k + 2]] != 1 || p.strides[k] != 1 || p.pads_begin[k] != 0 ||
        p.pads_end[k] != 0)
      return false;
  return true;
}

void MergePixels(Problem& p) {
  for (auto* dims : {&p.x_dims, &p.y_dims}) {
    int64_t pixels = 1;
    for (size_t a = 1; a + 1 < dims->size(); ++a) pixels *= (*dims)[a], (*dims)[a] = 1;
    (*dims)[1] = pixels;
  }
  std::fill(p.dilations.begin(), p.dilations.end(), 1);
}

RowSpan RowChunk(const Problem& p, int64_t begin, int64_t end) {
  const int64_t s = p.strides[0], pb = p.pads_begin[0];
  const int64_t reach = (p.w_dims[p.filter_axes[2]] - 1) * p.dilations[0];
  RowSpan r;
  if (p.kernel == Kernel::kForward) {  // y's rows [begin, end) read x's rows [lo, hi)
    const int64_t lo = begin * s - pb, hi = (end - 1) * s - pb + reach + 1;
    r.y_begin = begin, r.y_end = end;
    r.x_begin = std::clamp<int64_t>(lo, 0, p.x_dims[1]);
    r.x_end = std::clamp<int64_t>(hi, 0, p.x_dims[1]);
    r.pad_begin = r.x_begin - lo;
    r.pad_end = hi - r.x_end;
    return r;
  }
  // a data gradient: x's rows [begin, end) sum the rows of y whose windows reach them, from
  // the first whose window ends at or after `begin` to the last that starts before `end`
  const int64_t first = begin + pb - reach;
  r.x_begin = begin, r.x_end = end;
  r.y_begin = first <= 0 ? 0 : (first + s - 1) / s;
  r.y_end = std::min<int64_t>(p.y_dims[1], (end - 1 + pb) / s + 1);
  r.pad_begin = pb + begin - r.y_begin * s;
  r.pad_end = (r.y_end - 1 - r.y_begin) * s + reach + 1 - (end - begin) - r.pad_begin;
  return r;
}

bool RowSpan::ok() const {
  return x_end > x_begin && y_end > y_begin && pad_begin >= 0 && pad_end >= 0;
}

namespace {

// How one example (`p`, SplitsRows) of `work` units runs on `threads` threads: n >= 2 chunks
// of its rows, 1 whole, 0 on the team (Chunks).
int64_t ExampleChunks(const Problem& p, int64_t threads, double work) {
  // one chunk per whole unit, and two from kSplitMinUnits on: a call of one to two units split
  // in two beats the OpenMP team (docs/onednn.md, "Threads")
  const int64_t by_work =
      std::max<int64_t>(work >= kSplitMinUnits ? 2 : 1, static_cast<int64_t>(work));
  if (HeavyFilter(p)) {  // each chunk of rows would read the whole filter: x's channels
    if (!SplitsChannels(p)) return 0;
    const int64_t c = p.x_dims.back();
    int64_t n = std::min<int64_t>({threads, by_work, c / kChannelBlock});
    while (n > 1 && c % (n * kChannelBlock) != 0) --n;
    return n > 1 ? n : 0;
  }
  const int64_t along = p.kernel == Kernel::kForward ? p.y_dims[1] : p.x_dims[1];
  const int64_t n = std::min<int64_t>({threads, along, by_work});
  if (n == 1 && work >= 1) return 0;  // one large example that no rows split: OpenMP's team
  for (int64_t i = 0; n > 1 && i < n; ++i)  // a chunk of pads alone: the team
    if (!RowChunk(p, i * along / n, (i + 1) * along / n).ok()) return 0;
  return n;
}

}  // namespace

int64_t Chunks(const Problem& p, int64_t pool_threads, bool openmp) {
  if (!openmp || p.data_axes[0] != 0) return 0;
  const double work = WorkUnits(p);
  // a weight gradient by its bytes too: the layout trial keeps the caller's layout where that
  // is faster, so a memory-bound one is worth a team
  if (p.kernel == Kernel::kWeight) return work >= 1 ? 0 : 1;
  if (SplitsRows(p)) return ExampleChunks(p, pool_threads, work);
  // a batch: one chunk per whole unit, two from kSplitMinUnits on, as one example's rows
  const int64_t batch = p.x_dims[0];
  const int64_t n = std::min<int64_t>(
      {pool_threads, batch,
       std::max<int64_t>(work >= kSplitMinUnits ? 2 : 1, static_cast<int64_t>(work))});
  if (n == 1 && work >= 1) return 0;  // one large example whose buffers split no rows
  // the filter outweighs a chunk's activations: one call reorders it once (a batch's chunks;
  // an example's rows split anyway, judged by whole models: docs/onednn.md, "Threads"), on
  // the team from one unit on, whole on the calling thread below
  if (n > 1 && Elements(p.w_dims) * n > Elements(p.x_dims) + Elements(p.y_dims))
    return work >= 1 ? 0 : 1;
  // every example a chunk and pool threads left: each example's rows split as one example's
  // would on its share of the threads (a batch of 8 on 16 threads: 16 chunks, not 8)
  if (n > 1 && n == batch && pool_threads >= 2 * batch && RowsOuter(p)) {
    Problem one = p;
    one.x_dims[0] = one.y_dims[0] = 1;
    const int64_t rows = ExampleChunks(one, pool_threads / batch, work / batch);
    if (rows > 1) return batch * rows;
  }
  return n;
}

bool ProductOnPool(int64_t m, int64_t n, bool float32) {
  return float32 || std::min(m, n) <= kPoolProductRows;
}

int64_t ProductParts(int64_t m, int64_t n, int64_t k, int64_t element_bytes,
                     int64_t pool_threads) {
  const double macs = static_cast<double>(m) * n * k;
  const double bytes = (static_cast<double>(m) * k + static_cast<double>(k) * n +
                        static_cast<double>(m) * n) * element_bytes;
  const double work = std::max(macs / kMinChunkMacs, bytes / kMinChunkBytes);
  const int64_t blocks = (std::max(m, n) + kProductBlock - 1) / kProductBlock;
  const int64_t units = std::max<int64_t>(work >= 1 ? 2 : 1, static_cast<int64_t>(work));
  return std::max<int64_t>(1, std::min<int64_t>({pool_threads, blocks, units}));
}

AffineRun LeadingAffine(const Problem& p) {
  AffineRun run;
  for (const PostOp& op : p.post_ops) {
    const auto alg = static_cast<BinaryAlg>(op.alg);
    if (op.kind != PostKind::kChannel ||
        (alg != BinaryAlg::kAdd && alg != BinaryAlg::kSub && alg != BinaryAlg::kMul &&
         alg != BinaryAlg::kMulRsqrt))
      break;
    ++run.length;
    run.multiplies |= alg == BinaryAlg::kMul || alg == BinaryAlg::kMulRsqrt;
  }
  run.folds = run.multiplies && p.dtype == memory::data_type::f32 && p.packed < 0 &&
              Elements(p.w_dims) <= Elements(p.y_dims);
  return run;
}

bool TapsApply(const Problem& p) {
  const size_t n = p.x_dims.size();
  if (p.kernel != Kernel::kData || p.groups != 1 || !p.post_ops.empty() ||
      p.dtype != memory::data_type::f32 || n < 3 || n > 5)
    return false;
  for (size_t a = 0; a < n; ++a)  // (N, X..., C)
    if (p.data_axes[a] != static_cast<int64_t>(a == 0 ? 0 : a == 1 ? n - 1 : a - 1)) return false;
  const std::vector<int64_t> st = RowMajorStrides(p.w_dims);
  for (size_t k = 2; k + 1 < p.filter_axes.size(); ++k)
    if (st[p.filter_axes[k]] != st[p.filter_axes[k + 1]] * p.w_dims[p.filter_axes[k + 1]])
      return false;
  double taps = 1;
  for (size_t k = 2; k < p.filter_axes.size(); ++k) taps *= p.w_dims[p.filter_axes[k]];
  const double pixels = Elements(p.y_dims) / p.y_dims[n - 1];
  return taps * pixels * p.x_dims[n - 1] * sizeof(float) <= kTapsBytes;
}

bool KeepSpinning(int64_t finished, int64_t chunks, std::chrono::nanoseconds waited) {
  return finished < chunks && waited < kSpin;
}

bool Lingers(std::chrono::nanoseconds gap, std::chrono::nanoseconds since_team) {
  return gap < kLingerGap && since_team >= kLingerAfterTeam;
}

bool WinogradOnPool(bool weight) { return !weight; }

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

double Noise(const std::vector<double>& samples) {
  if (samples.size() < 2) return 0.0;
  std::vector<double> sorted(samples);
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  return median > 0 ? (median - sorted.front()) / median : 0.0;
}

size_t Pick(const std::vector<double>& best, const std::vector<double>& noise,
            const std::vector<bool>& racing, const std::vector<int>& moves, double macs) {
  const size_t fastest = std::min_element(best.begin(), best.end()) - best.begin();
  const double margin = macs >= kTrialLargeMacs ? kTrialMarginLarge : kTrialMargin;
  size_t kept = fastest;
  for (size_t c = 0; c < best.size(); ++c)
    if (racing[c] && moves[c] < moves[kept] &&
        best[c] <= (1 + margin + noise[c] + noise[fastest]) * best[fastest])
      kept = c;
  return kept;
}

std::vector<int64_t> BlockedOffsets(const Blocking& b, size_t dim) {
  const std::vector<int64_t>& blks = b.inner_blks;
  int64_t tile = 1;  // dim's extent inside a tile
  for (size_t k = 0; k < blks.size(); ++k)
    if (b.inner_idxs[k] == static_cast<int64_t>(dim)) tile *= blks[k];
  std::vector<int64_t> off(b.padded[dim]);
  for (int64_t v = 0; v < b.padded[dim]; ++v) {
    int64_t at = (v / tile) * b.strides[dim];
    // the tile's blocks, innermost first: each one's stride in the tile, and the product of
    // dim's blocks inside it
    int64_t stride = 1, inside = 1;
    for (size_t k = blks.size(); k-- > 0;) {
      if (b.inner_idxs[k] == static_cast<int64_t>(dim)) {
        at += (v / inside) % blks[k] * stride;
        inside *= blks[k];
      }
      stride *= blks[k];
    }
    off[v] = at;
  }
  return off;
}

namespace {

// Whether off[base + j] == off[base] + j * step for every run of `run` from 0, and each run's
// first offset a multiple of `align` (64-byte stores).
bool Runs(const std::vector<int64_t>& off, int64_t run, int64_t step, int64_t align) {
  if (off.size() % run != 0) return false;
  for (size_t base = 0; base < off.size(); base += run) {
    if (off[base] % align != 0) return false;
    for (int64_t j = 1; j < run; ++j)
      if (off[base + j] != off[base] + j * step) return false;
  }
  return true;
}

// The kind of move between an XIO filter and `blk` (same dims, O a multiple of 16, the channel
// dims alone padded, to multiples of 16), with `o_off` and `i_off` the blocked side's tables
// (over the padded extents).
MoveKind KindOf(const Blocking& blk, bool into, const std::vector<int64_t>& o_off,
                const std::vector<int64_t>& i_off) {
  const std::vector<int64_t>& blks = blk.inner_blks;
  const std::vector<int64_t>& idxs = blk.inner_idxs;
  // O x I tiles of multiples of 16, I innermost (into) or O innermost (out of)
  const int64_t inner = into ? 1 : 0;
  const bool tiles = blks.size() == 2 && idxs[0] == 1 - inner && idxs[1] == inner &&
                     blks[0] % 16 == 0 && blks[1] % 16 == 0 && blk.dims[1] % 16 == 0;
  const bool padded_o = blk.padded[0] != blk.dims[0], padded_i = blk.padded[1] != blk.dims[1];
  const bool padded = padded_o || padded_i;
  // the copy of 2-byte rows measured level with oneDNN's reorder (docs/onednn.md): kept off
  if (!into) return tiles && !padded && blk.element == 4 ? MoveKind::kCopy : MoveKind::kOff;
  if (blk.element == 4) return tiles && !padded ? MoveKind::kTranspose : MoveKind::kOff;
  if (blk.element != 2) return MoveKind::kOff;
  for (size_t a = 2; a < blk.dims.size(); ++a)
    if (blk.strides[a] % 32 != 0) return MoveKind::kOff;  // 64-byte stores at every tap
  if (!padded_i && Runs(i_off, 2, 1, 32) && Runs(o_off, 16, 2, 32))
    return MoveKind::kTransposeRowPairs;
  if (!padded_o && blk.dims[0] % 32 == 0 && Runs(o_off, 2, 1, 32) && Runs(i_off, 16, 2, 32))
    return MoveKind::kTransposePairs;
  return MoveKind::kOff;
}

}  // namespace

FilterMove PlanFilterMove(const Blocking& xio, const Blocking& blk, bool into) {
  FilterMove t;
  const size_t n = xio.dims.size();
  if ((xio.element != 4 && xio.element != 2) || blk.element != xio.element || n < 3 ||
      n > 5 || blk.dims != xio.dims)
    return t;
  if (!xio.blocked || !blk.blocked || !xio.inner_blks.empty() || xio.padded != xio.dims ||
      !blk.offset0 || !xio.offset0 || blk.padded.size() != n)
    return t;
  const std::vector<int64_t>& dims = xio.dims;
  const std::vector<int64_t>& xs = xio.strides;
  if (dims[0] % 16 != 0 || blk.padded[0] % 16 != 0 || blk.padded[1] % 16 != 0 || xs[0] != 1 ||
      xs[1] != dims[0])
    return t;
  for (size_t a = 2; a < n; ++a)
    if (blk.padded[a] != dims[a]) return t;
  std::vector<int64_t> o_off = BlockedOffsets(blk, 0), i_off = BlockedOffsets(blk, 1);
  t.kind = KindOf(blk, into, o_off, i_off);
  if (t.kind == MoveKind::kOff) return t;
  t.o = dims[0];
  t.o_padded = blk.padded[0];
  t.i = dims[1];
  t.i_padded = blk.padded[1];
  t.xio_i = xs[1];
  t.o_off = std::move(o_off);
  t.i_off = std::move(i_off);
  if (t.kind == MoveKind::kTranspose) t.tile_o = t.o_off[1] - t.o_off[0];
  for (size_t a = 2; a < n; ++a) {
    t.taps.push_back(dims[a]);
    t.xio_tap.push_back(xs[a]);
    t.blk_tap.push_back(blk.strides[a]);
  }
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
