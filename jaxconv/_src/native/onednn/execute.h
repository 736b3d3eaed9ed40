// Running a cached primitive on the caller's buffers, with working memory from buffers.h.
//
// Rules (docs/onednn.md, "Working memory"):
// - scratchpads and reordered copies are each thread's own Buffer, kept between calls;
// - primitives run through oneDNN's C API (its C++ execute() builds a hash map per call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <vector>

#include "buffers.h"
#include "primitives.h"

namespace jaxconv_onednn {

// This thread's stream (a CPU stream runs in order, on the thread that submits).
dnnl::stream& Stream();

// A primitive run on `s` with `args`; an error status throws dnnl::error.
void Exec(const dnnl::primitive& prim, dnnl::stream& s,
          std::initializer_list<dnnl_exec_arg_t> args);

// Runs entry `e` of kernel `k` on the caller's buffers (x, y, w: which are read and which
// written depends on k), reordering where the primitive wants another layout; `sides`: a fused
// forward's post-op operands (Entry::sides), in order. `packed`: a forward's or a data
// gradient's filter w is packed (packed.h) in this layout, which is the primitive's where
// they agree (read as it is) and else reordered into it.
void Execute(const Entry& e, Kernel k, void* x, void* y, void* w,
             const std::vector<void*>& sides = {}, const memory::desc* packed = nullptr);

}  // namespace jaxconv_onednn
