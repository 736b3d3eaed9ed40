// jaxconv's own moves of a filter between the caller's XIO layout and oneDNN's blocked ones,
// where oneDNN 3.2's reorders of those directions are slow (docs/onednn.md, "Filter moves"):
// - into a forward's or data gradient's layout (RunFilterTranspose), on oneDNN's OpenMP team
//   with streaming stores: float32 tiles with I innermost, each 16x16 tile transposed in
//   AVX-512 registers with the tile after next prefetched; 2-byte layouts with pairs of I
//   innermost, two XIO rows interleaved; 2-byte layouts with pairs of O innermost, 16x16 tiles
//   of pairs transposed as float32 tiles are;
// - out of a float32 weight gradient's layout with O innermost in each tile: a copy of rows of
//   16 O in XIO's order, each XIO row written start to end (RunFilterCopy).
// All equal oneDNN's reorder bit for bit (tests/native/test_onednn.py,
// test_filter_moves_equal_onednns_reorder). The plan is pure (decisions.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "decisions.h"
#include "problem.h"

namespace jaxconv_onednn {

// The plans of the two directions' moves between descriptors; off where they do not apply
// (the moves into the blocked layout also need AVX-512).
FilterMove PlanFilterTranspose(const memory::desc& xio, const memory::desc& blk);
FilterMove PlanFilterCopy(const memory::desc& blk, const memory::desc& xio);

// The move of plan `t` from src (XIO) into dst (blocked, 64-byte aligned), on the team.
void RunFilterTranspose(const FilterMove& t, const void* src, void* dst);
// The copy of plan `t` from src (blocked) into dst (XIO), on the team from
// kFilterCopyTeamBytes, by streaming stores from kFilterCopyStreamBytes.
void RunFilterCopy(const FilterMove& t, const void* src, void* dst);

// The calls that ran each move, for the tests (cache_stats).
extern std::atomic<int64_t> filter_transposes, filter_copies;

}  // namespace jaxconv_onednn
