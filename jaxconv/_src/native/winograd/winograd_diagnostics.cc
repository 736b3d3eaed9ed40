// Winograd's C functions for the tests (runtime/diagnostics.cc holds the handler's others): the
// passes' vector ISA, the staged passes' chunk, and winograd_decisions.h on plain numbers
// (tests/native/test_decisions.py).
#include <cstdint>

#include "winograd.h"
#include "winograd_decisions.h"

using namespace jaxconv_onednn;  // NOLINT: this file only exports C functions

extern "C" {

// The Winograd passes' vector ISA (0 AVX-512, 1 AVX2, 2 neither), and their chunk size in
// bytes (0: the default), for the tests.
int jaxconv_winograd_isa() { return WinogradIsa(); }
void jaxconv_winograd_set_chunk_bytes(int64_t bytes) {
  SetWinogradChunkBytes(static_cast<size_t>(bytes));
}

// ---- winograd_decisions.h on plain numbers ----

// The forward's (weight 0) or the weight gradient's (weight 1) plan: 0 fused, 1 staged,
// 2 blocked; `block_rows`, the weight gradient's.
int jaxconv_winograd_decide_plan(int weight, int alpha, int64_t c, int64_t k_padded,
                                 int64_t tiles, int64_t chunk_tiles, int64_t block_rows) {
  const WinogradPlan plan =
      weight != 0 ? WinogradWeightPlan(alpha, c, k_padded, tiles, chunk_tiles, block_rows)
                  : WinogradForwardPlan(alpha, c, k_padded, tiles, chunk_tiles);
  return static_cast<int>(plan);
}

int64_t jaxconv_winograd_decide_chunk_tiles(int alpha, int64_t c, int64_t k_padded,
                                            int64_t tiles, int64_t chunk_bytes) {
  return WinogradChunkTiles(alpha, c, k_padded, tiles, static_cast<size_t>(chunk_bytes));
}

int64_t jaxconv_winograd_decide_forward_block(int alpha, int64_t c, int64_t k_padded,
                                              int64_t tiles, int rows) {
  return WinogradForwardBlockTiles(alpha, c, k_padded, tiles, rows);
}

int64_t jaxconv_winograd_decide_weight_block(int alpha, int64_t c, int64_t k_padded,
                                             int64_t tiles) {
  return WinogradWeightBlockTiles(alpha, c, k_padded, tiles);
}

int64_t jaxconv_winograd_decide_filter_rows(int64_t c, int64_t threads) {
  return WinogradFilterBlockRows(c, threads);
}

int64_t jaxconv_winograd_decide_row_splits(int64_t threads, int64_t column_groups) {
  return WinogradRowSplits(threads, column_groups);
}

int64_t jaxconv_winograd_decide_weight_rows(int64_t c, int64_t k_padded, int64_t threads,
                                            int rows) {
  return WinogradWeightBlockRows(c, k_padded, threads, rows);
}

}  // extern "C"
