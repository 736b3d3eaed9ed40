// Packed filters (packed.h), and the C function that packs one (jaxconv/_src/native/library.py).
#include "packed.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "affine.h"
#include "buffers.h"
#include "cache.h"
#include "decisions.h"
#include "execute.h"
#include "openmp.h"
#include "team.h"
#include "threading.h"
#include "trial.h"

namespace jaxconv_onednn {

std::atomic<int64_t> packed_reads{0}, packed_reorders{0};

namespace {

// `make` of the problem whose primitive a call of `chunks` runs for `p` on `where` reading its
// filter packed (its first chunk, created single-threaded as RunSingleThreaded creates a
// chunk's; or the whole problem, on the team), with `p`'s post-ops where `chain`.
template <typename Make>
std::shared_ptr<Entry> AsCalled(const Problem& p, Activations where, int64_t chunks, bool chain,
                                Make make) {
  RowSpan span;
  Problem q = chunks > 1 ? ChunkProblem(p, 0, chunks, &span) : p;
  if (!chain) q.post_ops.clear();
  q.threads = chunks == 0 ? 0 : 1;
  q.packed = static_cast<int>(where);
  if (q.threads == 0) return make(q);
  std::shared_ptr<Entry> e;
  WithOneOmpThread([&] { e = make(q); });
  return e;
}

}  // namespace

std::shared_ptr<Entry> PackedEntry(const Problem& p, Activations where, int64_t chunks,
                                   bool chain) {
  return AsCalled(p, where, chunks, chain, [](const Problem& q) { return TheCache().Get(q); });
}

uint32_t ChainKey(const Problem& p) {
  if (p.post_ops.empty()) return 0;
  uint32_t h = 2166136261u;  // FNV-1a over each post-op's fields
  auto mix = [&h](uint32_t v) {
    for (int i = 0; i < 4; ++i, v >>= 8) h = (h ^ (v & 0xffu)) * 16777619u;
  };
  for (const PostOp& op : p.post_ops) {
    uint32_t alpha, beta;
    std::memcpy(&alpha, &op.alpha, sizeof(alpha));
    std::memcpy(&beta, &op.beta, sizeof(beta));
    mix(static_cast<uint32_t>(op.kind));
    mix(static_cast<uint32_t>(op.alg));
    mix(alpha);
    mix(beta);
  }
  return h == 0 ? 1 : h;
}

int64_t PackedParts(const Problem& p, int64_t chunks) {
  return SplitsChannels(p) && chunks > 1 ? chunks : 1;
}

void* Unpacked(const Problem& p, int64_t chunks, void* w, const memory::desc& layout) {
  const std::shared_ptr<Entry> e =
      PackedEntry(p, static_cast<Activations>(p.packed), chunks, false);
  const int64_t parts = PackedParts(p, chunks);
  const size_t bytes = ElementSize(p.dtype);
  thread_local Buffer plain, part;
  void* whole = plain.Get(static_cast<size_t>(Elements(p.w_dims)) * bytes);
  dnnl::stream& s = Stream();
  const dnnl::reorder move(dnnl::reorder::primitive_desc(Engine(), layout, Engine(), e->user_w));
  for (int64_t i = 0; i < parts; ++i) {
    void* to_bytes = parts > 1 ? part.Get(e->user_w.get_size()) : whole;
    memory from(layout, Engine(), static_cast<char*>(w) + i * layout.get_size());
    memory to(e->user_w, Engine(), to_bytes);
    Exec(move, s, {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}});
    s.wait();
    if (parts > 1) {
      RowSpan span;
      ChunkProblem(p, i, chunks, &span);
      CopySlice(false, whole, to_bytes, p.w_dims, p.filter_axes[1], span.c_begin, span.c_end,
                bytes);
    }
  }
  ++packed_reorders;
  return whole;
}

