// The XLA FFI handler of a max pool's forward with its argmax (jaxconv_max_pool; registered by
// native/library.py, called by lowering/max_pool.py): validates its operands and attributes and
// runs the pool (pooling/max_pool.h) whole on the calling thread or in parts of its output rows
// on XLA's pool (threading.h, RunParts).
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "guarded.h"
#include "max_pool.h"
#include "threading.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxconv_onednn {
namespace {

// y and arg (int8) of a 2D max pool of x, all NHWC (max_pool.h): x and y float32 or bfloat16;
// `window`, `strides` and `pads` (top, left) two each, the output's size its own. In parts of
// its output rows on XLA's pool (PoolParts).
ffi::Error MaxPoolImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::AnyBuffer> arg, std::string_view op,
                       ffi::Span<const int64_t> window, ffi::Span<const int64_t> strides,
                       ffi::Span<const int64_t> pads, ffi::ThreadPool pool) {
  const std::string prefix = std::string(op) + ": handler max pool: ";
  const ffi::DataType t = x.element_type();
  if ((t != ffi::DataType::F32 && t != ffi::DataType::BF16) || y->element_type() != t ||
      arg->element_type() != ffi::DataType::S8)
    return ffi::Error::InvalidArgument(prefix + "x and y must share one dtype of f32, bf16, "
                                       "and arg be s8");
  const auto xd = x.dimensions(), yd = y->dimensions(), ad = arg->dimensions();
  if (xd.size() != 4 || yd.size() != 4 || ad.size() != 4 || window.size() != 2 ||
      strides.size() != 2 || pads.size() != 2)
    return ffi::Error::InvalidArgument(prefix + "x, y and arg must have rank 4 (NHWC), and "
                                       "window, strides and pads two values each");
  PoolShape s;
  s.n = xd[0]; s.h = xd[1]; s.w = xd[2]; s.c = xd[3]; s.oh = yd[1]; s.ow = yd[2];
  s.kh = window[0]; s.kw = window[1]; s.sh = strides[0]; s.sw = strides[1];
  s.pad_top = pads[0]; s.pad_left = pads[1]; s.bfloat16 = t == ffi::DataType::BF16;
  for (size_t i = 0; i < 4; ++i)
    if (ad[i] != yd[i])
      return ffi::Error::InvalidArgument(prefix + "arg must have y's shape");
  if (yd[0] != s.n || yd[3] != s.c || s.kh < 1 || s.kw < 1 || s.kh * s.kw > 127 || s.sh < 1 ||
      s.sw < 1)
    return ffi::Error::InvalidArgument(prefix + "y must have x's batch and channels, the "
                                       "window at most 127 taps, strides positive");
  if (s.n * s.oh * s.ow * s.c == 0) return ffi::Error::Success();
  return Guarded(prefix, [&] {
    const void* px = x.untyped_data();
    void* py = y->untyped_data();
    int8_t* pa = static_cast<int8_t*>(arg->untyped_data());
    const int64_t rows = s.n * s.oh;
    const int64_t parts = PoolParts(s, PlannedPoolThreads(pool.num_threads()));
    if (parts == 1) return MaxPoolRows(s, px, py, pa, 0, rows);
    std::lock_guard<std::mutex> one_at_a_time(RunMutex());
    RunParts(parts, pool, [&](int64_t i) {
      MaxPoolRows(s, px, py, pa, rows * i / parts, rows * (i + 1) / parts);
    });
  });
}

}  // namespace
}  // namespace jaxconv_onednn

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxconv_max_pool, jaxconv_onednn::MaxPoolImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("op")
                                  .Attr<ffi::Span<const int64_t>>("window")
                                  .Attr<ffi::Span<const int64_t>>("strides")
                                  .Attr<ffi::Span<const int64_t>>("pads")
                                  .Ctx<ffi::ThreadPool>());

