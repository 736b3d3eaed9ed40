// Dense matrix products on oneDNN's matmul primitive (jaxconv/_src/matmul.py): the result
// C (M x N) = op(A) op(B), row-major, where op reads an operand stored the other way round
// (a_transposed: A is stored K x M; b_transposed: B is stored N x K) through its strides, with
// no copy. Operands float32 or bfloat16; the result in their dtype or float32; oneDNN sums in
// float32. One primitive per shape and dtype, made on the first call and kept (at most
// kMatmulEntries; the least recently used goes first). A call runs on oneDNN's OpenMP team
// under RunMutex (threading.h), as a weight gradient does.
#pragma once

#include <cstdint>

#include "problem.h"

namespace jaxconv_onednn {

struct MatmulShape {
  int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false, b_transposed = false;
  memory::data_type in = memory::data_type::f32, out = memory::data_type::f32;
};

constexpr int kMatmulEntries = 64;

// C = op(A) op(B) of shape `s` on the caller's buffers; throws dnnl::error where oneDNN has no
// primitive for it.
void Matmul(const MatmulShape& s, const void* a, const void* b, void* c);

}  // namespace jaxconv_onednn
