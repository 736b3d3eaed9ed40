// Executing a primitive on the caller's buffers (execute.h).
#include "execute.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

#include "filter_move.h"
#include "packed.h"
#include "taps.h"

namespace jaxconv_onednn {

dnnl::stream& Stream() {
  thread_local dnnl::stream s(Engine());
  return s;
}

void Exec(const dnnl::primitive& prim, dnnl::stream& s,
          std::initializer_list<dnnl_exec_arg_t> args) {
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(prim.get(), s.get(), static_cast<int>(args.size()), args.begin()),
      "could not execute a primitive");
}

namespace {

// Puts a spread data gradient's unit-stride result `grid` (dense, the caller's layout) on dx's
// grid from buffer axis `a` on: element i of an axis is the grid's i / spacing where the
// spacing divides i (within the grid), else zero. Every byte of dx is written once, each run
// of zeros by one memset, with ordinary stores: XLA's next operation reads dx from the cache
// (docs/onednn.md, "What the handler does").
template <typename T>
void SpreadCopy(const Entry& e, size_t a, const uint8_t* grid, uint8_t* dx) {
  const int64_t n = e.dx_dims[a], g = e.grid_dims[a], f = e.spacing[a];
  const int64_t ds = e.dx_strides[a], gs = e.grid_strides[a];
  if (a + 1 == e.dx_dims.size()) {  // the innermost axis: ds == gs == sizeof(T)
    if (f == 1) {
      std::memcpy(dx, grid, g * ds);
      std::memset(dx + g * ds, 0, (n - g) * ds);
      return;
    }
    T* out = reinterpret_cast<T*>(dx);
    const T* in = reinterpret_cast<const T*>(grid);
    std::memset(dx, 0, n * ds);
    for (int64_t t = 0; t < g; ++t) out[t * f] = in[t];
    return;
  }
  for (int64_t i = 0; i < n;) {
    if (i % f == 0 && i / f < g) {
      SpreadCopy<T>(e, a + 1, grid + (i / f) * gs, dx + i * ds);
      ++i;
      continue;
    }
    int64_t j = i + 1;  // the zeros up to the next grid point (or the end)
    while (j < n && !(j % f == 0 && j / f < g)) ++j;
    std::memset(dx + i * ds, 0, (j - i) * ds);
    i = j;
  }
}

}  // namespace

