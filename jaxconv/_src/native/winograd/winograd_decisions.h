// The Winograd drivers' choices (winograd.cc), as functions of plain numbers: which order of
// passes runs (fused per block of tiles, staged over chunks, blocked per block of channels),
// and how many tiles or channels each block and chunk holds. The drivers call them with a
// problem's numbers; diagnostics (winograd_diagnostics.cc) exports each for the tests
// (tests/native/test_decisions.py), as decisions.h's are. Measured on a 2-core Zen 4 only
// (docs/lowerings.md, "Winograd").
#pragma once

#include <cstddef>
#include <cstdint>

namespace jaxconv_onednn {

constexpr size_t kWinogradBlockBytes = size_t{384} << 10;
constexpr size_t kWinogradFusedMaxFilterBytes = size_t{4} << 20;
constexpr size_t kWinogradFusedMaxWeightBytes = size_t{1} << 20;
constexpr size_t kWinogradChunkBytes = size_t{64} << 20;
constexpr size_t kWinogradKeepBytes = size_t{128} << 20;
// tiles (2-core Zen 4, 256 -> 256: blocked 0.7-0.8x the whole U's time at 72 and 90 tiles,
// 1.1-1.3x at 108 and 128)
constexpr int64_t kWinogradBlockedMaxTiles = 96;
constexpr int64_t kWinogradFilterBlock = 64;      // input channels of U's block
constexpr int64_t kWinogradFilterColumns = 64;    // output channels of U's block (of 32)
constexpr int64_t kWinogradWeightRows = 48;       // input channels of dU's block
// floats a thread's transform of U needs to transpose a block (FilterRows): two of 9 taps x
// 64 output channels (winograd_tiles.h's kBlock) x kWinogradFilterBlock input channels
constexpr int64_t kWinogradFilterScratch = 2 * 9 * 64 * kWinogradFilterBlock;

// The order of the passes: fused per block of tiles (kFused), staged over chunks of tiles
// with the whole U or dU (kStaged), or per block of channels in the cache (kBlocked).
enum class WinogradPlan : int { kFused = 0, kStaged = 1, kBlocked = 2 };

// The forward: fused where U (alpha^2 x C x K padded floats) takes at most
// kWinogradFusedMaxFilterBytes (each block reads all of it); else staged, a chunk of at most
// kWinogradBlockedMaxTiles tiles by blocks of U transformed into the cache (kBlocked), a larger
// one by the whole U (kStaged).
WinogradPlan WinogradForwardPlan(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                                 int64_t chunk_tiles);
// The weight gradient: blocked where dU exceeds kWinogradFusedMaxWeightBytes, all tiles fit
// one chunk and number at most twice a block's input channels (`block_rows`); else fused
// where dU takes at most kWinogradFusedMaxWeightBytes, staged otherwise.
WinogradPlan WinogradWeightPlan(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                                int64_t chunk_tiles, int64_t block_rows);

// Tiles in a chunk of the staged passes: V and M (or dM) within `chunk_bytes`, at least one.
int64_t WinogradChunkTiles(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                           size_t chunk_bytes);
// Tiles in a block of the fused forward: V and M within kWinogradBlockBytes, a multiple of the
// products' `rows`.
int64_t WinogradForwardBlockTiles(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                                  int rows);
// Tiles in a block of the fused weight gradient: V and dM within kWinogradBlockBytes.
int64_t WinogradWeightBlockTiles(int alpha, int64_t c, int64_t k_padded, int64_t tiles);
// Blocks of kWinogradFilterColumns output channels over K padded.
int64_t WinogradColumnGroups(int64_t k_padded);
// Input channels per block of U's transform: four blocks a thread, 16 to kWinogradFilterBlock.
int64_t WinogradFilterBlockRows(int64_t c, int64_t threads);
// Row splits of the blocked forward's column blocks: twice the threads between them.
int64_t WinogradRowSplits(int64_t threads, int64_t column_groups);
// Input channels of the blocked weight gradient's blocks: kWinogradWeightRows, fewer (by the
// products' `rows`) where the blocks would not give each thread four.
int64_t WinogradWeightBlockRows(int64_t c, int64_t k_padded, int64_t threads, int rows);

}  // namespace jaxconv_onednn
