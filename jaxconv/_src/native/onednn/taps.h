// A data gradient as tap products (docs/onednn.md, "The layout trial"): for each filter tap k, the
// product of dy's pixels (rows of its O channels) by the tap's O x I matrix of the filter, read
// in place, on oneDNN's matmul (one call: the taps a batch of products sharing dy); then each
// tap's rows added onto dx where that tap places them (dx[i S - pb + k D] += T[k, i]), each
// row of dx by one thread of the call's team.
//
// Where a batch-1 transposed convolution's filter outweighs its activations (DCGAN's 4x4
// 512 -> 256 at 4x4: an 8 MiB filter for 16 pixels), the convolution primitive reorders the
// whole filter into its blocked layout every call; the products read it once as it is. A
// candidate of the layout trial (trial.h), kept where it runs faster (decisions.h, TapsApply).
#pragma once

#include <memory>

#include "primitives.h"

namespace jaxconv_onednn {

// The tap-products entry of `p` (TapsApply(p)); throws dnnl::error where oneDNN's matmul
// has only its reference implementation for it.
std::shared_ptr<Entry> CreateTaps(const Problem& p);

// Runs the tap-products entry `e` (Entry::taps): dx (x) from dy (y) and the filter (w).
void ExecuteTaps(const Entry& e, void* x, const void* y, const void* w);

}  // namespace jaxconv_onednn
