// jaxconv's oneDNN lowering: the XLA FFI handlers of the three kernels of a convolution
// problem (jaxconv_onednn_forward, _data, _weight; registered by lowering/onednn.py), of a
// forward with its element-wise chain fused (jaxconv_onednn_fused; lowering/fused.py), and of
// the Winograd lowering's two (jaxconv_winograd_forward, _weight; lowering/winograd.py),
// and of dense matrix products (jaxconv_onednn_matmul; jaxconv/_src/matmul.py); a max pool's is
// in ffi_max_pool.cc.
//
// Each validates its attributes, builds the Problem (problem.h), decides the call's threading
// once (decisions.h, Chunks) and runs it (threading.h, execute.h). Every error becomes an
// ffi::Error whose message starts with the op's name, which XLA raises in Python: the process
// never aborts (an unsupported configuration, an allocation failure).
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "affine.h"
#include "cache.h"
#include "decisions.h"
#include "execute.h"
#include "guarded.h"
#include "matmul.h"
#include "openmp.h"
#include "packed.h"
#include "problem.h"
#include "team.h"
#include "threading.h"
#include "winograd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxconv_onednn {
namespace {

std::vector<int64_t> ToVector(ffi::Span<const int64_t> s) {
  return std::vector<int64_t>(s.begin(), s.end());
}

std::vector<int64_t> Shape(const ffi::AnyBuffer& b) { return ToVector(b.dimensions()); }

// oneDNN's data type of an FFI dtype; undef for the dtypes the lowering does not take.
memory::data_type DataType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return memory::data_type::f32;
    case ffi::DataType::BF16: return memory::data_type::bf16;
    case ffi::DataType::F16: return memory::data_type::f16;
    default: return memory::data_type::undef;
  }
}

