// A forward's or a data gradient's filter packed ahead of its calls, in its primitive's own
// layout (docs/onednn.md, "Packed filters").
//
// A forward's primitive (a data gradient's: a served transposed convolution) reads its filter
// in a blocked layout of oneDNN's choice; a filter in
// the caller's layout is moved into it at every call: the whole filter read and written once
// more per call, which at batch 1 costs as much as a third of the arithmetic (ResNet-50:
// 100 MB a call). A filter that is a constant of the program (a model served with its
// variables closed over) is moved once, when the program is traced (jaxconv_onednn_pack_filter,
// through ctypes: lowering/fused.py), into bytes the program holds as a constant: a 64-byte
// Header, then the filter in the layout of the primitive PackedEntry names. A forward or
// data-gradient call whose filter operand is such bytes (uint8) reads them as they are; the
// header names the kernel, so that bytes packed for one are an error of the other.
//
// The layout is that of the primitive that runs the call: on the activations' layouts the
// layout trial keeps for the call's primitive, with the post-ops of the chain the call
// computes where the pack is given them (trial.h; ChainLayouts; the caller's filter,
// kCallerFilter, becomes the caller's activations with oneDNN's filter layout; a data gradient
// the trial runs as tap products reads its filter in place and is not packed), created as
// the call's threads will run it (Chunks: its first chunk single-threaded, or the whole
// problem on the team; oneDNN blocks a filter by the threads that share it: a 1x1 1024 -> 512
// at 14x14 is Acdb64a on the team and Acdb48a on one thread), with those post-ops (its filter
// layout may differ from the plain primitive's); a data gradient split into chunks of x's
// channels (decisions.h, SplitsChannels) in parts, one per chunk, each chunk's part of the
// filter in its chunk's primitive's layout (PackedParts). The header names all three (the
// chain as its ChainKey), so that the call creates the primitives the filter was packed for
// without a trial of its own; a call with another chain is an error (a filter packed without
// one is read by any chain's call). A call whose primitive wants another layout (another
// thread count than the pack saw) moves the packed filter to the caller's layout and on as an
// unpacked one, each call (Unpacked, where parts are involved): slower, never wrong; a
// header that does not match the call is an error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "descriptors.h"
#include "primitives.h"
#include "problem.h"

namespace jaxconv_onednn {

// The first 64 bytes of a packed filter.
struct PackedHeader {
  char magic[8];     // kPackedMagic
  int16_t where;     // the Activations its primitive is created on
  int16_t dtype;     // memory::data_type of the filter
  int16_t rank;      // of the filter buffer's shape
  int16_t kernel;    // Kernel::kForward or Kernel::kData
  int32_t chunks;    // the call's threading it was packed for (Chunks, decisions.h)
  uint32_t chain;    // the post-ops its primitive computes (ChainKey; 0: none)
  int64_t dims[5];   // the filter buffer's shape (the caller's layout, as filter_axes read it)
};
static_assert(sizeof(PackedHeader) == 64, "a packed filter's header is 64 bytes");
constexpr char kPackedMagic[8] = {'j', 'x', 'c', 'p', 'a', 'c', 'k', '3'};

// The calls that read a packed filter as it is, and those that reordered it (a primitive that
// wants another layout), for the tests (cache_stats).
extern std::atomic<int64_t> packed_reads, packed_reorders;

// The entry whose filter layout a filter packed for `p` (its problem as a call's handler
// builds it, the filter's dims included) on activations `where`, for a call of `chunks`
// (Chunks), has: with `p`'s post-ops where `chain` (packed for its chain), else without.
std::shared_ptr<Entry> PackedEntry(const Problem& p, Activations where, int64_t chunks,
                                   bool chain);

// The post-ops of `p` (composed, as its primitive computes them) as one number, never 0
// where there are any; 0 where there are none.
uint32_t ChainKey(const Problem& p);

// The parts a filter packed for `p` and `chunks` holds, one after another in the same layout:
// one per chunk of a call split by x's channels (SplitsChannels: each chunk's part of the
// filter, packed for its chunk's primitive), else one (the whole filter).
int64_t PackedParts(const Problem& p, int64_t chunks);

// The packed filter `w` of `p` (packed for `chunks`, each part in `layout`) in the caller's
// layout, in this thread's buffer: for a call whose chunks differ from the pack's where
// either splits x's channels (whose parts no other call's primitive reads).
void* Unpacked(const Problem& p, int64_t chunks, void* w, const memory::desc& layout);

// Reads the header of the packed filter `w` of `bytes` bytes into `p` (its filter dims and
// `packed`), `chunks` and `chain` (its ChainKey), and points `w` at the filter; "" where it
// is one for `p`'s kernel, dtype and rank, else why not.
std::string ReadPacked(Problem& p, void*& w, size_t bytes, int64_t* chunks, uint32_t* chain);

}  // namespace jaxconv_onednn
