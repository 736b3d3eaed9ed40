// oneDNN memory descriptors of the caller's buffers, and the layouts a primitive may ask for.
//
// The roles of each buffer (data_axes, filter_axes; problem.h) map onto oneDNN's logical dims
// by strides: no copy of the caller's data, whatever its format (NXC, NCX; XIO, OIX, IOX,
// XOI). The activations of a primitive may stay in the caller's layout, take the one oneDNN's
// "any" picks, or take its channel-blocked layout; the first call's trial keeps the fastest
// (docs/onednn.md, "The layout trial").
#pragma once

#include <vector>

#include "decisions.h"
#include "problem.h"

namespace jaxconv_onednn {

// A data tensor (N, C, X...) of a buffer whose axes hold the roles at `axes`.
memory::desc DataMd(const std::vector<int64_t>& dims, const std::vector<int64_t>& axes,
                    memory::data_type dtype);

// The filter (G, O/G, I/G, X...) (or (O, I, X...) for one group) of the filter buffer.
memory::desc FilterMd(const Problem& p);

// Where the activations live for a primitive: the caller's buffers, oneDNN's own choice, or
// oneDNN's channel-blocked layout (nChw16c on AVX-512, nChw8c below), which its direct kernels
// run fastest on for many problems but which "any" does not pick where a kernel also takes
// the caller's layout. The filter takes the layout "any" picks, but for kCallerFilter: the
// caller's activations and the caller's filter, nothing moved (a batch-1 1x1 forward's filter
// reorder took as long as its products; docs/onednn.md, "The layout trial").
// kTaps: no convolution primitive at all but a data gradient's tap products (taps.h).
enum class Activations { kCaller, kAny, kBlocked, kCallerFilter, kTaps };

memory::desc Blocked(const memory::desc& md);
memory::desc Any(const memory::desc& md);

// `md`'s layout (its strides, or its channel blocks: oneDNN's nC...16c, 8c, 4c) with elements
// of `dtype`; throws dnnl::error (unimplemented) for another blocking.
memory::desc WithType(const memory::desc& md, memory::data_type dtype);

// A descriptor's layout in plain numbers, for the pure filter-move plan (decisions.h).
Blocking LayoutOf(const memory::desc& md);

}  // namespace jaxconv_onednn