// Runs kernel `k` with operands (a, b) -> out; which of x, y, w each is depends on k.
ffi::Error Run(Kernel k, std::string_view op, ffi::AnyBuffer a, ffi::AnyBuffer b,
               ffi::Result<ffi::AnyBuffer> out, ffi::Span<const int64_t> data_axes,
               ffi::Span<const int64_t> filter_axes, ffi::Span<const int64_t> strides,
               ffi::Span<const int64_t> dilations, ffi::Span<const int64_t> pads_begin,
               ffi::Span<const int64_t> pads_end, int64_t groups, int64_t threads,
               ffi::ThreadPool pool, const std::vector<void*>& sides = {},
               std::vector<PostOp> post = {}) {
  const std::string prefix = std::string(op) + ": oneDNN lowering: ";
  const memory::data_type dtype = DataType(a.element_type());
  // a forward's or a data gradient's filter packed ahead of its calls: uint8, its header
  // first (packed.h)
  const bool packed = k != Kernel::kWeight && b.element_type() == ffi::DataType::U8;
  if (dtype == memory::data_type::undef || (b.element_type() != a.element_type() && !packed) ||
      out->element_type() != a.element_type())
    return ffi::Error::InvalidArgument(prefix + "operands and result must share one dtype "
                                       "of f32, bf16, f16");
  Problem p;
  p.kernel = k;
  p.dtype = dtype;
  p.groups = groups;
  void *x, *y, *w;
  if (k == Kernel::kForward) {
    p.x_dims = Shape(a); p.w_dims = Shape(b); p.y_dims = Shape(*out);
    x = a.untyped_data(); w = b.untyped_data(); y = out->untyped_data();
  } else if (k == Kernel::kData) {
    p.y_dims = Shape(a); p.w_dims = Shape(b); p.x_dims = Shape(*out);
    y = a.untyped_data(); w = b.untyped_data(); x = out->untyped_data();
  } else {
    p.x_dims = Shape(a); p.y_dims = Shape(b); p.w_dims = Shape(*out);
    x = a.untyped_data(); y = b.untyped_data(); w = out->untyped_data();
  }
  p.data_axes = ToVector(data_axes);
  p.filter_axes = ToVector(filter_axes);
  p.strides = ToVector(strides);
  p.dilations = ToVector(dilations);
  p.pads_begin = ToVector(pads_begin);
  p.pads_end = ToVector(pads_end);
  p.post_ops = std::move(post);
  int64_t packed_chunks = 0;
  uint32_t packed_chain = 0;
  if (packed) {
    const std::string bad = ReadPacked(p, w, b.size_bytes(), &packed_chunks, &packed_chain);
    if (!bad.empty()) return ffi::Error::InvalidArgument(prefix + bad);
  }
  const size_t rank = p.x_dims.size();
  if (rank < 3 || rank > 5 || p.y_dims.size() != rank || p.w_dims.size() != rank ||
      p.data_axes.size() != rank || p.filter_axes.size() != rank ||
      p.strides.size() != rank - 2 || p.dilations.size() != rank - 2 ||
      p.pads_begin.size() != rank - 2 || p.pads_end.size() != rank - 2 || groups < 1)
    return ffi::Error::InvalidArgument(prefix + "inconsistent ranks or attributes");
  for (size_t i = 0; i < rank; ++i)
    if (p.data_axes[i] < 0 || p.data_axes[i] >= static_cast<int64_t>(rank) ||
        p.filter_axes[i] < 0 || p.filter_axes[i] >= static_cast<int64_t>(rank))
      return ffi::Error::InvalidArgument(prefix + "axis out of range");
  return Guarded(prefix, [&] {
    // a fused forward's leading channel-wise affine run, composed (folded into the filter
    // where it folds): affine.h
    std::vector<void*> operands = sides;
    ComposeAffine(p, w, operands);
    if (MergesPixels(p)) MergePixels(p);  // its pixels one axis: rows split evenly
    memory::desc layout;  // a packed filter's (packed.h)
    if (packed) {
      // packed for this call's chain (its primitive's filter layout), or for none (the plain
      // primitive's); for another chain the bytes' layout is unknown here
      if (packed_chain != 0 && packed_chain != ChainKey(p))
        throw std::invalid_argument("the filter was packed for another chain of post-ops");
      layout = PackedEntry(p, static_cast<Activations>(p.packed), packed_chunks,
                           packed_chain != 0)->prim_w;
      if (PackedParts(p, packed_chunks) * layout.get_size() + sizeof(PackedHeader) !=
          b.size_bytes())
        throw std::invalid_argument("the packed filter's size differs from its layout's");
    }
    const memory::desc* in = packed ? &layout : nullptr;
    // threads 1: one device's shard of a program split across several devices of this
    // process, each running its own call at the same time: whole, on the calling thread
    const int64_t pool_threads = PlannedPoolThreads(pool.num_threads());
    SeePoolThreads(pool_threads);
    const int64_t chunks = threads == 1 ? 1 : Chunks(p, pool_threads, Omp().ok());
    // packed in parts for chunks of x's channels, or whole for a call that splits them:
    // the caller's layout, each call (slower, never wrong: packed.h)
    if (packed && chunks != packed_chunks &&
        (PackedParts(p, packed_chunks) > 1 || PackedParts(p, chunks) > 1)) {
      w = Unpacked(p, packed_chunks, w, layout);
      in = nullptr;
    }
    if (chunks == 1) {  // whole, on the calling thread: no job to share with the pool
      RunSingleThreaded(p, x, y, w, operands, in);
    } else if (chunks > 1) {
      std::lock_guard<std::mutex> one_at_a_time(RunMutex());
      RunOnPool(p, chunks, pool, x, y, w, operands, in);
    } else {  // on the team (its first call's trial too)
      std::lock_guard<std::mutex> one_at_a_time(RunMutex());
      OnTeamThread([&] { Execute(*TheCache().Get(p), k, x, y, w, operands, in); });
    }
    TrimAffine();
  });
}

#define JAXCONV_ONEDNN_HANDLER(NAME, KERNEL)                                                \
  ffi::Error NAME##Impl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out, \
                        std::string_view op, ffi::Span<const int64_t> data_axes,            \
                        ffi::Span<const int64_t> filter_axes,                               \
                        ffi::Span<const int64_t> strides, ffi::Span<const int64_t> dilations,\
                        ffi::Span<const int64_t> pads_begin,                                \
                        ffi::Span<const int64_t> pads_end, int64_t groups, int64_t threads, \
                        ffi::ThreadPool pool) {                                             \
    return Run(KERNEL, op, a, b, out, data_axes, filter_axes, strides, dilations,           \
               pads_begin, pads_end, groups, threads, pool);                                \
  }

JAXCONV_ONEDNN_HANDLER(Forward, Kernel::kForward)
JAXCONV_ONEDNN_HANDLER(Data, Kernel::kData)
JAXCONV_ONEDNN_HANDLER(Weight, Kernel::kWeight)

