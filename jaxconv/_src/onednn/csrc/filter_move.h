// jaxconv's own moves of a filter between the caller's XIO layout and oneDNN's blocked ones,
// where oneDNN 3.2's reorders of those directions are slow (docs/onednn.md, "Filter moves"):
// - into a forward's or data gradient's layout with I innermost in each 16x16 tile: a
//   transpose of each tile in AVX-512 registers on oneDNN's OpenMP team, the tile after next
//   prefetched, streaming stores (RunFilterTranspose);
// - out of a weight gradient's layout with O innermost in each tile: a copy of 64-byte rows in
//   XIO's order, each XIO row written start to end (RunFilterCopy).
// Both equal oneDNN's reorder bit for bit (tests/test_onednn.py,
// test_filter_moves_equal_onednns_reorder). The plan is pure (decisions.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "decisions.h"
#include "problem.h"

namespace jaxconv_onednn {

// The plans of the two moves between descriptors; off where they do not apply (the
// transpose also needs AVX-512).
FilterMove PlanFilterTranspose(const memory::desc& xio, const memory::desc& blk);
FilterMove PlanFilterCopy(const memory::desc& blk, const memory::desc& xio);

// The transpose of plan `t` from src (XIO) into dst (blocked, 64-byte aligned), on the team.
void RunFilterTranspose(const FilterMove& t, const void* src, void* dst);
// The copy of plan `t` from src (blocked) into dst (XIO), on the team from
// kFilterCopyTeamBytes, by streaming stores from kFilterCopyStreamBytes.
void RunFilterCopy(const FilterMove& t, const void* src, void* dst);

// The calls that ran each move, for the tests (cache_stats).
extern std::atomic<int64_t> filter_transposes, filter_copies;

}  // namespace jaxconv_onednn
