// The handler's pure decisions: functions of sizes and times only, with no oneDNN call, so that
// each is tested directly (tests/native/test_decisions.py, through decisions_diagnostics.cc's exports).
//
// - how a call is threaded (Chunks) and how long its caller spins for its chunks
//   (KeepSpinning): docs/onednn.md, "Threads";
// - which candidate layout the first call's trial keeps (Racing, TrialDone, Pick):
//   docs/onednn.md, "The layout trial";
// - the plan of jaxconv's own filter moves (PlanFilterMove): docs/onednn.md, "Filter moves".
//
// Each threshold is a named constant; its measurement is in the section named beside it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "problem.h"

namespace jaxconv_onednn {

// ---- Threads (docs/onednn.md, "Threads") ----

// Handing a chunk to another thread costs about 10-20 us: a chunk needs this many
// multiply-adds (~50 us on one AVX-512 core) or ...
constexpr double kMinChunkMacs = double{1 << 21};
// ... this many bytes of activations (x and y; ~50 us of one core's memory traffic), or the
// call runs whole on its calling thread.
constexpr double kMinChunkBytes = double{1 << 20};
// A forward or data gradient (one example's rows, SplitsRows, or a batch) splits in two from
// this many work units (about 12 us of one core's work), not one: a served forward runs its
// calls one after another, most of them split, so the pool's thread is awake for the next (its
// start ~1 us); a call left whole on the calling thread lets it fall asleep, and the next split
// call waits 20-50 us for it (MobileNetV2's depthwise 384 at 14x14, 0.6 units, before each 1x1
// 384 -> 64; 2-core Xeon). docs/onednn.md, "Threads".
constexpr double kSplitMinUnits = 0.25;
// The caller, its own chunk done, spins this long for the others before it sleeps.
constexpr std::chrono::microseconds kSpin{200};
// A pool thread whose chunks are done waits this long for the next split call's job before it
// returns to XLA's pool, where it soon sleeps: the next call's task then waits for a wake-up
// (20-50 us on a KVM guest), and in some processes the woken thread took the caller's core
// while the caller waited to run, so that both chunks ran one after the other (DCGAN's
// generator at batch 1 1.44-1.92 ms a forward across processes, 1.29-1.39 lingering; 2-core
// Xeon VM) ...
constexpr std::chrono::microseconds kLinger{200};
// ... where the split calls come this close: the previous one ended less than kLingerGap
// before this one started (Lingers). A batch-1 forward's calls come 5-20 us apart; a training
// step's have XLA's own work between them (ResNet-18's at batch 8: 90 us to 50 ms apart),
// which a waiting thread would slow.
constexpr std::chrono::microseconds kLingerGap{50};
// ... and only once no call has run on the OpenMP team for this long (the team's master then
// releases its pool: team.h, kTeamIdle): a waiting thread beside a team's threads shares the
// cores with them (ResNet-18's batch-1 forward, then with ten Winograd calls on the team among its split
// calls, took 9% longer with lingering threads on the 2-core Xeon VM).
constexpr std::chrono::milliseconds kLingerAfterTeam{20};

// A problem's work in units of the least worth a thread of its own.
double WorkUnits(const Problem& p);

// Whether `p` is a forward or data gradient whose buffers hold the batch, then its first
// spatial axis (rows), outermost (NHWC): each example's rows are contiguous.
bool RowsOuter(const Problem& p);

// Whether a call of `p` splits into chunks of rows (its first spatial axis) rather than of its
// batch: a forward (y's rows) or data gradient (x's rows) of one example, RowsOuter.
bool SplitsRows(const Problem& p);

// Whether `chunks` chunks of `p` are chunks of its examples' rows: a batch of fewer examples
// than chunks, RowsOuter, each example's rows split in chunks / N (Chunks gives no other
// count above the batch).
bool SplitsExampleRows(const Problem& p, int64_t chunks);

// A forward or data gradient of one example with a 1x1 filter (every tap extent 1), unit
// strides and no pads, in channels-last buffers (N, X..., C), is a product over its pixels: as
// one axis of them (N, X1 * ... * Xn, 1..., C), the same buffers, its rows split evenly (7x7's
// 7 rows split 3 + 4, its 49 pixels 24 + 25: MobileNetV2's 1x1s at 7x7).
bool MergesPixels(const Problem& p);
void MergePixels(Problem& p);

// A chunk of a SplitsRows problem: the forward's y rows [begin, end) read x's rows
// [x_begin, x_end), and the data gradient's x rows [begin, end) sum y's rows [y_begin, y_end),
// as the convolution of those rows padded by pad_begin and pad_end. ok(): rows on both sides
// and pads >= 0 (else the call runs on the team).
struct RowSpan {
  int64_t x_begin = 0, x_end = 0, y_begin = 0, y_end = 0, pad_begin = 0, pad_end = 0;
  int64_t example = 0;  // the example whose rows these are (SplitsExampleRows)
  int64_t c_begin = 0, c_end = 0;  // a chunk of x's channels instead (SplitsChannels)
  bool ok() const;
};
RowSpan RowChunk(const Problem& p, int64_t begin, int64_t end);

// A data gradient of one example whose filter holds more than this many times the elements of
// x and y together does not split its rows (each chunk would read the whole filter): DCGAN's
// 4x4 512 -> 256 at 4x4 (85 times) took 2.0 ms as rows, 1.1 on the team. It splits x's
// channels (SplitsChannels), or runs as one OpenMP call.
constexpr double kRowsFilterRatio = 8;

// Such a data gradient (a served transposed convolution of a generator or decoder) in
// channels-last buffers, of one group, runs as chunks of x's channels, each a multiple of
// kChannelBlock and all equal: a chunk computes its channels from all of y and its part of
// the filter, into a buffer of its own that it then copies into x, so that each thread reads
// its share of the filter, as the team's threads would, without the team (its hand-off to
// and from our master thread, its workers spinning after it beside the pool's next chunks:
// docs/onednn.md, "Threads").
constexpr int64_t kChannelBlock = 16;
bool SplitsChannels(const Problem& p);

// How a call of `p` runs: 0 as one OpenMP call; n >= 1 as n chunks of the batch (or of y's
// rows: SplitsRows) on XLA's pool of `pool_threads` threads (1: whole, single-threaded, on the
// calling thread). `openmp`: whether oneDNN's OpenMP runtime was found (else one call, as
// oneDNN threads it).
//   - a weight gradient: whole on the calling thread below one work unit, else one OpenMP
//     call (chunks would each write a partial gradient to be reordered and summed);
//   - a forward or data gradient: chunks of the batch (of one example: of rows, SplitsRows),
//     one per whole work unit (two from kSplitMinUnits on) and at most one per pool thread;
//     where each example is a chunk and threads are left (a batch of fewer examples than
//     pool threads), each example's rows split as one example's would on its share of the
//     threads (SplitsExampleRows), unless the batch is not the buffers' outer axis, nothing
//     splits a call of at least a unit (one example, one row, one pool thread: then one
//     OpenMP call), or a batch's filter outweighs a chunk's activations (each chunk would
//     reorder the whole filter: one OpenMP call reorders it once; below one unit, whole on
//     the calling thread); one example's data gradient by rows unless its filter
//     outweighs x and y kRowsFilterRatio times; then by x's channels (SplitsChannels), one
//     chunk per whole unit (two from kSplitMinUnits on), at most one per pool thread and
//     kChannelBlock channels, as many as divide the channels evenly.
int64_t Chunks(const Problem& p, int64_t pool_threads, bool openmp);

// Whether a caller that has waited `waited` for `chunks - finished` chunks goes on spinning.
bool KeepSpinning(int64_t finished, int64_t chunks, std::chrono::nanoseconds waited);
// Whether the pool threads that run a split call's chunks linger after them (kLinger): the
// call started `gap` after the previous split call ended and `since_team` after the last
// team call started.
bool Lingers(std::chrono::nanoseconds gap, std::chrono::nanoseconds since_team);
// Whether a Winograd call (its weight gradient: `weight`) runs its passes as parts on XLA's pool
// (openmp.h, PoolInstead), not on the OpenMP team: a forward does. On the team, its idle
// workers spin after each call on the cores that the program's next calls split over XLA's
// pool (one process, the rule against every call on the team, 2-core Zen 4 VM: ResNet-18's
// batch-1 forward 13.4 ms against 18.2, the MNIST CNN's 0.10 against 0.21; training steps
// within noise: docs/onednn.md, "Threads"). A weight gradient stays on the team, beside the
// step's other weight gradients there.
bool WinogradOnPool(bool weight);

// A matrix product C (m x n) = op(A) op(B) over k (matmul.h): whether it runs in parts on XLA's
// pool (ProductParts) rather than as one call on the OpenMP team: a float32 one always (where
// it runs on the handler at all: the chooser timed it faster than XLA's), a bfloat16 one of at
// most kPoolProductRows rows or columns (a serving batch's dense layer: the team's hand-off
// cost more than its product, the MNIST CNN's bfloat16 forward at batch 8 1.11-1.16x its time
// with XLA's products against 1.02-1.05x in parts; larger ones, a training step's, on the
// team as before). Measured on the 2-core Xeon VM only: docs/onednn.md, "Matrix products".
constexpr int64_t kPoolProductRows = 16;
bool ProductOnPool(int64_t m, int64_t n, bool float32);

// In how many parts of C's rows (where m > n) or columns it runs there, each part on one
// thread (1: whole on the calling thread). One part per whole work unit, two from one unit on
// (the multiply-adds over kMinChunkMacs, or the three matrices' bytes, of `element_bytes`
// each, over kMinChunkBytes: a product of one or a few rows reads its weights once,
// memory-bound), at most one per pool thread and one per kProductBlock rows or columns.
constexpr int64_t kProductBlock = 16;
int64_t ProductParts(int64_t m, int64_t n, int64_t k, int64_t element_bytes,
                     int64_t pool_threads);

// ---- Fused chains (docs/onednn.md, "Fused chains") ----

// A fused forward's leading run of channel add, sub, mul and mul_rsqrt post-ops (a bias;
// BatchNorm in inference mode), which the handler composes into one multiply and one add per
// output channel (affine.h): its length; whether it multiplies; and whether the multiply folds
// into the filter: a float32 filter with no more elements than y (scaling it is a pass over
// the filter each call, the post-op one over y's values in registers; MobileNetV2's 1x1s fold,
// ResNet's 3x3 512 -> 512 at 7x7 keeps the post-op); a packed filter (packed.h) never folds.
struct AffineRun {
  size_t length = 0;
  bool multiplies = false, folds = false;
};
AffineRun LeadingAffine(const Problem& p);

// ---- Tap products (docs/onednn.md, "The layout trial") ----

// Whether the data gradient `p` can run as tap products (taps.h): float32, one group, no
// post-ops, channels-last data (N, X..., C), a filter whose spatial axes merge into one axis
// of taps (row-major among themselves), and products of at most kTapsBytes.
bool TapsApply(const Problem& p);
constexpr double kTapsBytes = double{1 << 26};

// ---- The layout trial (docs/onednn.md, "The layout trial") ----

// Problems whose buffers exceed this take the first candidate without a trial.
constexpr size_t kTrialBytes = size_t{1} << 29;
// A candidate whose warm-up took over kTrialSlower times the fastest warm-up, and over
// kTrialSlowerFloor seconds, is not timed further.
constexpr double kTrialSlower = 4.0, kTrialSlowerFloor = 0.02;
// Each timed candidate runs at least kTrialRounds times and kTrialSeconds in all, at most
// kTrialMaxRounds times.
constexpr int kTrialRounds = 3, kTrialMaxRounds = 25;
constexpr double kTrialSeconds = 0.01;
// Another layout replaces the caller's only when its best time is lower by more than
// kTrialMargin plus both candidates' noise (Noise); from kTrialLargeMacs multiply-adds (the
// problem's size, which contention cannot inflate as it can a trial's time) by more than
// kTrialMarginLarge plus both noises.
constexpr double kTrialMargin = 0.05, kTrialLargeMacs = 2.68e8, kTrialMarginLarge = 0.01;

// Which candidates are timed after their warm-up runs took `warmup` seconds each.
std::vector<bool> Racing(const std::vector<double>& warmup);
// Whether the trial has run enough rounds: `round` rounds done, `spent` seconds per candidate.
bool TrialDone(int round, const std::vector<double>& spent, const std::vector<bool>& racing);
// A candidate's noise from its timed rounds' `samples`: how far their median lies above their
// best, a fraction of the median (0 for fewer than two).
double Noise(const std::vector<double>& samples);
// The candidate kept: the fastest by `best` (each candidate's best time; a candidate out of
// the race keeps its warm-up time), unless a racing candidate that moves less (`moves`: 0
// nothing, the caller's activations and filter; 1 the filter alone; 2 the activations) is
// within the margin plus both candidates' `noise` for a problem of `macs` multiply-adds: of
// those, the one that moves least (the first of equals).
size_t Pick(const std::vector<double>& best, const std::vector<double>& noise,
            const std::vector<bool>& racing, const std::vector<int>& moves, double macs);

// ---- Filter moves (docs/onednn.md, "Filter moves") ----

// A filter's memory layout as oneDNN describes it, in plain numbers.
struct Blocking {
  std::vector<int64_t> dims, strides;          // oneDNN's logical dims (O, I, X...), strides
  std::vector<int64_t> inner_blks, inner_idxs;  // blocks inside the innermost tile
  int64_t element = 0;     // bytes of an element: 4 (float32) or 2 (bfloat16, float16); 0 other
  bool blocked = false;    // a blocked (or plain strided) format, not "any"
  std::vector<int64_t> padded;                  // the padded dims (oneDNN's)
  bool offset0 = false;    // no submemory offset
};

// The moves (each a move of bits, so a 2-byte move serves bfloat16 and float16 alike):
// into a forward's or data gradient's layout, transposes of XIO's O-contiguous rows:
// - kTranspose: 4-byte elements, I innermost in O x I tiles of multiples of 16: 16 x 16 tiles;
// - kTransposeRowPairs: 2-byte, pairs of I innermost, O 2 apart in runs of 16 (oneDNN's
//   "...16a2b" layouts): 2 x 16 tiles, i.e. two XIO rows interleaved;
// - kTransposePairs: 2-byte, pairs of O innermost, I 2 apart in runs of 16 ("...16b2a"):
//   16 x 16 tiles of O pairs (4-byte units);
// out of a weight gradient's layout:
// - kCopy: 4-byte, O innermost in runs of 16 (tiles of multiples of 16 both ways): rows of
//   16 O.
enum class MoveKind { kOff, kTranspose, kTransposeRowPairs, kTransposePairs, kCopy };

// A move between the caller's XIO filter (O innermost, then I, then the spatial axes: flax's
// HWIO) and a oneDNN layout whose tiles block O and I by multiples of 16 (of pairs, for the
// 2-byte kinds).
struct FilterMove {
  MoveKind kind = MoveKind::kOff;         // kOff: oneDNN's reorder runs
  int64_t o = 0, i = 0;                   // channels, multiples of 16
  int64_t o_padded = 0;                   // O padded to the blocks (kTransposeRowPairs), or o
  int64_t i_padded = 0;                   // I padded to the blocks (kTransposePairs), or i
  std::vector<int64_t> taps;              // the filter's spatial extents
  std::vector<int64_t> xio_tap, blk_tap;  // each spatial axis's stride (elements) on each side
  int64_t xio_i = 0;                      // XIO's stride of I (O's is 1)
  // the blocked side's offset (elements) of (o, i) at tap offset 0 is o_off[o] + i_off[i]
  // (tables: a division per 64-byte row doubled the move's time)
  std::vector<int64_t> o_off, i_off;
  int64_t tile_o = 0;  // kTranspose: the blocked side's stride of O within a tile
};

// The offsets (elements) of index 0 .. padded[dim] - 1 along logical dim `dim` of layout `b`,
// the other indices 0: oneDNN's blocked addressing (outer index times stride, plus the
// position inside the innermost tile).
std::vector<int64_t> BlockedOffsets(const Blocking& b, size_t dim);

// The plan of a move between `xio` and `blk`: into the blocked layout of a forward's or data
// gradient's filter (`into`: kTranspose for 4-byte elements, kTransposeRowPairs or
// kTransposePairs for 2-byte ones, by where the pairs lie; kTransposeRowPairs also where O's
// blocks pad it, kTransposePairs where I's do, the padding written as zeros) or out of a
// float32 weight gradient's (kCopy); off (oneDNN's reorder runs) where the layouts are none of
// those (4-byte layouts that block one channel dim alone, brgconv's, included: there oneDNN's
// reorder measured faster), the element is neither 4 nor 2 bytes, or the channels do not fill
// the tiles.
FilterMove PlanFilterMove(const Blocking& xio, const Blocking& blk, bool into);
int64_t Taps(const FilterMove& t);
// The offsets (elements) of spatial position `tap` (row-major over the taps) on each side.
void TapOffsets(const FilterMove& t, int64_t tap, int64_t& xio, int64_t& blk);

// jaxconv moves a filter into a forward's or data gradient's layout itself from this size of
// float32 filter, and of 2-byte filter (below it oneDNN's reorder is kept; the 2-byte moves
// measured faster than oneDNN's reorder from 32 KiB up, docs/onednn.md) ...
constexpr size_t kFilterTransposeMinBytes = size_t{1} << 20;
constexpr size_t kFilterTransposeMinBytes2 = size_t{32} << 10;
// ... copies a weight gradient's out on the OpenMP team from this size (on the calling thread
// below it), and with streaming stores from this size (where the filter outgrows the caches).
constexpr int64_t kFilterCopyTeamBytes = int64_t{1} << 20;
constexpr int64_t kFilterCopyStreamBytes = int64_t{8} << 20;

}  // namespace jaxconv_onednn