// A forward with its post-ops (problem.h): x, the filter (or the filter packed: uint8, its
// header first, packed.h), then one operand per binary post-op (a float32 vector of y's
// channels, or a tensor of y's shape, in y's dtype or float32), in order.
ffi::Error FusedImpl(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::RemainingArgs rest,
                     ffi::Result<ffi::AnyBuffer> out, std::string_view op,
                     ffi::Span<const int64_t> data_axes, ffi::Span<const int64_t> filter_axes,
                     ffi::Span<const int64_t> strides, ffi::Span<const int64_t> dilations,
                     ffi::Span<const int64_t> pads_begin, ffi::Span<const int64_t> pads_end,
                     int64_t groups, int64_t threads, ffi::Span<const int64_t> post_kinds,
                     ffi::Span<const int64_t> post_algs, ffi::Span<const float> post_alphas,
                     ffi::Span<const float> post_betas, ffi::ThreadPool pool) {
  const std::string prefix = std::string(op) + ": oneDNN lowering: ";
  const size_t n = post_kinds.size();
  if (post_algs.size() != n || post_alphas.size() != n || post_betas.size() != n)
    return ffi::Error::InvalidArgument(prefix + "post-op attributes of different lengths");
  const auto y_dims = out->dimensions();
  if (data_axes.size() != y_dims.size() || data_axes[1] < 0 ||
      data_axes[1] >= static_cast<int64_t>(y_dims.size()))
    return ffi::Error::InvalidArgument(prefix + "inconsistent ranks or attributes");
  const int64_t channels = y_dims[data_axes[1]];
  std::vector<PostOp> post(n);
  std::vector<void*> sides;
  for (size_t i = 0; i < n; ++i) {
    if (post_kinds[i] < 0 || post_kinds[i] > 3)
      return ffi::Error::InvalidArgument(prefix + "unknown post-op kind");
    post[i] = PostOp{static_cast<PostKind>(post_kinds[i]), post_algs[i], post_alphas[i],
                     post_betas[i]};
    if (!Binary(post[i])) continue;
    if (sides.size() >= rest.size())
      return ffi::Error::InvalidArgument(prefix + "fewer post-op operands than binary post-ops");
    auto side = rest.get<ffi::AnyBuffer>(sides.size());
    if (!side.has_value()) return side.error();
    const bool channel = post[i].kind == PostKind::kChannel;
    const bool wide = post[i].kind == PostKind::kWideTensor;
    const bool ok = channel ? side->element_type() == ffi::DataType::F32 &&
                                  static_cast<int64_t>(side->element_count()) == channels
                            : side->element_type() == (wide ? ffi::DataType::F32
                                                             : out->element_type()) &&
                                  ToVector(side->dimensions()) == ToVector(y_dims);
    if (!ok)
      return ffi::Error::InvalidArgument(
          prefix + (channel ? "a channel post-op operand must be float32 with y's channels"
                    : wide  ? "a wide tensor post-op operand must be float32 of y's shape"
                            : "a tensor post-op operand must have y's shape and dtype"));
    sides.push_back(side->untyped_data());
  }
  if (sides.size() != rest.size())
    return ffi::Error::InvalidArgument(prefix + "more post-op operands than binary post-ops");
  return Run(Kernel::kForward, op, x, w, out, data_axes, filter_axes, strides, dilations,
             pads_begin, pads_end, groups, threads, pool, sides, std::move(post));
}


