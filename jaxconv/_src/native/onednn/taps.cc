// Tap products (taps.h).
#include "taps.h"

#include <cstring>

#include "buffers.h"
#include "decisions.h"
#include "execute.h"
#include "openmp.h"

namespace jaxconv_onednn {
namespace {

// The problem with three spatial axes (those it lacks of size 1).
struct Geometry {
  int64_t n = 1, ic = 1, oc = 1;
  int64_t xs[3] = {1, 1, 1}, ys[3] = {1, 1, 1}, ks[3] = {1, 1, 1};
  int64_t s[3] = {1, 1, 1}, pb[3] = {0, 0, 0}, d[3] = {1, 1, 1};
};

Geometry GeometryOf(const Problem& p) {
  Geometry g;
  const size_t r = p.x_dims.size() - 2;
  g.n = p.x_dims[0];
  g.ic = p.x_dims.back();
  g.oc = p.y_dims.back();
  for (size_t a = 0; a < r; ++a) {
    g.xs[a] = p.x_dims[a + 1];
    g.ys[a] = p.y_dims[a + 1];
    g.ks[a] = p.w_dims[p.filter_axes[a + 2]];
    g.s[a] = p.strides[a];
    g.pb[a] = p.pads_begin[a];
    g.d[a] = p.dilations[a];
  }
  return g;
}

// y's position i along axis a that tap k places at x's position o, or -1.
inline int64_t Source(const Geometry& g, int a, int64_t o, int64_t k) {
  const int64_t num = o + g.pb[a] - k * g.d[a];
  if (num < 0 || num % g.s[a] != 0) return -1;
  const int64_t i = num / g.s[a];
  return i < g.ys[a] ? i : -1;
}

// dx's rows [first, end) of (n, first spatial axis): zeroed, then each tap's products that
// land on them added.
void PlaceRows(const Geometry& g, const float* t, float* dx, int64_t first, int64_t end) {
  const int64_t m = g.n * g.ys[0] * g.ys[1] * g.ys[2];  // rows of each tap's products
  const int64_t row = g.xs[1] * g.xs[2] * g.ic;
  std::memset(dx + first * row, 0, (end - first) * row * sizeof(float));
  for (int64_t r = first; r < end; ++r) {
    const int64_t b = r / g.xs[0], o0 = r % g.xs[0];
    float* out = dx + r * row;
    for (int64_t k0 = 0; k0 < g.ks[0]; ++k0) {
      const int64_t i0 = Source(g, 0, o0, k0);
      if (i0 < 0) continue;
      for (int64_t k1 = 0; k1 < g.ks[1]; ++k1)
        for (int64_t o1 = 0; o1 < g.xs[1]; ++o1) {
          const int64_t i1 = Source(g, 1, o1, k1);
          if (i1 < 0) continue;
          for (int64_t k2 = 0; k2 < g.ks[2]; ++k2)
            for (int64_t o2 = 0; o2 < g.xs[2]; ++o2) {
              const int64_t i2 = Source(g, 2, o2, k2);
              if (i2 < 0) continue;
              const int64_t tap = (k0 * g.ks[1] + k1) * g.ks[2] + k2;
              const int64_t pixel = ((b * g.ys[0] + i0) * g.ys[1] + i1) * g.ys[2] + i2;
              const float* in = t + (tap * m + pixel) * g.ic;
              float* to = out + (o1 * g.xs[2] + o2) * g.ic;
              for (int64_t c = 0; c < g.ic; ++c) to[c] += in[c];
            }
        }
    }
  }
}

}  // namespace

std::shared_ptr<Entry> CreateTaps(const Problem& p) {
  if (!TapsApply(p)) throw dnnl::error(dnnl_unimplemented, "no tap products for this problem");
  const Geometry g = GeometryOf(p);
  const int64_t taps = g.ks[0] * g.ks[1] * g.ks[2];
  const int64_t m = g.n * g.ys[0] * g.ys[1] * g.ys[2];
  const std::vector<int64_t> st = RowMajorStrides(p.w_dims);
  const auto f32 = memory::data_type::f32;
  auto e = std::make_shared<Entry>();
  e->where = Activations::kTaps;
  e->user_x = DataMd(p.x_dims, p.data_axes, p.dtype);
  e->user_y = DataMd(p.y_dims, p.data_axes, p.dtype);
  e->user_w = FilterMd(p);
  e->prim_x = e->user_x, e->prim_y = e->user_y, e->prim_w = e->user_w;  // read in place
  e->on_callers = true;
  e->taps_src = memory::desc({1, m, g.oc}, f32, memory::dims{m * g.oc, g.oc, 1});
  e->taps_wei = memory::desc({taps, g.oc, g.ic}, f32,
                             memory::dims{st[p.filter_axes.back()], st[p.filter_axes[0]],
                                          st[p.filter_axes[1]]});
  e->taps_dst = memory::desc({taps, m, g.ic}, f32, memory::format_tag::abc);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(Engine(), e->taps_src, e->taps_wei, e->taps_dst, attr);
  const std::string impl = pd.impl_info_str();
  if (impl.rfind("ref", 0) == 0)
    throw dnnl::error(dnnl_unimplemented, "only oneDNN's reference matmul for these taps");
  e->prim = dnnl::matmul(pd);
  e->scratch = pd.scratchpad_desc();
  e->impl = "taps:" + impl;
  e->taps = std::make_shared<const Problem>(p);
  return e;
}

void ExecuteTaps(const Entry& e, void* x, const void* y, const void* w) {
  thread_local Buffer products, scratchpad;
  const Geometry g = GeometryOf(*e.taps);
  float* t = reinterpret_cast<float*>(products.Get(e.taps_dst.get_size()));
  const dnnl::engine& engine = Engine();
  memory src(e.taps_src, engine, const_cast<void*>(y)), wei(e.taps_wei, engine, const_cast<void*>(w));
  memory dst(e.taps_dst, engine, t), scratch(e.scratch, engine, scratchpad.Get(e.scratch.get_size() + 1));
  dnnl::stream& s = Stream();
  Exec(e.prim, s, {{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_WEIGHTS, wei.get()},
                   {DNNL_ARG_DST, dst.get()}, {DNNL_ARG_SCRATCHPAD, scratch.get()}});
  s.wait();
  float* dx = static_cast<float*>(x);
  OnTeam(g.n * g.xs[0], [&](int64_t first, int64_t end) { PlaceRows(g, t, dx, first, end); },
         e.taps->threads != 1);
  products.Trim();
  scratchpad.Trim();
}

}  // namespace jaxconv_onednn
