// The problem's key, hash and sizes (problem.h).
#include "problem.h"

#include <cstring>

namespace jaxconv_onednn {

Problem::Key Problem::MakeKey() const {
  Key key{threads, static_cast<int64_t>(kernel), static_cast<int64_t>(dtype), groups};
  key.reserve(4 + 9 * (1 + x_dims.size()));
  for (const auto* v : {&x_dims, &y_dims, &w_dims, &data_axes, &filter_axes, &strides,
                        &dilations, &pads_begin, &pads_end}) {
    key.push_back(static_cast<int64_t>(v->size()));
    key.insert(key.end(), v->begin(), v->end());
  }
  key.push_back(static_cast<int64_t>(post_ops.size()));
  for (const PostOp& op : post_ops) {
    uint32_t a, b;
    std::memcpy(&a, &op.alpha, sizeof(a));
    std::memcpy(&b, &op.beta, sizeof(b));
    key.insert(key.end(), {static_cast<int64_t>(op.kind), op.alg, a, b});
  }
  if (packed >= 0) key.push_back(packed);
  return key;
}

bool Binary(const PostOp& op) { return op.kind != PostKind::kEltwise; }

bool Tensor(const PostOp& op) {
  return op.kind == PostKind::kTensor || op.kind == PostKind::kWideTensor;
}

size_t KeyHash::operator()(const Problem::Key& key) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  for (int64_t v : key) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  return static_cast<size_t>(h);
}

dnnl::engine& Engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

double Elements(const std::vector<int64_t>& dims) {
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>(d);
  return n;
}

size_t ElementSize(memory::data_type t) { return t == memory::data_type::f32 ? 4 : 2; }

double Macs(const Problem& p) {
  const double o = static_cast<double>(p.w_dims[p.filter_axes[0]]);
  return Elements(p.y_dims) / o * Elements(p.w_dims);
}

}  // namespace jaxconv_onednn
