// A fused forward's channel-wise affine run, composed (affine.h).
#include "affine.h"

#include <cmath>
#include <cstdint>

#include "buffers.h"
#include "decisions.h"

namespace jaxconv_onednn {
namespace {

// The calling thread's composed vectors and scaled filter.
Buffer& Vectors() {
  static thread_local Buffer b;
  return b;
}
Buffer& Filter() {
  static thread_local Buffer b;
  return b;
}

}  // namespace

void TrimAffine() {
  Vectors().Trim();
  Filter().Trim();
}

void ComposeAffine(Problem& p, void*& w, std::vector<void*>& sides) {
  if (p.post_ops.empty()) return;
  const AffineRun run = LeadingAffine(p);
  const bool compose = run.multiplies || run.length > 1;
  size_t later = 0;  // mul_rsqrt post-ops after the run
  for (size_t i = run.length; i < p.post_ops.size(); ++i)
    later += p.post_ops[i].kind == PostKind::kChannel &&
             static_cast<BinaryAlg>(p.post_ops[i].alg) == BinaryAlg::kMulRsqrt;
  if (!compose && later == 0) return;
  const int64_t c = p.y_dims[p.data_axes[1]];
  float* a = Vectors().Floats((2 + later) * c);
  float* b = a + c;
  float* next = b + c;  // the later mul_rsqrt's vectors
  std::vector<PostOp> post;
  std::vector<void*> operands;
  if (compose) {
    for (int64_t o = 0; o < c; ++o) a[o] = 1.0f, b[o] = 0.0f;
    for (size_t i = 0; i < run.length; ++i) {
      const PostOp& op = p.post_ops[i];
      const float* v = static_cast<const float*>(sides[i]);
      switch (static_cast<BinaryAlg>(op.alg)) {
        case BinaryAlg::kAdd:
          for (int64_t o = 0; o < c; ++o) b[o] += v[o];
          break;
        case BinaryAlg::kSub:
          for (int64_t o = 0; o < c; ++o) b[o] -= v[o];
          break;
        case BinaryAlg::kMul:
          for (int64_t o = 0; o < c; ++o) a[o] *= v[o], b[o] *= v[o];
          break;
        default:  // kMulRsqrt
          for (int64_t o = 0; o < c; ++o) {
            const float r = 1.0f / std::sqrt(v[o] + op.alpha);
            a[o] *= r, b[o] *= r;
          }
      }
    }
    if (run.multiplies && !run.folds) {
      post.push_back(PostOp{PostKind::kChannel, static_cast<int64_t>(BinaryAlg::kMul)});
      operands.push_back(a);
    }
    post.push_back(PostOp{PostKind::kChannel, static_cast<int64_t>(BinaryAlg::kAdd)});
    operands.push_back(b);
  }
  const size_t first = compose ? run.length : 0;
  size_t side = first;  // the run's ops are all binary: their operands are sides[0, first)
  for (size_t i = first; i < p.post_ops.size(); ++i) {
    PostOp op = p.post_ops[i];
    if (!Binary(op)) {
      post.push_back(op);
      continue;
    }
    void* v = sides[side++];
    if (op.kind == PostKind::kChannel &&
        static_cast<BinaryAlg>(op.alg) == BinaryAlg::kMulRsqrt) {
      const float* in = static_cast<const float*>(v);
      for (int64_t o = 0; o < c; ++o) next[o] = 1.0f / std::sqrt(in[o] + op.alpha);
      v = next;
      next += c;
      op = PostOp{PostKind::kChannel, static_cast<int64_t>(BinaryAlg::kMul)};
    }
    post.push_back(op);
    operands.push_back(v);
  }
  if (compose && run.folds) {  // W * a along W's O axis, into this thread's copy
    const size_t axis = static_cast<size_t>(p.filter_axes[0]);
    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < p.w_dims.size(); ++d) {
      if (d < axis) outer *= p.w_dims[d];
      if (d > axis) inner *= p.w_dims[d];
    }
    float* scaled = Filter().Floats(static_cast<size_t>(outer * c * inner));
    const float* in = static_cast<const float*>(w);
    for (int64_t i = 0, k = 0; i < outer; ++i)
      for (int64_t o = 0; o < c; ++o)
        for (int64_t j = 0; j < inner; ++j, ++k) scaled[k] = in[k] * a[o];
    w = scaled;
  }
  p.post_ops = std::move(post);
  sides = std::move(operands);
}

}  // namespace jaxconv_onednn