void Execute(const Entry& e, Kernel k, void* x, void* y, void* w,
             const std::vector<void*>& sides, const memory::desc* packed) {
  if (e.taps) {
    ExecuteTaps(e, x, y, w);
    return;
  }
  dnnl::stream& s = Stream();
  std::unique_ptr<Entry::Memories> m = e.Take();
  // this thread's own (no state shared between threads): reordered copies and the scratchpad
  thread_local Buffer bx, by, bw, bs, bg;
  thread_local std::vector<Buffer> bsides;  // a fused forward's tensors, where reordered
  const bool forward = k == Kernel::kForward, data = k == Kernel::kData;
  // The memory the primitive reads or writes: the caller's buffer where the primitive takes
  // its layout (the entry holds no reorder for it), else this thread's copy in the
  // primitive's layout, an input reordered into it first (the filter by `transpose` where
  // that plan is on).
  auto bind = [&](memory& user, memory& mine, void* buffer, const dnnl::reorder& r,
                  const memory::desc& want, Buffer& buf, bool input,
                  const FilterMove* transpose = nullptr) {
    user.set_data_handle(buffer);
    if (!r) return user.get();
    mine.set_data_handle(buf.Get(want.get_size()));
    if (input && transpose != nullptr && transpose->kind != MoveKind::kOff)
      RunFilterTranspose(*transpose, buffer, mine.get_data_handle());
    else if (input)
      Exec(r, s, {{DNNL_ARG_FROM, user.get()}, {DNNL_ARG_TO, mine.get()}});
    return mine.get();
  };
  const dnnl::reorder& rx = data ? e.from_x : e.to_x;
  const dnnl::reorder& ry = forward ? e.from_y : e.to_y;
  const dnnl::reorder& rw = k == Kernel::kWeight ? e.from_w : e.to_w;
  // a spread data gradient's unit-stride dx: in this thread's buffer, SpreadCopy puts it on x
  const bool spread = data && e.spread_bytes > 0;
  uint8_t* grid = spread ? bg.Get(e.user_x.get_size()) : nullptr;
  const dnnl_memory_t mx = bind(m->ux, m->mx, spread ? grid : x, rx, e.prim_x, bx, !data);
  const dnnl_memory_t my = bind(m->uy, m->my, y, ry, e.prim_y, by, !forward);
  dnnl_memory_t mw;
  if (packed == nullptr) {
    mw = bind(m->uw, m->mw, w, rw, e.prim_w, bw, k != Kernel::kWeight, &e.w_transpose);
  } else if (*packed == e.prim_w) {  // the packed filter is the primitive's: read as it is
    ++packed_reads;
    m->mw.set_data_handle(w);
    mw = m->mw.get();
  } else {  // another layout: to the caller's, then on as an unpacked filter (packed.h)
    ++packed_reorders;
    thread_local Buffer bu;
    void* plain = bu.Get(e.user_w.get_size());
    memory from(*packed, Engine(), w), to(e.user_w, Engine(), plain);
    Exec(dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), *packed, Engine(), e.user_w)),
         s, {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}});
    mw = bind(m->uw, m->mw, plain, rw, e.prim_w, bw, true, &e.w_transpose);
  }
  m->scratch.set_data_handle(bs.Get(e.scratch.get_size() + 1));
  const dnnl_memory_t scratch = m->scratch.get();
  // the output, reordered back into the caller's buffer where it was computed in a copy
  auto back = [&](const dnnl::reorder& r, const memory& mine, const memory& user) {
    if (r) Exec(r, s, {{DNNL_ARG_FROM, mine.get()}, {DNNL_ARG_TO, user.get()}});
  };
  if (forward && !e.sides.empty()) {  // a fused forward: each post-op's operand too
    if (sides.size() != e.sides.size())
      throw std::invalid_argument("a fused forward's post-op operands do not match its post-ops");
    std::vector<dnnl_exec_arg_t> args = {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, mw},
                                         {DNNL_ARG_DST, my}, {DNNL_ARG_SCRATCHPAD, scratch}};
    // a tensor the primitive reads in its output's layout: reordered into this thread's copy
    if (bsides.size() < sides.size()) bsides.resize(sides.size());
    for (size_t i = 0; i < sides.size(); ++i) {
      if (e.to_sides[i]) {
        m->user_sides[i].set_data_handle(sides[i]);
        m->sides[i].set_data_handle(bsides[i].Get(e.sides[i].get_size()));
        Exec(e.to_sides[i], s,
             {{DNNL_ARG_FROM, m->user_sides[i].get()}, {DNNL_ARG_TO, m->sides[i].get()}});
      } else {
        m->sides[i].set_data_handle(sides[i]);
      }
      args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(e.side_post_op[i]) | DNNL_ARG_SRC_1,
                      m->sides[i].get()});
    }
    dnnl::error::wrap_c_api(dnnl_primitive_execute(e.prim.get(), s.get(),
                                                   static_cast<int>(args.size()), args.data()),
                            "could not execute a primitive");
    back(ry, m->my, m->uy);
  } else if (forward) {
    Exec(e.prim, s, {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, my},
                     {DNNL_ARG_SCRATCHPAD, scratch}});
    back(ry, m->my, m->uy);
  } else if (data) {
    Exec(e.prim, s, {{DNNL_ARG_DIFF_DST, my}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DIFF_SRC, mx},
                     {DNNL_ARG_SCRATCHPAD, scratch}});
    back(rx, m->mx, m->ux);
    if (spread) {
      s.wait();
      auto* out = static_cast<uint8_t*>(x);
      if (ElementSize(e.prim_x.get_data_type()) == 4) SpreadCopy<uint32_t>(e, 0, grid, out);
      else SpreadCopy<uint16_t>(e, 0, grid, out);
    }
  } else {
    Exec(e.prim, s, {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DIFF_DST, my}, {DNNL_ARG_DIFF_WEIGHTS, mw},
                     {DNNL_ARG_SCRATCHPAD, scratch}});
    if (e.w_copy.kind != MoveKind::kOff) {
      s.wait();
      RunFilterCopy(e.w_copy, m->mw.get_data_handle(), w);
    } else {
      back(rw, m->mw, m->uw);
    }
  }
  s.wait();
  e.Give(std::move(m));
  for (Buffer* b : {&bx, &by, &bw, &bs, &bg}) b->Trim();
  for (Buffer& b : bsides) b.Trim();
}

}  // namespace jaxconv_onednn
