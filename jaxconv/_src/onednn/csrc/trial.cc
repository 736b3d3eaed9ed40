// The layout trial (trial.h).
#include "trial.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <vector>

#include "decisions.h"
#include "execute.h"

namespace jaxconv_onednn {

std::atomic<int64_t> reference_skipped{0}, reference_trials{0};

namespace {

bool Reference(const Entry& e) { return e.impl.rfind("ref", 0) == 0; }

double Seconds(const Entry& e, Kernel k, void* x, void* y, void* w) {
  const auto t0 = std::chrono::steady_clock::now();
  Execute(e, k, x, y, w);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::shared_ptr<Entry> RecordChoice(const Problem& p,
                                    const std::vector<std::shared_ptr<Entry>>& found,
                                    const std::vector<double>& best,
                                    const std::vector<bool>& racing, size_t kept) {
  static const char* const kernels[] = {"forward", "data", "weight"};
  static const char* const wheres[] = {"caller", "any", "blocked"};
  std::ostringstream out;
  auto list = [&out](const std::vector<int64_t>& v) {
    for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
    out << '\t';
  };
  out << kernels[static_cast<int>(p.kernel)] << '\t';
  for (const auto* v : {&p.x_dims, &p.y_dims, &p.w_dims, &p.strides, &p.dilations}) list(*v);
  out << p.groups << '\t' << (p.threads == 1 ? "single" : "openmp");
  std::vector<size_t> order{kept};
  for (size_t c = 0; c < found.size(); ++c) if (c != kept) order.push_back(c);
  for (size_t c : order) {
    out << '\t' << wheres[static_cast<int>(found[c]->where)] << ' ' << found[c]->impl << ' ';
    if (c < best.size() && racing[c]) out << best[c] * 1e3;
    else out << '-';
  }
  found[kept]->choice = out.str();
  return found[kept];
}

}  // namespace

std::shared_ptr<Entry> Choose(const Problem& p) {
  std::vector<std::shared_ptr<Entry>> found;
  for (Activations where : {Activations::kCaller, Activations::kAny, Activations::kBlocked}) {
    std::shared_ptr<Entry> e;
    try {
      e = Create(p, where);
    } catch (const dnnl::error&) {  // no implementation there
      if (where == Activations::kBlocked && found.empty()) throw;
      continue;
    }
    bool same = false;  // the same activation layouts as an earlier candidate
    for (const auto& f : found) same |= f->prim_x == e->prim_x && f->prim_y == e->prim_y;
    if (!same) found.push_back(e);
  }
  if (std::any_of(found.begin(), found.end(), [](const auto& f) { return !Reference(*f); })) {
    const auto before = found.size();
    found.erase(std::remove_if(found.begin(), found.end(),
                               [](const auto& f) { return Reference(*f); }), found.end());
    reference_skipped += static_cast<int64_t>(before - found.size());
  }
  const Entry& first = *found.front();
  const size_t bytes = first.user_x.get_size() + first.user_y.get_size() + first.user_w.get_size();
  if (found.size() == 1 || bytes > kTrialBytes || Reference(first))
    return RecordChoice(p, found, {}, {}, 0);
  // zero-filled, and aligned as XLA's buffers are: the trial times what the calls will get
  const AlignedBytes bx = Allocate(std::max(first.user_x.get_size(), first.spread_bytes), true),
                     by = Allocate(first.user_y.get_size(), true),
                     bw = Allocate(first.user_w.get_size(), true);
  std::vector<double> best(found.size());
  for (size_t c = 0; c < found.size(); ++c) {  // the warm-up
    reference_trials += Reference(*found[c]);
    best[c] = Seconds(*found[c], p.kernel, bx.get(), by.get(), bw.get());
  }
  const std::vector<bool> racing = Racing(best);  // the others keep their warm-up time
  for (size_t c = 0; c < found.size(); ++c) if (racing[c]) best[c] = 1e300;
  std::vector<double> spent(found.size(), 0.0);
  for (int round = 0; !TrialDone(round, spent, racing); ++round) {
    for (size_t c = 0; c < found.size(); ++c) {
      if (!racing[c]) continue;
      const double t = Seconds(*found[c], p.kernel, bx.get(), by.get(), bw.get());
      best[c] = std::min(best[c], t);
      spent[c] += t;
    }
  }
  std::vector<bool> on_callers(found.size());
  for (size_t c = 0; c < found.size(); ++c) on_callers[c] = found[c]->on_callers;
  return RecordChoice(p, found, best, racing, Pick(best, racing, on_callers, Macs(p)));
}

}  // namespace jaxconv_onednn
