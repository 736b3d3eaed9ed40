// The OpenMP runtime oneDNN was loaded with, found at run time (none: a oneDNN without
// OpenMP): jaxconv's own parallel loops (the filter moves) run on oneDNN's team rather than a
// second one, and a chunk on XLA's pool sets its thread's OpenMP thread count to 1.
#pragma once

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

}  // namespace jaxconv_onednn