// Winograd's F(m x m, 3 x 3) (winograd.h): the forward, y from x and the filter, its passes
// as parts on XLA's pool, and the weight gradient, dW from x and dy, on the OpenMP team
// (decisions.h, WinogradOnPool); float32 or bfloat16, x and y NHWC, the filter through its
// view.
ffi::Error RunWinograd(bool weight, std::string_view op, ffi::AnyBuffer a, ffi::AnyBuffer b,
                       ffi::Result<ffi::AnyBuffer> out, int64_t m, int64_t pad_top,
                       int64_t pad_left, ffi::Span<const int64_t> filter,
                       ffi::ThreadPool pool) {
  const std::string prefix = std::string(op) + ": winograd lowering: ";
  const ffi::DataType t = a.element_type();
  if ((t != ffi::DataType::F32 && t != ffi::DataType::BF16) || b.element_type() != t ||
      out->element_type() != t)
    return ffi::Error::InvalidArgument(prefix + "operands and result must share one dtype "
                                       "of f32, bf16");
  const auto x = a.dimensions();
  const auto y = weight ? b.dimensions() : out->dimensions();  // N x OH x OW x K
  if (x.size() != 4 || y.size() != 4 || filter.size() != 5)
    return ffi::Error::InvalidArgument(prefix + "operands or attributes of the wrong rank");
  WinogradShape s;
  s.n = x[0]; s.h = x[1]; s.w = x[2]; s.c = x[3];
  s.oh = y[1]; s.ow = y[2]; s.k = y[3];
  s.m = static_cast<int>(m);
  s.pad_top = pad_top; s.pad_left = pad_left;
  s.bf16 = t == ffi::DataType::BF16;
  s.filter = {filter[0], filter[1], filter[2], filter[3], filter[4]};
  s.filter_elements = static_cast<int64_t>(weight ? out->element_count() : b.element_count());
  const std::string bad = y[0] == s.n ? s.Invalid() : "x and y differ in their batch";
  if (!bad.empty()) return ffi::Error::InvalidArgument(prefix + bad);
  return Guarded(prefix, [&] {
    std::lock_guard<std::mutex> one_at_a_time(RunMutex());
    const auto run = [&] {
      if (weight) WinogradWeight(s, a.untyped_data(), b.untyped_data(), out->untyped_data());
      else WinogradForward(s, a.untyped_data(), b.untyped_data(), out->untyped_data());
    };
    if (!WinogradRunsOnPool(weight)) return OnTeamThread(run);
    ++winograd_pool_calls;  // its passes as parts on XLA's pool (openmp.h, PoolInstead)
    const PoolInstead parts{PlannedPoolThreads(pool.num_threads()),
                            [&pool](int64_t k, const std::function<void(int64_t)>& part) {
                              RunParts(k, pool, part);
                            }};
    OnPoolInstead on_pool(parts);
    run();
  });
}

#define JAXCONV_WINOGRAD_HANDLER(NAME, WEIGHT)                                              \
  ffi::Error NAME##Impl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,  \
                        std::string_view op, int64_t m, int64_t pad_top, int64_t pad_left,  \
                        ffi::Span<const int64_t> filter, ffi::ThreadPool pool) {            \
    return RunWinograd(WEIGHT, op, a, b, out, m, pad_top, pad_left, filter, pool);          \
  }

JAXCONV_WINOGRAD_HANDLER(WinogradForward, false)
JAXCONV_WINOGRAD_HANDLER(WinogradWeight, true)

// C = op(A) op(B) (matmul.h): a is M x K (K x M where a_transposed), b is K x N (N x K where
// b_transposed), out M x N; a and b float32 or bfloat16, out theirs or float32. A float32
// product, and a bfloat16 one of a few rows, runs as parts on XLA's pool (ProductOnPool,
// ProductParts), another on the team.
ffi::Error MatmulImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,
                      std::string_view op, bool a_transposed, bool b_transposed,
                      ffi::ThreadPool pool) {
  const std::string prefix = std::string(op) + ": oneDNN matmul: ";
  const ffi::DataType t = a.element_type(), r = out->element_type();
  if ((t != ffi::DataType::F32 && t != ffi::DataType::BF16) || b.element_type() != t ||
      (r != t && r != ffi::DataType::F32))
    return ffi::Error::InvalidArgument(prefix + "operands must share one dtype of f32, bf16, "
                                       "and the result be theirs or f32");
  const auto ad = a.dimensions(), bd = b.dimensions(), cd = out->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || cd.size() != 2)
    return ffi::Error::InvalidArgument(prefix + "operands and result must be matrices");
  MatmulShape s;
  s.m = cd[0]; s.n = cd[1];
  s.k = a_transposed ? ad[0] : ad[1];
  s.a_transposed = a_transposed; s.b_transposed = b_transposed;
  s.in = DataType(t); s.out = DataType(r);
  if ((a_transposed ? ad[1] : ad[0]) != s.m || (b_transposed ? bd[1] : bd[0]) != s.k ||
      (b_transposed ? bd[0] : bd[1]) != s.n)
    return ffi::Error::InvalidArgument(prefix + "operand shapes do not multiply to the result's");
  if (s.m == 0 || s.n == 0) return ffi::Error::Success();
  if (s.k == 0) {
    std::memset(out->untyped_data(), 0, out->size_bytes());
    return ffi::Error::Success();
  }
  return Guarded(prefix, [&] {
    if (ProductOnPool(s.m, s.n, t == ffi::DataType::F32)) {
      const void *pa = a.untyped_data(), *pb = b.untyped_data();
      void* pc = out->untyped_data();
      const int64_t parts = ProductParts(s.m, s.n, s.k, ElementSize(s.in),
                                         PlannedPoolThreads(pool.num_threads()));
      if (parts == 1) return ProductPart(s, pa, pb, pc, 0, 1);
      std::lock_guard<std::mutex> one_at_a_time(RunMutex());
      RunParts(parts, pool, [&](int64_t i) { ProductPart(s, pa, pb, pc, i, parts); });
      return;
    }
    std::lock_guard<std::mutex> one_at_a_time(RunMutex());
    OnTeamThread([&] { Matmul(s, a.untyped_data(), b.untyped_data(), out->untyped_data()); });
  });
}

}  // namespace
}  // namespace jaxconv_onednn

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxconv_onednn_matmul, jaxconv_onednn::MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("op")
                                  .Attr<bool>("a_transposed")
                                  .Attr<bool>("b_transposed")
                                  .Ctx<ffi::ThreadPool>());

