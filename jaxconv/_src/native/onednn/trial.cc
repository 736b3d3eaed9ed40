// The layout trial (trial.h).
#include "trial.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "decisions.h"
#include "execute.h"
#include "taps.h"

namespace jaxconv_onednn {

std::atomic<int64_t> reference_skipped{0}, reference_trials{0};

namespace {

std::atomic<int> trial_on{-1};  // -1: from the environment at the first call

bool TrialOn() {
  int on = trial_on.load();
  if (on < 0) {
    const char* measure = std::getenv("JAXCONV_MEASURE");
    on = measure != nullptr && std::strcmp(measure, "0") == 0 ? 0 : 1;
    trial_on.store(on);
  }
  return on == 1;
}

struct Known {
  Activations where;
  std::string impl;
};

std::mutex known_mu;
std::unordered_map<std::string, Known>& TheKnown() {
  static auto* known = new std::unordered_map<std::string, Known>();
  return *known;
}

double Seconds(const Entry& e, Kernel k, void* x, void* y, void* w,
               const std::vector<void*>& sides, bool packed) {
  const auto t0 = std::chrono::steady_clock::now();
  Execute(e, k, x, y, w, sides, packed ? &e.prim_w : nullptr);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What a race of candidates found: each one's best time (its warm-up where it did not race),
// noise and whether it raced, and the one Pick keeps.
struct Race {
  std::vector<double> best, noise;
  std::vector<bool> racing;
  size_t kept = 0;
};

// Races `found` (entries of `p`; candidate c reads its filter packed in its primitive's layout
// where `packed[c]`) on zero-filled buffers, aligned as XLA's are: each one's warm-up, then
// rounds of the racing ones (Racing, TrialDone) and Pick, by how much each one moves.
Race RunRace(const Problem& p, const std::vector<std::shared_ptr<Entry>>& found,
             const std::vector<bool>& packed) {
  const Entry& first = *found.front();
  size_t w_bytes = first.user_w.get_size();
  for (size_t c = 0; c < found.size(); ++c)
    if (packed[c]) w_bytes = std::max(w_bytes, found[c]->prim_w.get_size());
  const AlignedBytes bx = Allocate(std::max(first.user_x.get_size(), first.spread_bytes), true),
                     by = Allocate(first.user_y.get_size(), true), bw = Allocate(w_bytes, true);
  // a fused forward's post-op operands: a residual of zeros, channel vectors of ones (a
  // division by zero would time the arithmetic of infinities)
  std::vector<AlignedBytes> side_bytes;
  std::vector<void*> sides;
  for (const memory::desc& md : first.user_sides) {  // as the caller passes them
    side_bytes.push_back(Allocate(md.get_size(), true));
    sides.push_back(side_bytes.back().get());
    if (md.get_data_type() == memory::data_type::f32 && md != first.user_y)
      std::fill_n(reinterpret_cast<float*>(sides.back()), md.get_size() / sizeof(float), 1.0f);
  }
  Race r;
  r.best.assign(found.size(), 0.0);
  r.noise.assign(found.size(), 0.0);
  auto time = [&](size_t c) {
    return Seconds(*found[c], p.kernel, bx.get(), by.get(), bw.get(), sides, packed[c]);
  };
  for (size_t c = 0; c < found.size(); ++c) {  // the warm-up
    reference_trials += Reference(*found[c]);
    r.best[c] = time(c);
  }
  r.racing = Racing(r.best);  // the others keep their warm-up time
  std::vector<std::vector<double>> samples(found.size());
  std::vector<double> spent(found.size(), 0.0);
  for (int round = 0; !TrialDone(round, spent, r.racing); ++round) {
    for (size_t c = 0; c < found.size(); ++c) {
      if (!r.racing[c]) continue;
      const double t = time(c);
      samples[c].push_back(t);
      spent[c] += t;
    }
  }
  std::vector<int> moves(found.size());  // 0: nothing moved; 1: the filter; 2: activations
  for (size_t c = 0; c < found.size(); ++c) {
    // tap products write and read back products of the activations' size: they count as
    // moving the activations, so they are kept only where they lead beyond the margin
    moves[c] = found[c]->taps || !found[c]->on_callers ? 2
               : packed[c] || found[c]->prim_w == found[c]->user_w ? 0 : 1;
    if (!r.racing[c]) continue;
    r.best[c] = *std::min_element(samples[c].begin(), samples[c].end());
    r.noise[c] = Noise(samples[c]);
  }
  r.kept = Pick(r.best, r.noise, r.racing, moves, Macs(p));
  return r;
}

std::shared_ptr<Entry> RecordChoice(const Problem& p, const char* source,
                                    const std::vector<std::shared_ptr<Entry>>& found,
                                    const std::vector<double>& best,
                                    const std::vector<double>& noise,
                                    const std::vector<bool>& racing, size_t kept) {
  static const char* const kernels[] = {"forward", "data", "weight"};
  static const char* const wheres[] = {"caller", "any", "blocked", "caller_filter", "taps"};
  std::ostringstream out;
  auto list = [&out](const std::vector<int64_t>& v) {
    for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
    out << '\t';
  };
  out << kernels[static_cast<int>(p.kernel)] << '\t';
  for (const auto* v : {&p.x_dims, &p.y_dims, &p.w_dims, &p.strides, &p.dilations}) list(*v);
  out << p.groups << '\t' << (p.threads == 1 ? "single" : "openmp") << '\t' << source << '\t'
      << KeyText(p);
  std::vector<size_t> order{kept};
  for (size_t c = 0; c < found.size(); ++c) if (c != kept) order.push_back(c);
  for (size_t c : order) {
    out << '\t' << wheres[static_cast<int>(found[c]->where)] << ' ' << found[c]->impl << ' ';
    if (c < best.size() && racing[c]) out << best[c] * 1e3 << ' ' << noise[c];
    else out << "- -";
  }
  found[kept]->choice = out.str();
  return found[kept];
}

// The remembered verdict's primitive for `p`, or null (none, or oneDNN now creates another).
std::shared_ptr<Entry> Recalled(const Problem& p) {
  Known known;
  {
    std::lock_guard<std::mutex> lock(known_mu);
    auto it = TheKnown().find(KeyText(p));
    if (it == TheKnown().end()) return nullptr;
    known = it->second;
  }
  try {
    std::shared_ptr<Entry> e = Create(p, known.where);
    if (e->impl == known.impl) return RecordChoice(p, "cache", {e}, {}, {}, {}, 0);
  } catch (const dnnl::error&) {
  }
  return nullptr;
}

}  // namespace

std::string KeyText(const Problem& p) {
  std::string text;
  for (int64_t v : p.MakeKey()) {
    if (!text.empty()) text += ',';
    text += std::to_string(v);
  }
  return text;
}

void Remember(const std::string& key, Activations where, const std::string& impl) {
  std::lock_guard<std::mutex> lock(known_mu);
  TheKnown()[key] = Known{where, impl};
}

void Forget() {
  std::lock_guard<std::mutex> lock(known_mu);
  TheKnown().clear();
}

void SetTrial(bool on) { trial_on.store(on ? 1 : 0); }

namespace {

// The trial off: the first layouts oneDNN implements without its reference loop nest (the
// caller's where it does), created alone; null where only a reference implementation exists.
std::shared_ptr<Entry> ByRule(const Problem& p) {
  for (Activations where : {Activations::kCaller, Activations::kAny, Activations::kBlocked}) {
    try {
      std::shared_ptr<Entry> e = Create(p, where);
      if (!Reference(*e)) return RecordChoice(p, "rule", {e}, {}, {}, {}, 0);
    } catch (const dnnl::error&) {  // no implementation there
    }
  }
  return nullptr;
}

}  // namespace

std::shared_ptr<Entry> Choose(const Problem& p) {
  if (p.packed >= 0)  // its layouts chosen when the filter was packed (packed.h)
    return RecordChoice(p, "packed", {Create(p, static_cast<Activations>(p.packed))}, {}, {},
                        {}, 0);
  if (std::shared_ptr<Entry> e = Recalled(p)) return e;
  if (!TrialOn())
    if (std::shared_ptr<Entry> e = ByRule(p)) return e;
  std::vector<std::shared_ptr<Entry>> found;
  for (Activations where : {Activations::kCaller, Activations::kAny, Activations::kBlocked,
                            Activations::kCallerFilter}) {
    std::shared_ptr<Entry> e;
    try {
      e = Create(p, where);
    } catch (const dnnl::error&) {  // no implementation there
      if (where == Activations::kBlocked && found.empty()) throw;
      continue;
    }
    bool same = false;  // the same layouts as an earlier candidate
    for (const auto& f : found)
      same |= f->prim_x == e->prim_x && f->prim_y == e->prim_y && f->prim_w == e->prim_w;
    // the caller's filter only where the caller's layouts' implementation takes it (the same
    // kernel, its filter reorder saved): another one (oneDNN's im2col and sgemm) kept for being
    // within the margin took MobileNetV2's training step from 0.95 of torch's time to 0.7-0.9
    if (where == Activations::kCallerFilter)
      same |= found.empty() || found.front()->where != Activations::kCaller ||
              found.front()->impl != e->impl;
    if (!same) found.push_back(e);
  }
  if (TapsApply(p)) {  // a data gradient's tap products: another candidate, never the first
    try {
      found.push_back(CreateTaps(p));
    } catch (const dnnl::error&) {  // only oneDNN's reference matmul
    }
  }
  if (std::any_of(found.begin(), found.end(), [](const auto& f) { return !Reference(*f); })) {
    const auto before = found.size();
    found.erase(std::remove_if(found.begin(), found.end(),
                               [](const auto& f) { return Reference(*f); }), found.end());
    reference_skipped += static_cast<int64_t>(before - found.size());
  }
  const Entry& first = *found.front();  // the caller's layouts, where oneDNN implements them
  const size_t bytes = first.user_x.get_size() + first.user_y.get_size() + first.user_w.get_size();
  if (found.size() == 1 || bytes > kTrialBytes || Reference(first))
    return RecordChoice(p, "alone", found, {}, {}, {}, 0);
  if (!TrialOn()) return RecordChoice(p, "rule", found, {}, {}, {}, 0);  // reference only
  const Race r = RunRace(p, found, std::vector<bool>(found.size(), false));
  return RecordChoice(p, "trial", found, r.best, r.noise, r.racing, r.kept);
}

bool PackedWins(const Problem& p, const std::shared_ptr<Entry>& packed,
                const std::shared_ptr<Entry>& taps) {
  return RunRace(p, {packed, taps}, {true, false}).kept == 0;
}

}  // namespace jaxconv_onednn
