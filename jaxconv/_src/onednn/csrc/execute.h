// Running a cached primitive on the caller's buffers, and the working memory it needs.
//
// Rules (docs/onednn.md, "Working memory"):
// - working memory (scratchpads, reordered copies) is each thread's own and kept between
//   calls: a fresh allocation of an activation's size costs a page fault per 4 KiB; a buffer
//   larger than kKeepBytes is released after the call;
// - it starts on a 64-byte boundary (kAlign), as oneDNN's own allocations and XLA's buffers
//   do: a copy off a cache line splits every vector load in two, at a speed that then depends
//   on the heap's state;
// - primitives run through oneDNN's C API (its C++ execute() builds a hash map per call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>

#include "primitives.h"

namespace jaxconv_onednn {

constexpr size_t kKeepBytes = size_t{64} << 20;
constexpr size_t kAlign = 64;

struct FreeAligned {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t[], FreeAligned>;

// `bytes` (at least 1) on a kAlign boundary, zero-filled where asked; throws std::bad_alloc.
AlignedBytes Allocate(size_t bytes, bool zeroed);

// A thread's working buffer (a primitive's scratchpad, a reordered copy), grown as needed and
// kept between calls up to kKeepBytes (Trim after the call).
class Buffer {
 public:
  uint8_t* Get(size_t bytes);  // at least `bytes`, uninitialised
  void Trim();

 private:
  AlignedBytes data_;
  size_t size_ = 0;
};

// This thread's stream (a CPU stream runs in order, on the thread that submits).
dnnl::stream& Stream();

// A primitive run on `s` with `args`; an error status throws dnnl::error.
void Exec(const dnnl::primitive& prim, dnnl::stream& s,
          std::initializer_list<dnnl_exec_arg_t> args);

// Runs entry `e` of kernel `k` on the caller's buffers (x, y, w: which are read and which
// written depends on k), reordering where the primitive wants another layout.
void Execute(const Entry& e, Kernel k, void* x, void* y, void* w);

}  // namespace jaxconv_onednn
