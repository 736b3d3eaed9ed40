// The OpenMP runtime oneDNN was loaded with, found at run time (none: a oneDNN without
// OpenMP): jaxconv's own parallel loops (the filter moves) run on oneDNN's team rather than a
// second one, and a chunk on XLA's pool sets its thread's OpenMP thread count to 1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace jaxconv_onednn {

struct OpenMp {
  int (*get_max_threads)() = nullptr;
  void (*set_num_threads)(int) = nullptr;
  int (*thread_num)() = nullptr;
  int (*num_threads)() = nullptr;
  // what `#pragma omp parallel` compiles to: fn(data) on each thread of a team of the given
  // size (0: the calling thread's omp_get_max_threads())
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;
  // omp_pause_resource_all: releases the calling thread's pool (OpenMP 5.0)
  int (*pause_all)(int) = nullptr;

  OpenMp();
  bool ok() const { return get_max_threads != nullptr && set_num_threads != nullptr; }
  bool teams() const {
    return parallel != nullptr && thread_num != nullptr && num_threads != nullptr;
  }
};

const OpenMp& Omp();

// Work that OnTeam runs as parts on XLA's pool instead of the team, where a caller set it
// (OnPoolInstead): a call whose team would spin beside the pool's next calls (docs/onednn.md,
// "Threads"). `run(parts, part)` runs part(i) for each i in [0, parts) on the pool and the
// calling thread (threading.h, RunParts); `threads` is the pool's, what TeamThreads() says.
struct PoolInstead {
  int64_t threads = 1;
  std::function<void(int64_t, const std::function<void(int64_t)>&)> run;
};

// The calling thread's PoolInstead, where one is set.
inline thread_local const PoolInstead* pool_instead = nullptr;

// Sets `p` as the calling thread's PoolInstead while it lives.
class OnPoolInstead {
 public:
  explicit OnPoolInstead(const PoolInstead& p) : saved_(pool_instead) { pool_instead = &p; }
  ~OnPoolInstead() { pool_instead = saved_; }
  OnPoolInstead(const OnPoolInstead&) = delete;
  OnPoolInstead& operator=(const OnPoolInstead&) = delete;

 private:
  const PoolInstead* saved_;
};

// The threads OnTeam splits work between (1 without a team; the pool's instead).
inline int64_t TeamThreads() {
  if (pool_instead != nullptr) return std::max<int64_t>(1, pool_instead->threads);
  return Omp().teams() ? std::max(1, Omp().get_max_threads()) : 1;
}

// Runs fn(first, end) over [0, n) split evenly between the calling thread's OpenMP team, the
// one team every parallel loop of the handler runs on (team.h starts it), or between parts on
// XLA's pool where the caller set that (PoolInstead); the calling thread alone runs all of
// [0, n) without either, or where `team` is false.
template <typename Fn>
void OnTeam(int64_t n, const Fn& fn, bool team = true) {
  if (team && pool_instead != nullptr) {
    const int64_t k = std::min<int64_t>(n, pool_instead->threads);
    if (k <= 1) fn(0, n);
    else pool_instead->run(k, [&](int64_t i) { fn(n * i / k, n * (i + 1) / k); });
    return;
  }
  struct Job {
    const Fn* fn;
    int64_t n;
  } job{&fn, n};
  auto run = [](void* data) {
    const auto& j = *static_cast<Job*>(data);
    const int64_t t = Omp().thread_num(), k = Omp().num_threads();
    (*j.fn)(j.n * t / k, j.n * (t + 1) / k);
  };
  if (team && Omp().teams()) Omp().parallel(run, &job, 0, 0);
  else fn(0, n);
}

}  // namespace jaxconv_onednn
