// The layout trial: the first call of a problem creates its primitive on each distinct
// activation layout oneDNN implements it on (the caller's, "any"'s, the channel-blocked one),
// runs each on zero-filled buffers and keeps the fastest, once per problem and process, as XLA
// autotunes its GPU kernels (docs/onednn.md, "The layout trial"). The decisions (which
// candidates race, when the trial ends, which one is kept) are pure (decisions.h).
//
// A reference implementation ("ref:...", oneDNN's plain loop nest) is a candidate only where
// nothing else implements the problem, and then it is not timed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "primitives.h"

namespace jaxconv_onednn {

// The entry kept for `p`, its `choice` recorded for choices(): the kernel, the buffers'
// shapes, strides, dilations, groups and threading ("single": created for one thread;
// "openmp": oneDNN's team), then per candidate its activation layouts, impl and best trial
// time in ms ("-" where not timed), the kept one first.
std::shared_ptr<Entry> Choose(const Problem& p);

// Reference candidates left out, and timed, for the tests (cache_stats).
extern std::atomic<int64_t> reference_skipped, reference_trials;

}  // namespace jaxconv_onednn
