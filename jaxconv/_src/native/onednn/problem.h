// A convolution problem as the FFI handlers receive it, and the cache's key for it.
//
// Each handler gets one kernel's two operands and result as dense row-major buffers in the
// caller's layout, and the problem as attributes:
//
//   data_axes    (N, C, X1..Xn): the buffer axis of each role, for every data tensor (x, y)
//   filter_axes  (O, I, X1..Xn): the buffer axis of the forward convolution's O role (all
//                out channels) and I role (in channels per group) in the filter buffer
//   strides, dilations (1 = none), pads_begin, pads_end: one per spatial axis
//   groups, op (the jaxconv op, for messages), threads (1: one device's shard, whole)
//
// A fused forward (jaxconv_onednn_fused) also has its post-ops: the element-wise chain that
// follows the convolution in the caller's program, computed on each output in oneDNN's
// registers before it is stored (docs/onednn.md, "Fused chains"). Each binary post-op reads
// the next of the call's further operands: a float32 vector of the output channels, or a
// tensor of y's shape and layout (a residual) in y's dtype or, beside a 16-bit y, in float32
// (a mixed-precision program's residual kept in float32).
//
// The rest of the handler reads this struct only. docs/onednn.md, "oneDNN itself as a
// lowering", says what the handler does with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace jaxconv_onednn {

using dnnl::memory;

enum class Kernel { kForward = 0, kData = 1, kWeight = 2 };

// A post-op: an element-wise function of the output (kEltwise: its algorithm's codes below,
// alpha and beta its parameters), or a binary one with the next operand (kChannel: one value
// per output channel; kTensor: one per output element, in y's dtype; kWideTensor: the same in
// float32).
enum class PostKind { kEltwise = 0, kChannel = 1, kTensor = 2, kWideTensor = 3 };
// kEltwise algorithms: relu, clip to [alpha, beta], tanh, logistic
enum class EltwiseAlg { kRelu = 0, kClip = 1, kTanh = 2, kLogistic = 3, kSwish = 4 };
// binary algorithms: output op operand; kMulRsqrt (channel only): output * rsqrt(operand +
// alpha), which the handler turns into a kMul by the computed vector (affine.h)
enum class BinaryAlg { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kMax = 4, kMin = 5, kMulRsqrt = 6 };

struct PostOp {
  PostKind kind = PostKind::kEltwise;
  int64_t alg = 0;  // an EltwiseAlg or a BinaryAlg
  float alpha = 0.0f, beta = 0.0f;
};

struct Problem {
  Kernel kernel = Kernel::kForward;
  memory::data_type dtype = memory::data_type::f32;
  int64_t groups = 1;
  std::vector<int64_t> x_dims, y_dims, w_dims;  // buffer shapes (x, y data; w filter)
  std::vector<int64_t> data_axes, filter_axes, strides, dilations, pads_begin, pads_end;
  int threads = 0;  // 1: created for one thread (a chunk on XLA's pool); 0: OpenMP's own
  std::vector<PostOp> post_ops;  // a fused forward's (none: a plain kernel)
  // A forward's filter packed ahead of its calls (packed.h): -1, the caller's filter layout;
  // else the Activations its primitive is created on, the filter already in its layout
  int packed = -1;

  // The cache's key: every field, each list after its length (a vector of integers: a
  // string built per call cost a fifth of a small call's time in the handler); `packed`
  // last, where it is set.
  using Key = std::vector<int64_t>;
  Key MakeKey() const;
};

struct KeyHash {
  size_t operator()(const Problem::Key& key) const;
};

// oneDNN's CPU engine (one per process).
dnnl::engine& Engine();

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims);
double Elements(const std::vector<int64_t>& dims);
size_t ElementSize(memory::data_type t);
// Multiply-adds: y's elements times the taps and input channels each one sums.
double Macs(const Problem& p);
// Whether a post-op reads an operand (a binary one).
bool Binary(const PostOp& op);
// Whether a post-op reads a tensor of y's shape (each chunk of the batch its own rows).
bool Tensor(const PostOp& op);

}  // namespace jaxconv_onednn
