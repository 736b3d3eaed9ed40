// The handlers' one way to report a failure: what a call's body throws becomes an ffi::Error
// whose message starts with the op's name (XLA raises it in Python; the process never aborts).
#pragma once

#include <exception>
#include <new>
#include <string>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace jaxconv_onednn {

// Runs `body` and turns what it throws into an ffi::Error whose message starts with `prefix`.
template <typename Body>
xla::ffi::Error Guarded(const std::string& prefix, const Body& body) {
  try {
    body();
  } catch (const dnnl::error& ex) {
    return xla::ffi::Error::Internal(prefix + ex.what() + " (status " +
                                     std::to_string(static_cast<int>(ex.status)) + ")");
  } catch (const std::bad_alloc&) {
    return xla::ffi::Error(xla::ffi::ErrorCode::kResourceExhausted, prefix + "out of memory");
  } catch (const std::exception& ex) {
    return xla::ffi::Error::Internal(prefix + ex.what());
  }
  return xla::ffi::Error::Success();
}

}  // namespace jaxconv_onednn