namespace {

// The trial kept the tap products of data gradient `p` (`taps`: they read the filter in place,
// where its primitives moved it at every call). Packed, the primitive moves nothing: the first
// one on the layouts the trial's rule takes (the caller's, "any"'s, the blocked ones) not
// oneDNN's reference, packed for a call on the team, where it runs faster than the tap
// products (PackedWins); for chunks of x's channels, each chunk's (the tap products gather
// their part of the filter each call: DCGAN's 4x4 512 -> 256 at 4x4 in two chunks, 0.41-0.48
// ms a chunk as tap products, 0.22 on its part packed, 2-core Xeon); else null. A call split into chunks
// of rows keeps the tap products.
std::shared_ptr<Entry> OverTaps(const Problem& p, const std::shared_ptr<Entry>& taps,
                                int64_t chunks) {
  const bool parts = PackedParts(p, chunks) > 1;
  if (chunks != 0 && !parts) return nullptr;
  for (Activations where : {Activations::kCaller, Activations::kAny, Activations::kBlocked}) {
    std::shared_ptr<Entry> e;
    try {
      e = PackedEntry(p, where, chunks, false);
    } catch (const dnnl::error&) {  // no implementation there
      continue;
    }
    if (Reference(*e)) continue;
    return parts || PackedWins(p, e, taps) ? e : nullptr;
  }
  return nullptr;
}

// Forward `p` with the chain its call computes, `post` as the fused call's attributes give it:
// its leading affine run composed as the call composes it (affine.h; the vectors' values do
// not matter here, and a packed filter's run never folds).
Problem WithChain(const Problem& p, const std::vector<PostOp>& post) {
  Problem chain = p;
  chain.post_ops = post;
  chain.packed = 0;  // nothing folds
  std::vector<float> zeros(static_cast<size_t>(p.y_dims[p.data_axes[1]]), 0.0f);
  std::vector<void*> sides(post.size(), zeros.data());  // read only where a channel's
  void* w = nullptr;  // not read: nothing folds
  ComposeAffine(chain, w, sides);
  TrimAffine();
  return chain;
}

// The activations the filter of `chain` (WithChain) is packed on for a call of `chunks`: those
// the layout trial keeps for the chain itself (its candidates timed with their post-ops,
// oneDNN's reference left out: trial.h), not for the plain forward, whose layouts may compute
// the post-ops slowly or only with the reference (docs/onednn.md, "Packed filters"). Where
// the call's own primitive there (a chunk's, created single-threaded) is the reference, the
// first other layouts where it is not.
Activations ChainLayouts(const Problem& chain, int64_t chunks) {
  auto implemented = [&](Activations at) {
    try {
      // created, not cached: where it is the reference, no call runs it
      return !Reference(*AsCalled(chain, at, chunks, true, [at](const Problem& q) {
        return Create(q, at);
      }));
    } catch (const dnnl::error&) {  // no implementation there
      return false;
    }
  };
  Problem unpacked = chain;
  unpacked.packed = -1;
  Activations kept = TheCache().Get(unpacked)->where;
  if (kept == Activations::kCallerFilter) kept = Activations::kCaller;
  for (Activations at : {kept, Activations::kBlocked, Activations::kAny, Activations::kCaller})
    if (implemented(at)) return at;
  return kept;
}

}  // namespace

std::string ReadPacked(Problem& p, void*& w, size_t bytes, int64_t* chunks,
                       uint32_t* chain) {
  PackedHeader h;
  if (bytes < sizeof(h)) return "a packed filter must start with its 64-byte header";
  std::memcpy(&h, w, sizeof(h));
  if (std::memcmp(h.magic, kPackedMagic, sizeof(h.magic)) != 0)
    return "a uint8 filter must be one jaxconv packed (its header's magic differs)";
  if (h.dtype != static_cast<int32_t>(p.dtype))
    return "the packed filter's dtype differs from x's";
  if (h.rank != static_cast<int16_t>(p.x_dims.size()))
    return "the packed filter's rank differs from x's";
  if (h.kernel != static_cast<int16_t>(p.kernel))
    return std::string("the filter was packed for ") +
           (h.kernel == static_cast<int16_t>(Kernel::kForward) ? "a forward" : "a data gradient") +
           ", not this kernel";
  if (h.where < static_cast<int32_t>(Activations::kCaller) ||
      h.where > static_cast<int32_t>(Activations::kBlocked))
    return "the packed filter names unknown activation layouts";
  if (h.chunks < 0) return "the packed filter names a negative number of chunks";
  p.w_dims.assign(h.dims, h.dims + h.rank);
  p.packed = h.where;
  *chunks = h.chunks;
  *chain = h.chain;
  w = static_cast<char*>(w) + sizeof(h);
  return "";
}

}  // namespace jaxconv_onednn

using namespace jaxconv_onednn;  // NOLINT: the C functions below only

// The pool size the next packs assume (PoolThreads), until a call sees XLA's: for the tests.
extern "C" void jaxconv_onednn_see_pool_threads(int64_t threads) { SeePoolThreads(threads); }

