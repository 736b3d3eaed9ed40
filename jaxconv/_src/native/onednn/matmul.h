// Dense matrix products on oneDNN's matmul primitive (jaxconv/_src/matmul.py): the result
// C (M x N) = op(A) op(B), row-major, where op reads an operand stored the other way round
// (a_transposed: A is stored K x M; b_transposed: B is stored N x K) through its strides, with
// no copy. Operands float32 or bfloat16; the result in their dtype or float32; oneDNN sums in
// float32. One primitive per shape and dtype, made on the first call and kept (at most
// kMatmulEntries; the least recently used goes first). A call runs on oneDNN's OpenMP team
// under RunMutex (threading.h), as a weight gradient does.
//
// A float32 product, and a bfloat16 one of a few rows (decisions.h, ProductOnPool), runs instead
// as parts of C's rows or columns on XLA's pool (ProductParts), each part on one thread reading
// its rows of A or columns of B in place: a serving batch's dense layer (one row, or a few)
// reads its weights once and is memory-bound, and one pool thread per part reads them at the
// cores' combined bandwidth without the team's hand-off (docs/onednn.md, "Matrix products").
#pragma once

#include <cstdint>

#include "problem.h"

namespace jaxconv_onednn {

struct MatmulShape {
  int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false, b_transposed = false;
  memory::data_type in = memory::data_type::f32, out = memory::data_type::f32;
  // a part's (ProductPart): the rows' steps of the whole matrices it reads and writes in
  // place (0: its own dense ones), and a primitive made and run on one thread
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool one_thread = false;
};

constexpr int kMatmulEntries = 64;

// C = op(A) op(B) of shape `s` on the caller's buffers; throws dnnl::error where oneDNN has no
// primitive for it.
void Matmul(const MatmulShape& s, const void* a, const void* b, void* c);

// Part `i` of `parts` of a product of shape `s` (ProductParts): its rows of C where s.m > s.n,
// else its columns (in multiples of kProductBlock), on the calling thread with its OpenMP
// thread count 1: float32 by oneDNN's sgemm, bfloat16 by a matmul primitive of the part's
// shape, each reading and writing its part of the matrices in place.
void ProductPart(const MatmulShape& s, const void* a, const void* b, void* c, int64_t i,
                 int64_t parts);

}  // namespace jaxconv_onednn
