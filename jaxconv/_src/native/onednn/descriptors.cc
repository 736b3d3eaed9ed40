// Memory descriptors (descriptors.h).
#include "descriptors.h"

namespace jaxconv_onednn {

memory::desc DataMd(const std::vector<int64_t>& dims, const std::vector<int64_t>& axes,
                    memory::data_type dtype) {
  auto st = RowMajorStrides(dims);
  memory::dims d, s;
  for (int64_t a : axes) {
    d.push_back(dims[a]);
    s.push_back(st[a]);
  }
  return memory::desc(d, dtype, s);
}

memory::desc FilterMd(const Problem& p) {
  auto st = RowMajorStrides(p.w_dims);
  const int64_t o = p.w_dims[p.filter_axes[0]], i = p.w_dims[p.filter_axes[1]];
  const int64_t so = st[p.filter_axes[0]], si = st[p.filter_axes[1]];
  memory::dims d, s;
  if (p.groups > 1) {
    d = {p.groups, o / p.groups, i};
    s = {so * (o / p.groups), so, si};
  } else {
    d = {o, i};
    s = {so, si};
  }
  for (size_t k = 2; k < p.filter_axes.size(); ++k) {
    d.push_back(p.w_dims[p.filter_axes[k]]);
    s.push_back(st[p.filter_axes[k]]);
  }
  return memory::desc(d, p.dtype, s);
}

memory::desc Blocked(const memory::desc& md) {
  using tag = memory::format_tag;
  const bool wide = dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core;
  switch (md.get_ndims()) {
    case 3: return memory::desc(md.get_dims(), md.get_data_type(), wide ? tag::nCw16c : tag::nCw8c);
    case 4: return memory::desc(md.get_dims(), md.get_data_type(), wide ? tag::nChw16c : tag::nChw8c);
    default:
      return memory::desc(md.get_dims(), md.get_data_type(), wide ? tag::nCdhw16c : tag::nCdhw8c);
  }
}

memory::desc Any(const memory::desc& md) {
  return memory::desc(md.get_dims(), md.get_data_type(), memory::format_tag::any);
}

memory::desc WithType(const memory::desc& md, memory::data_type dtype) {
  using tag = memory::format_tag;
  if (md.get_data_type() == dtype) return md;
  if (md.get_format_kind() == memory::format_kind::blocked && md.get_inner_nblks() == 0)
    return memory::desc(md.get_dims(), dtype, md.get_strides());
  static const tag blocked[3][3] = {{tag::nCw16c, tag::nCw8c, tag::nCw4c},
                                    {tag::nChw16c, tag::nChw8c, tag::nChw4c},
                                    {tag::nCdhw16c, tag::nCdhw8c, tag::nCdhw4c}};
  const int rank = md.get_ndims();
  if (rank >= 3 && rank <= 5)
    for (tag t : blocked[rank - 3])
      if (memory::desc(md.get_dims(), md.get_data_type(), t) == md)
        return memory::desc(md.get_dims(), dtype, t);
  throw dnnl::error(dnnl_unimplemented, "no such layout for another element type");
}

Blocking LayoutOf(const memory::desc& md) {
  Blocking b;
  const memory::dims dims = md.get_dims();
  b.dims.assign(dims.begin(), dims.end());
  const memory::data_type dt = md.get_data_type();
  b.element = dt == memory::data_type::f32 ? 4
              : dt == memory::data_type::bf16 || dt == memory::data_type::f16 ? 2 : 0;
  b.blocked = md.get_format_kind() == memory::format_kind::blocked;
  if (!b.blocked) return b;
  const memory::dims strides = md.get_strides(), padded = md.get_padded_dims();
  b.strides.assign(strides.begin(), strides.end());
  b.padded.assign(padded.begin(), padded.end());
  b.offset0 = md.get_submemory_offset() == 0;
  const int nblks = md.get_inner_nblks();
  if (nblks > 0) {
    const memory::dims idxs = md.get_inner_idxs(), blks = md.get_inner_blks();
    b.inner_idxs.assign(idxs.begin(), idxs.begin() + nblks);
    b.inner_blks.assign(blks.begin(), blks.begin() + nblks);
  }
  return b;
}

}  // namespace jaxconv_onednn
