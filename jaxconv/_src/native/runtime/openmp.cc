// oneDNN's OpenMP runtime (openmp.h).
#include "openmp.h"

#include <dlfcn.h>

namespace jaxconv_onednn {

OpenMp::OpenMp() {
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (gomp == nullptr) return;
  get_max_threads = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_max_threads"));
  set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(gomp, "omp_set_num_threads"));
  thread_num = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_thread_num"));
  num_threads = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_num_threads"));
  parallel = reinterpret_cast<void (*)(void (*)(void*), void*, unsigned, unsigned)>(
      dlsym(gomp, "GOMP_parallel"));
  pause_all = reinterpret_cast<int (*)(int)>(dlsym(gomp, "omp_pause_resource_all"));
}

const OpenMp& Omp() {
  static OpenMp* omp = new OpenMp();
  return *omp;
}

}  // namespace jaxconv_onednn
