// Working memory: one kind of buffer for every kernel of the handler (oneDNN's scratchpads and
// reordered copies, Winograd's transforms and products, the matmuls' scratch).
//
// Rules (docs/onednn.md, "Working memory"):
// - a buffer is kept between calls, grown as needed: a fresh allocation of an activation's
//   size costs a page fault per 4 KiB; one larger than its keep size is released by Trim
//   after the call (kKeepBytes unless its owner says otherwise);
// - it starts on a 64-byte boundary (kAlign), as oneDNN's own allocations and XLA's buffers
//   do: a copy off a cache line splits every vector load in two, at a speed that then depends
//   on the heap's state;
// - a buffer is one thread's (thread_local), or shared under the caller's RunMutex.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace jaxconv_onednn {

constexpr size_t kKeepBytes = size_t{64} << 20;
constexpr size_t kAlign = 64;

struct FreeAligned {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t[], FreeAligned>;

// `bytes` (at least 1) on a kAlign boundary, zero-filled where asked; throws std::bad_alloc.
AlignedBytes Allocate(size_t bytes, bool zeroed);

class Buffer {
 public:
  explicit Buffer(size_t keep = kKeepBytes) : keep_(keep) {}
  // at least `bytes`; a grown buffer is zero-filled where `zeroed`, else uninitialised
  uint8_t* Get(size_t bytes, bool zeroed = false);
  // at least `n` floats (one where n is 0), zero-filled where grown
  float* Floats(size_t n) {
    return reinterpret_cast<float*>(Get(std::max<size_t>(n, 1) * sizeof(float), true));
  }
  void Trim();  // releases the memory past the keep size

 private:
  AlignedBytes data_;
  size_t size_ = 0;
  size_t keep_;
};

}  // namespace jaxconv_onednn
