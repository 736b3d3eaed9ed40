// Primitives and their reorders (primitives.h).
#include "primitives.h"

#include <algorithm>
#include <stdexcept>

#include "filter_move.h"
#include "taps.h"

namespace jaxconv_onednn {

std::unique_ptr<Entry::Memories> Entry::Take() const {
  {
    std::lock_guard<std::mutex> lock(pool_mu);
    if (!pool.empty()) {
      std::unique_ptr<Memories> m = std::move(pool.back());
      pool.pop_back();
      return m;
    }
  }
  auto m = std::make_unique<Memories>();
  auto make = [](const memory::desc& md) { return memory(md, Engine(), nullptr); };
  m->ux = make(user_x); m->uy = make(user_y); m->uw = make(user_w);
  m->mx = make(prim_x); m->my = make(prim_y); m->mw = make(prim_w);
  m->scratch = make(scratch);
  for (const memory::desc& md : sides) m->sides.push_back(make(md));
  for (const memory::desc& md : user_sides) m->user_sides.push_back(make(md));
  return m;
}

void Entry::Give(std::unique_ptr<Memories> m) const {
  std::lock_guard<std::mutex> lock(pool_mu);
  pool.push_back(std::move(m));
}

namespace {

dnnl::primitive_attr Attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // each thread's own (execute.cc)
  return attr;
}

memory::dims Dims(const std::vector<int64_t>& v) { return memory::dims(v.begin(), v.end()); }

dnnl::reorder Reorder(const memory::desc& from, const memory::desc& to) {
  if (from == to) return dnnl::reorder();
  return dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

// A fused forward's post-ops (problem.h) as oneDNN's, each binary one's operand descriptor kept
// in `e` (sides, as the primitive reads it; user_sides, as the caller passes it): a channel
// vector as (1, C, 1...) float32, a tensor as y in the caller's layout (in float32 for a
// kWideTensor), or as the primitive reads it in `y_layout`'s layout where given.
dnnl::post_ops PostOps(const Problem& p, Entry& e, const memory::desc* y_layout = nullptr) {
  e.sides.clear();
  e.side_post_op.clear();
  e.user_sides.clear();
  static const dnnl::algorithm eltwise[] = {
      dnnl::algorithm::eltwise_relu, dnnl::algorithm::eltwise_clip,
      dnnl::algorithm::eltwise_tanh, dnnl::algorithm::eltwise_logistic,
      dnnl::algorithm::eltwise_swish};  // swish: x * logistic(alpha * x), alpha 1 (SiLU)
  static const dnnl::algorithm binary[] = {
      dnnl::algorithm::binary_add, dnnl::algorithm::binary_sub, dnnl::algorithm::binary_mul,
      dnnl::algorithm::binary_div, dnnl::algorithm::binary_max, dnnl::algorithm::binary_min};
  dnnl::post_ops po;
  for (size_t i = 0; i < p.post_ops.size(); ++i) {
    const PostOp& op = p.post_ops[i];
    // (a mul_rsqrt, BinaryAlg 6, is a mul by its computed vector by now: affine.h)
    const int64_t n = op.kind == PostKind::kEltwise ? 5 : 6;
    if (op.alg < 0 || op.alg >= n) throw std::invalid_argument("unknown post-op algorithm");
    if (op.kind == PostKind::kEltwise) {
      const bool swish = static_cast<EltwiseAlg>(op.alg) == EltwiseAlg::kSwish;
      po.append_eltwise(eltwise[op.alg], swish ? 1.0f : op.alpha, op.beta);
      continue;
    }
    memory::desc md = op.kind == PostKind::kWideTensor
                          ? DataMd(p.y_dims, p.data_axes, memory::data_type::f32)
                          : e.user_y;
    if (op.kind == PostKind::kChannel) {
      memory::dims dims(p.y_dims.size(), 1);
      dims[1] = p.y_dims[p.data_axes[1]];
      md = memory::desc(dims, memory::data_type::f32, Dims(RowMajorStrides(dims)));
    }
    const memory::desc read = Tensor(op) && y_layout != nullptr
                                  ? WithType(*y_layout, md.get_data_type()) : md;
    po.append_binary(binary[op.alg], read);
    e.sides.push_back(read);
    e.side_post_op.push_back(static_cast<int>(i));
    e.user_sides.push_back(md);
  }
  return po;
}

// The unit-stride problem of a spread one: dx on the grid, O^rank per example.
Problem Unit(const Problem& p) {
  Problem u = p;
  for (size_t i = 0; i < p.strides.size(); ++i) {
    const int64_t axis = p.data_axes[i + 2];
    u.x_dims[axis] = p.y_dims[axis];
    u.strides[i] = 1;
    u.pads_end[i] = 0;
  }
  return u;
}

// The reorders of the entry's kernel: its inputs into the primitive's layouts, its output
// back (a spread data gradient's into the caller's layout of its unit-stride problem).
std::shared_ptr<Entry> WithReorders(std::shared_ptr<Entry> e, const Problem& spread) {
  const Kernel k = spread.kernel;
  e->on_callers = e->prim_x == e->user_x && e->prim_y == e->user_y;
  if (Spread(spread)) {  // the unit-stride dx (in the caller's layout) goes onto dx's grid
    const size_t es = ElementSize(spread.dtype);
    e->spread_bytes = static_cast<size_t>(Elements(spread.x_dims)) * es;
    e->dx_dims = spread.x_dims;
    e->grid_dims = Unit(spread).x_dims;
    e->dx_strides = RowMajorStrides(e->dx_dims);
    e->grid_strides = RowMajorStrides(e->grid_dims);
    e->spacing.assign(e->dx_dims.size(), 1);
    for (size_t a = 0; a < e->dx_dims.size(); ++a) {
      e->dx_strides[a] *= static_cast<int64_t>(es);
      e->grid_strides[a] *= static_cast<int64_t>(es);
    }
    for (size_t i = 0; i < spread.strides.size(); ++i)
      e->spacing[spread.data_axes[i + 2]] = spread.strides[i];
  }
  if (k == Kernel::kData) e->from_x = Reorder(e->prim_x, e->user_x);
  else e->to_x = Reorder(e->user_x, e->prim_x);
  if (k == Kernel::kForward) e->from_y = Reorder(e->prim_y, e->user_y);
  else e->to_y = Reorder(e->user_y, e->prim_y);
  if (k == Kernel::kWeight) {
    e->from_w = Reorder(e->prim_w, e->user_w);
    if (e->from_w) e->w_copy = PlanFilterCopy(e->prim_w, e->user_w);
  } else {
    e->to_w = Reorder(e->user_w, e->prim_w);
    const size_t min_bytes = ElementSize(e->user_w.get_data_type()) == 2
                                 ? kFilterTransposeMinBytes2 : kFilterTransposeMinBytes;
    if (e->to_w && e->user_w.get_size() >= min_bytes)
      e->w_transpose = PlanFilterTranspose(e->user_w, e->prim_w);
  }
  return e;
}

}  // namespace

// A strided 1x1 data gradient without pads_begin writes dx only at x = t*S (t < O along each
// axis), zeros between: it is the unit-stride 1x1 data gradient, a product of matrices, whose
// results SpreadCopy puts S apart into dx with the zeros, in the same call (docs/onednn.md,
// "What the handler does").
bool Spread(const Problem& p) {
  if (p.kernel != Kernel::kData) return false;
  bool strided = false;
  for (size_t i = 0; i < p.strides.size(); ++i) {
    const int64_t in = p.x_dims[p.data_axes[i + 2]], out = p.y_dims[p.data_axes[i + 2]];
    if (p.w_dims[p.filter_axes[i + 2]] != 1 || p.pads_begin[i] != 0 ||
        (out - 1) * p.strides[i] > in - 1)
      return false;
    strided |= p.strides[i] > 1;
  }
  return strided;
}

bool Reference(const Entry& e) { return e.impl.rfind("ref", 0) == 0; }

std::shared_ptr<Entry> Create(const Problem& spread, Activations where) {
  if (where == Activations::kTaps) return CreateTaps(spread);
  const Problem p = Spread(spread) ? Unit(spread) : spread;  // the problem the primitive computes
  auto e = std::make_shared<Entry>();
  e->where = where;
  e->user_x = DataMd(p.x_dims, p.data_axes, p.dtype);
  e->user_y = DataMd(p.y_dims, p.data_axes, p.dtype);
  e->user_w = FilterMd(p);
  memory::dims dil;
  for (int64_t d : p.dilations) dil.push_back(d - 1);  // oneDNN: 0 = no dilation
  const auto st = Dims(p.strides), pb = Dims(p.pads_begin), pe = Dims(p.pads_end);
  auto place = [where](const memory::desc& md) {
    return where == Activations::kCaller || where == Activations::kCallerFilter ? md
           : where == Activations::kAny  ? Any(md)
                                         : Blocked(md);
  };
  const auto x = place(e->user_x), y = place(e->user_y);
  const auto w = where == Activations::kCallerFilter ? e->user_w : Any(e->user_w);
  const auto algo = dnnl::algorithm::convolution_direct;
  auto attr = Attr();
  // A tensor operand is read in the output's layout: oneDNN 3.2 takes one in the caller's
  // layout beside an output in another (blocked, or the plain channels-first one "any" picks
  // for its gemm kernel) and reads it as if in the output's, a residual added to other outputs
  // (docs/onednn.md, "Fused chains"). Where the output's layout is not the caller's, each call
  // reorders the operand into it (execute.cc).
  const bool tensors = std::any_of(p.post_ops.begin(), p.post_ops.end(), Tensor);
  if (!p.post_ops.empty()) {
    if (p.kernel != Kernel::kForward) throw std::invalid_argument("post-ops on a gradient");
    attr.set_post_ops(PostOps(p, *e, tensors && where == Activations::kBlocked ? &y : nullptr));
  }
  if (p.kernel == Kernel::kForward) {
    dnnl::convolution_forward::primitive_desc pd(Engine(), dnnl::prop_kind::forward_training,
                                                 algo, x, w, y, st, dil, pb, pe, attr);
    if (tensors && where == Activations::kAny && pd.dst_desc() != e->user_y) {
      const memory::desc chosen = pd.dst_desc();  // "any"'s, now the operands' too
      attr.set_post_ops(PostOps(p, *e, &chosen));
      pd = dnnl::convolution_forward::primitive_desc(
          Engine(), dnnl::prop_kind::forward_training, algo, x, w, chosen, st, dil, pb, pe, attr);
    }
    e->to_sides.clear();
    for (size_t i = 0; i < e->sides.size(); ++i)
      e->to_sides.push_back(Reorder(e->user_sides[i], e->sides[i]));
    e->prim = dnnl::convolution_forward(pd);
    e->prim_x = pd.src_desc(); e->prim_w = pd.weights_desc(); e->prim_y = pd.dst_desc();
    e->scratch = pd.scratchpad_desc(); e->impl = pd.impl_info_str();
    return WithReorders(e, spread);
  }
  dnnl::convolution_forward::primitive_desc hint(Engine(), dnnl::prop_kind::forward_training,
                                                 algo, x, w, y, st, dil, pb, pe);
  if (p.kernel == Kernel::kData) {
    dnnl::convolution_backward_data::primitive_desc pd(Engine(), algo, x, w, y, st, dil, pb, pe,
                                                       hint, attr);
    e->prim = dnnl::convolution_backward_data(pd);
    e->prim_x = pd.diff_src_desc(); e->prim_w = pd.weights_desc(); e->prim_y = pd.diff_dst_desc();
    e->scratch = pd.scratchpad_desc(); e->impl = pd.impl_info_str();
    return WithReorders(e, spread);
  }
  dnnl::convolution_backward_weights::primitive_desc pd(Engine(), algo, x, w, y, st, dil, pb,
                                                        pe, hint, attr);
  e->prim = dnnl::convolution_backward_weights(pd);
  e->prim_x = pd.src_desc(); e->prim_w = pd.diff_weights_desc(); e->prim_y = pd.diff_dst_desc();
  e->scratch = pd.scratchpad_desc(); e->impl = pd.impl_info_str();
  return WithReorders(e, spread);
}

}  // namespace jaxconv_onednn
