// The Winograd drivers' choices (winograd_decisions.h).
#include "winograd_decisions.h"

#include <algorithm>

namespace jaxconv_onednn {

namespace {

size_t Floats(int alpha, int64_t rows, int64_t cols) {
  return static_cast<size_t>(alpha) * alpha * rows * cols * sizeof(float);
}

}  // namespace

WinogradPlan WinogradForwardPlan(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                                 int64_t chunk_tiles) {
  if (Floats(alpha, c, k_padded) <= kWinogradFusedMaxFilterBytes) return WinogradPlan::kFused;
  return std::min(chunk_tiles, tiles) <= kWinogradBlockedMaxTiles ? WinogradPlan::kBlocked
                                                                  : WinogradPlan::kStaged;
}

WinogradPlan WinogradWeightPlan(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                                int64_t chunk_tiles, int64_t block_rows) {
  const size_t du = Floats(alpha, c, k_padded);
  if (du > kWinogradFusedMaxWeightBytes && chunk_tiles >= tiles && tiles <= 2 * block_rows)
    return WinogradPlan::kBlocked;
  return du <= kWinogradFusedMaxWeightBytes ? WinogradPlan::kFused : WinogradPlan::kStaged;
}

int64_t WinogradChunkTiles(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                           size_t chunk_bytes) {
  return std::clamp<int64_t>(chunk_bytes / Floats(alpha, 1, c + k_padded), 1, tiles);
}

int64_t WinogradForwardBlockTiles(int alpha, int64_t c, int64_t k_padded, int64_t tiles,
                                  int rows) {
  const int64_t fit = kWinogradBlockBytes / Floats(alpha, 1, c + k_padded);
  return std::min((tiles + rows - 1) / rows, std::max<int64_t>(1, fit / rows)) * rows;
}

int64_t WinogradWeightBlockTiles(int alpha, int64_t c, int64_t k_padded, int64_t tiles) {
  return std::clamp<int64_t>(kWinogradBlockBytes / Floats(alpha, 1, c + k_padded), 1, tiles);
}

int64_t WinogradColumnGroups(int64_t k_padded) {
  return (k_padded + kWinogradFilterColumns - 1) / kWinogradFilterColumns;
}

int64_t WinogradFilterBlockRows(int64_t c, int64_t threads) {
  return std::clamp<int64_t>((c + 4 * threads - 1) / (4 * threads), 16, kWinogradFilterBlock);
}

int64_t WinogradRowSplits(int64_t threads, int64_t column_groups) {
  return std::max<int64_t>(1, (2 * threads + column_groups - 1) / column_groups);
}

int64_t WinogradWeightBlockRows(int64_t c, int64_t k_padded, int64_t threads, int rows) {
  const int64_t groups = WinogradColumnGroups(k_padded);
  int64_t cb = kWinogradWeightRows;
  while (cb > rows && (c + cb - 1) / cb * groups < 4 * threads) cb -= rows;
  return cb;
}

}  // namespace jaxconv_onednn
