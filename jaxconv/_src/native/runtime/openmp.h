// The OpenMP runtime oneDNN was loaded with, found at run time (none: a oneDNN without
// OpenMP): jaxconv's own parallel loops (the filter moves) run on oneDNN's team rather than a
// second one, and a chunk on XLA's pool sets its thread's OpenMP thread count to 1.
#pragma once

#include <algorithm>
#include <cstdint>

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

// The threads OnTeam splits work between (1 without a team).
inline int64_t TeamThreads() {
  return Omp().teams() ? std::max(1, Omp().get_max_threads()) : 1;
}

// Runs fn(first, end) over [0, n) split evenly between the calling thread's OpenMP team, the
// one team every parallel loop of the handler runs on (team.h starts it); the calling thread
// alone runs all of [0, n) without a team, or where `team` is false.
template <typename Fn>
void OnTeam(int64_t n, const Fn& fn, bool team = true) {
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
