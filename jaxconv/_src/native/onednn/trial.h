// The layout trial: the first call of a problem creates its primitive on each distinct
// activation layout oneDNN implements it on (the caller's, "any"'s, the channel-blocked one;
// the filter in the layout "any" picks), and on the caller's activations and filter both where
// the caller's layouts' implementation takes that filter as it is, runs each on zero-filled
// buffers and keeps the one that moves least
// unless another ran faster beyond both candidates' noise (Pick), once per problem and
// process, as XLA autotunes its GPU kernels
// (docs/onednn.md, "The layout trial"). The decisions (which candidates race, when the trial
// ends, which one is kept) are pure (decisions.h).
//
// A reference implementation ("ref:...", oneDNN's plain loop nest) is a candidate only where
// nothing else implements the problem, and then it is not timed.
//
// A verdict of an earlier process (jaxconv's disk cache of measured choices, for this
// machine and build: lowering/measured.py) is taken without a trial where it is remembered
// (Remember); with the trial off (SetTrial(false): JAXCONV_MEASURE=0) the caller's layout is
// kept where oneDNN implements it, untimed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "primitives.h"

namespace jaxconv_onednn {

// The entry kept for `p`, its `choice` recorded for choices(): the kernel, the buffers'
// shapes, strides, dilations, groups and threading ("single": created for one thread;
// "openmp": oneDNN's team), the source of the choice ("trial": timed now; "cache": an earlier
// process's verdict; "rule": the trial off; "alone": one candidate, or one too large to time;
// "packed": a packed filter's problem, on the layouts chosen when it was packed: packed.h),
// the problem's key (KeyText), then per candidate its activation layouts, impl, best trial
// time in ms and its noise ("-" where not timed), the kept one first.
std::shared_ptr<Entry> Choose(const Problem& p);

// Whether the primitive `packed` of a data gradient `p`, its filter read packed (packed.h),
// runs it faster than its tap products `taps` (which read the filter in place) do: the two
// raced as the trial races its candidates (Pick: the packed primitive moves nothing, the tap
// products move activations).
bool PackedWins(const Problem& p, const std::shared_ptr<Entry>& packed,
                const std::shared_ptr<Entry>& taps);

// The problem's cache key as text (its numbers joined by commas): what Remember takes.
std::string KeyText(const Problem& p);

// An earlier process's verdict on the problem of key text `key`: the primitive on activations
// `where` whose impl is `impl`. Forget drops them all.
void Remember(const std::string& key, Activations where, const std::string& impl);
void Forget();

// Whether first calls run the trial (default: unless JAXCONV_MEASURE=0 in the environment).
void SetTrial(bool on);

// Reference candidates left out, and timed, for the tests (cache_stats).
extern std::atomic<int64_t> reference_skipped, reference_trials;

}  // namespace jaxconv_onednn