// Packs filter `w` (`rank` axes of `w_dims`, in the caller's layout) for kernel `kernel` (0
// the forward, 1 the data gradient) of the problem given as a handler's attributes (problem.h;
// dtype 0 float32, 1 bfloat16, 2 float16), whose call computes the `posts` post-ops given as
// the fused call's attributes (none: a plain call), into `out`: its header, then the filter
// in its PackedEntry's layout. With `out` null it only returns the bytes needed. Returns
// those bytes, or -1 with the reason in `error`.
extern "C" int64_t jaxconv_onednn_pack_filter(
    int kernel, int dtype, int rank, const int64_t* x_dims, const int64_t* y_dims, const int64_t* w_dims,
    const int64_t* data_axes, const int64_t* filter_axes, const int64_t* strides,
    const int64_t* dilations, const int64_t* pads_begin, const int64_t* pads_end, int64_t groups,
    int64_t posts, const int64_t* post_kinds, const int64_t* post_algs, const float* post_alphas,
    const float* post_betas, const void* w, void* out, int64_t out_bytes, char* error,
    int64_t error_bytes) {
  auto fail = [&](const std::string& why) {
    if (error_bytes > 0) {
      const size_t n = std::min<size_t>(why.size(), static_cast<size_t>(error_bytes) - 1);
      std::memcpy(error, why.data(), n);
      error[n] = '\0';
    }
    return int64_t{-1};
  };
  static const memory::data_type kTypes[] = {memory::data_type::f32, memory::data_type::bf16,
                                             memory::data_type::f16};
  if (kernel < 0 || kernel > 1 || dtype < 0 || dtype > 2 || rank < 3 || rank > 5 || groups < 1)
    return fail("unknown kernel or dtype, a rank outside 3..5 or groups below 1");
  if (posts < 0 || (posts > 0 && kernel != 0))
    return fail("post-ops are a forward's, and never fewer than none");
  std::vector<PostOp> post(static_cast<size_t>(posts));
  for (int64_t i = 0; i < posts; ++i) {
    if (post_kinds[i] < 0 || post_kinds[i] > 3) return fail("unknown post-op kind");
    post[i] = PostOp{static_cast<PostKind>(post_kinds[i]), post_algs[i], post_alphas[i],
                     post_betas[i]};
  }
  Problem p;
  p.kernel = kernel == 0 ? Kernel::kForward : Kernel::kData;
  p.dtype = kTypes[dtype];
  p.groups = groups;
  p.x_dims.assign(x_dims, x_dims + rank);
  p.y_dims.assign(y_dims, y_dims + rank);
  p.w_dims.assign(w_dims, w_dims + rank);
  p.data_axes.assign(data_axes, data_axes + rank);
  p.filter_axes.assign(filter_axes, filter_axes + rank);
  p.strides.assign(strides, strides + rank - 2);
  p.dilations.assign(dilations, dilations + rank - 2);
  p.pads_begin.assign(pads_begin, pads_begin + rank - 2);
  p.pads_end.assign(pads_end, pads_end + rank - 2);
  int64_t written = -1;
  std::string why;
  try {
    // as a call's handler builds its problem (ffi_entry.cc), and on the team as it runs there:
    // the layout trial of the call's primitive (its chain's post-ops and all: packed.h) picks
    // the activations' layouts
    if (MergesPixels(p)) MergePixels(p);
    std::lock_guard<std::mutex> one_at_a_time(RunMutex());
    OnTeamThread([&] {
      const int64_t chunks = Chunks(p, PoolThreads(), Omp().ok());
      const Problem call = post.empty() ? p : WithChain(p, post);
      std::shared_ptr<Entry> kept;
      Activations where;
      if (post.empty()) {
        kept = TheCache().Get(p);
        where = kept->where == Activations::kCallerFilter ? Activations::kCaller : kept->where;
      } else {
        where = ChainLayouts(call, chunks);
      }
      std::shared_ptr<Entry> packed;
      if (where == Activations::kTaps) {
        packed = OverTaps(p, kept, chunks);
        if (packed == nullptr) {
          why = "its data gradient runs as tap products (which read the filter in place), "
                "faster than its primitive on the filter packed";
          return;
        }
        where = packed->where;
      } else {
        packed = PackedEntry(call, where, chunks, true);
      }
      const memory::desc layout = packed->prim_w;
      const int64_t parts = PackedParts(p, chunks);
      const int64_t need =
          static_cast<int64_t>(sizeof(PackedHeader) + parts * layout.get_size());
      if (out == nullptr) {
        written = need;
        return;
      }
      if (out_bytes != need) {
        why = "the output holds " + std::to_string(out_bytes) + " bytes, the packed filter " +
              std::to_string(need);
        return;
      }
      PackedHeader h{};
      std::memcpy(h.magic, kPackedMagic, sizeof(h.magic));
      h.where = static_cast<int16_t>(where);
      h.dtype = static_cast<int16_t>(p.dtype);
      h.rank = static_cast<int16_t>(rank);
      h.kernel = static_cast<int16_t>(p.kernel);
      h.chunks = static_cast<int32_t>(chunks);
      h.chain = ChainKey(call);
      std::copy(w_dims, w_dims + rank, h.dims);
      std::memcpy(out, &h, sizeof(h));
      // each part: the caller's filter (a chunk's part of it: gathered) into the layout
      const memory::desc user = packed->user_w;
      std::vector<uint8_t> part(parts > 1 ? user.get_size() : 0);
      dnnl::stream& s = Stream();
      const dnnl::reorder move(dnnl::reorder::primitive_desc(Engine(), user, Engine(), layout));
      for (int64_t i = 0; i < parts; ++i) {
        void* from_bytes = const_cast<void*>(w);
        if (parts > 1) {
          RowSpan span;
          ChunkProblem(p, i, chunks, &span);
          CopySlice(true, from_bytes, part.data(), p.w_dims, p.filter_axes[1], span.c_begin,
                    span.c_end, ElementSize(p.dtype));
          from_bytes = part.data();
        }
        memory from(user, Engine(), from_bytes);
        memory to(layout, Engine(),
                  static_cast<char*>(out) + sizeof(h) + i * layout.get_size());
        Exec(move, s, {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}});
        s.wait();
      }
      written = need;
    });
  } catch (const std::exception& ex) {
    return fail(ex.what());
  }
  return written < 0 ? fail(why) : written;
}
