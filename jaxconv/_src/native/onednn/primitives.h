// One oneDNN primitive for a problem and an activation layout, with the reorders between the
// caller's layouts and its own, made once and cached (cache.h).
//
// Rules (docs/onednn.md, "What the handler does"):
// - oneDNN picks its own weight format; the filter is reordered in (or, for a weight gradient,
//   out) by oneDNN, or by jaxconv's own move where its plan applies (filter_move.h);
// - the reorders and the memory objects a call points at its buffers are made once per entry;
// - a strided 1x1 data gradient without pads_begin is computed as its unit-stride problem and
//   spread onto dx's grid by the handler (Spread, execute.h's SpreadCopy).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "decisions.h"
#include "descriptors.h"
#include "problem.h"

namespace jaxconv_onednn {

struct Entry {
  dnnl::primitive prim;
  memory::desc user_x, user_y, user_w;  // the caller's buffers
  memory::desc prim_x, prim_y, prim_w, scratch;
  // a fused forward's binary post-op operands, in order (problem.h), as the primitive reads
  // them, each one's position among the post-ops, as the caller passes them, and the reorder
  // from the caller's into the primitive's (a tensor's, where the primitive's output is in
  // another layout than the caller's: empty where they agree)
  std::vector<memory::desc> sides;
  std::vector<int> side_post_op;
  std::vector<memory::desc> user_sides;
  std::vector<dnnl::reorder> to_sides;
  // reorders between the caller's layouts and the primitive's (empty where they agree)
  dnnl::reorder to_x, to_y, to_w, from_x, from_y, from_w;
  FilterMove w_transpose;  // in place of to_w where it applies
  FilterMove w_copy;       // in place of from_w where it applies
  std::string impl;
  // A tap-products entry (taps.h), not a convolution primitive: its problem, and the matmul's
  // descriptors (dy's pixels, the filter's taps in place, the products); null otherwise.
  std::shared_ptr<const Problem> taps;
  memory::desc taps_src, taps_wei, taps_dst;
  bool on_callers = false;  // the primitive reads and writes the caller's activation layouts
  Activations where = Activations::kCaller;  // the activation layouts it was created for
  // What the trial decided, for choices(): see trial.h.
  std::string choice;
  // A spread data gradient: dx's bytes (0 otherwise), and for SpreadCopy dx's and the grid's
  // buffer shapes and byte strides, and the grid's spacing along each buffer axis.
  size_t spread_bytes = 0;
  std::vector<int64_t> dx_dims, dx_strides, grid_dims, grid_strides, spacing;

  // The memory objects of one call (the caller's buffers, the primitive's copies, the
  // scratchpad), pointed at each call's buffers. A call takes a set from the pool and puts it
  // back, so there are as many sets as calls of this entry ever ran at once.
  struct Memories {
    memory ux, uy, uw, mx, my, mw, scratch;
    std::vector<memory> sides, user_sides;
  };
  std::unique_ptr<Memories> Take() const;
  void Give(std::unique_ptr<Memories> m) const;

 private:
  mutable std::mutex pool_mu;
  mutable std::vector<std::unique_ptr<Memories>> pool;
};

// Whether `p` is a data gradient computed as its unit-stride problem and spread onto dx.
bool Spread(const Problem& p);

// The primitive of `p` on activations `where`; throws dnnl::error where oneDNN has none.
std::shared_ptr<Entry> Create(const Problem& p, Activations where);

// Whether `e` is oneDNN's reference implementation ("ref:...", its plain loop nest): a
// candidate only where nothing else implements the problem (trial.h).
bool Reference(const Entry& e);

}  // namespace jaxconv_onednn