#define JAXCONV_ONEDNN_BIND(SYMBOL, NAME)                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SYMBOL, jaxconv_onednn::NAME##Impl,                     \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::AnyBuffer>()                              \
                                    .Arg<ffi::AnyBuffer>()                              \
                                    .Ret<ffi::AnyBuffer>()                              \
                                    .Attr<std::string_view>("op")                       \
                                    .Attr<ffi::Span<const int64_t>>("data_axes")        \
                                    .Attr<ffi::Span<const int64_t>>("filter_axes")      \
                                    .Attr<ffi::Span<const int64_t>>("strides")          \
                                    .Attr<ffi::Span<const int64_t>>("dilations")        \
                                    .Attr<ffi::Span<const int64_t>>("pads_begin")       \
                                    .Attr<ffi::Span<const int64_t>>("pads_end")         \
                                    .Attr<int64_t>("groups")                            \
                                    .Attr<int64_t>("threads")                           \
                                    .Ctx<ffi::ThreadPool>());

JAXCONV_ONEDNN_BIND(jaxconv_onednn_forward, Forward)
JAXCONV_ONEDNN_BIND(jaxconv_onednn_data, Data)
JAXCONV_ONEDNN_BIND(jaxconv_onednn_weight, Weight)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxconv_onednn_fused, jaxconv_onednn::FusedImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("op")
                                  .Attr<ffi::Span<const int64_t>>("data_axes")
                                  .Attr<ffi::Span<const int64_t>>("filter_axes")
                                  .Attr<ffi::Span<const int64_t>>("strides")
                                  .Attr<ffi::Span<const int64_t>>("dilations")
                                  .Attr<ffi::Span<const int64_t>>("pads_begin")
                                  .Attr<ffi::Span<const int64_t>>("pads_end")
                                  .Attr<int64_t>("groups")
                                  .Attr<int64_t>("threads")
                                  .Attr<ffi::Span<const int64_t>>("post_kinds")
                                  .Attr<ffi::Span<const int64_t>>("post_algs")
                                  .Attr<ffi::Span<const float>>("post_alphas")
                                  .Attr<ffi::Span<const float>>("post_betas")
                                  .Ctx<ffi::ThreadPool>());

#define JAXCONV_WINOGRAD_BIND(SYMBOL, NAME)                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SYMBOL, jaxconv_onednn::NAME##Impl,                     \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::AnyBuffer>()                       \
                                    .Arg<ffi::AnyBuffer>()                       \
                                    .Ret<ffi::AnyBuffer>()                       \
                                    .Attr<std::string_view>("op")                       \
                                    .Attr<int64_t>("m")                                 \
                                    .Attr<int64_t>("pad_top")                           \
                                    .Attr<int64_t>("pad_left")                          \
                                    .Attr<ffi::Span<const int64_t>>("filter")           \
                                    .Ctx<ffi::ThreadPool>());

JAXCONV_WINOGRAD_BIND(jaxconv_winograd_forward, WinogradForward)
JAXCONV_WINOGRAD_BIND(jaxconv_winograd_weight, WinogradWeight)
