// Dense matrix products on oneDNN's matmul primitive (matmul.h).
#include "matmul.h"

#include <algorithm>
#include <list>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "decisions.h"
#include "execute.h"
#include "threading.h"

namespace jaxconv_onednn {
namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int64_t, int64_t,
                       int64_t, bool>;

Key KeyOf(const MatmulShape& s) {
  return {s.m, s.n, s.k, s.a_transposed, s.b_transposed, static_cast<int>(s.in),
          static_cast<int>(s.out), s.lda, s.ldb, s.ldc, s.one_thread};
}

struct MatmulEntry {
  Key key;
  dnnl::matmul prim;
  memory::desc a, b, c, scratch;
};

// A row-major rows x cols matrix, or (transposed) one stored cols x rows; `ld`: the step of
// its stored rows (0: dense).
memory::desc MatrixMd(int64_t rows, int64_t cols, bool transposed, memory::data_type t,
                      int64_t ld = 0) {
  if (ld == 0) ld = transposed ? rows : cols;
  return memory::desc({rows, cols}, t, transposed ? memory::dims{1, ld} : memory::dims{ld, 1});
}

std::shared_ptr<const MatmulEntry> Create(const MatmulShape& s) {
  auto e = std::make_shared<MatmulEntry>();
  e->key = KeyOf(s);
  e->a = MatrixMd(s.m, s.k, s.a_transposed, s.in, s.lda);
  e->b = MatrixMd(s.k, s.n, s.b_transposed, s.in, s.ldb);
  e->c = MatrixMd(s.m, s.n, false, s.out, s.ldc);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto make = [&] {  // one thread's primitive where it runs on one
    dnnl::matmul::primitive_desc pd(Engine(), e->a, e->b, e->c, attr);
    e->scratch = pd.scratchpad_desc();
    e->prim = dnnl::matmul(pd);
  };
  if (s.one_thread)
    WithOneOmpThread(make);
  else
    make();
  return e;
}

// The kept primitives, most recently used first.
std::shared_ptr<const MatmulEntry> Get(const MatmulShape& s) {
  static std::mutex mu;
  static std::list<std::shared_ptr<const MatmulEntry>> kept;
  const Key key = KeyOf(s);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = kept.begin(); it != kept.end(); ++it)
      if ((*it)->key == key) {
        kept.splice(kept.begin(), kept, it);
        return kept.front();
      }
  }
  std::shared_ptr<const MatmulEntry> e = Create(s);  // outside the lock: it may take a while
  std::lock_guard<std::mutex> lock(mu);
  kept.push_front(e);
  if (kept.size() > kMatmulEntries) kept.pop_back();
  return e;
}

}  // namespace

void Matmul(const MatmulShape& s, const void* a, const void* b, void* c) {
  const std::shared_ptr<const MatmulEntry> e = Get(s);
  thread_local Buffer scratch;
  const dnnl::engine& engine = Engine();
  memory ma(e->a, engine, const_cast<void*>(a)), mb(e->b, engine, const_cast<void*>(b));
  memory mc(e->c, engine, c), ms(e->scratch, engine, scratch.Get(e->scratch.get_size()));
  const auto run = [&] {
    Exec(e->prim, Stream(), {{DNNL_ARG_SRC, ma.get()}, {DNNL_ARG_WEIGHTS, mb.get()},
                             {DNNL_ARG_DST, mc.get()}, {DNNL_ARG_SCRATCHPAD, ms.get()}});
  };
  if (s.one_thread)
    WithOneOmpThread(run);
  else
    run();
  scratch.Trim();
}

void ProductPart(const MatmulShape& s, const void* a, const void* b, void* c, int64_t i,
                 int64_t parts) {
  // [begin, end) of C's rows or columns, in whole blocks but for the last part's end
  const bool rows = s.m > s.n;
  const int64_t extent = rows ? s.m : s.n;
  const int64_t blocks = (extent + kProductBlock - 1) / kProductBlock;
  const int64_t begin = std::min(extent, blocks * i / parts * kProductBlock);
  const int64_t end = std::min(extent, blocks * (i + 1) / parts * kProductBlock);
  if (begin >= end) return;
  // row-major: A is M x K (lda K), or K x M transposed (lda M); B is K x N (ldb N), or N x K
  // transposed (ldb K); a part's rows of A (of C) start `begin` rows (or columns) in, and
  // its columns of B (of C) `begin` columns (or rows) in
  MatmulShape q = s;
  q.lda = s.a_transposed ? s.m : s.k;
  q.ldb = s.b_transposed ? s.k : s.n;
  q.ldc = s.n;
  q.one_thread = true;
  const size_t in = ElementSize(s.in), out = ElementSize(s.out);
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  char* pc = static_cast<char*>(c);
  if (rows) {
    pa += (s.a_transposed ? begin : begin * s.k) * in;
    pc += begin * s.n * out;
    q.m = end - begin;
  } else {
    pb += (s.b_transposed ? begin * s.k : begin) * in;
    pc += begin * out;
    q.n = end - begin;
  }
  if (s.in != memory::data_type::f32 || s.out != memory::data_type::f32) {
    Matmul(q, pa, pb, pc);
    return;
  }
  WithOneOmpThread([&] {
    const dnnl::status status = dnnl::sgemm(
        s.a_transposed ? 'T' : 'N', s.b_transposed ? 'T' : 'N', q.m, q.n, q.k, 1.0f,
        reinterpret_cast<const float*>(pa), q.lda, reinterpret_cast<const float*>(pb), q.ldb,
        0.0f, reinterpret_cast<float*>(pc), q.ldc);
    if (status != dnnl::status::success)
      throw dnnl::error(static_cast<dnnl_status_t>(status), "sgemm");
  });
}

}  // namespace jaxconv_onednn
