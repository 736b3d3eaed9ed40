// The running CPU's vector ISA (isa.h).
#include "isa.h"

#include <cstdlib>
#include <cstring>

namespace jaxconv_onednn {

Isa IsaForCpu() {
  static const Isa isa = [] {
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512bw") && avx2;
    Isa found = avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kPlain;
    const char* asked = std::getenv("JAXCONV_WINOGRAD_ISA");
    if (asked != nullptr && std::strcmp(asked, "plain") == 0) found = Isa::kPlain;
    if (asked != nullptr && std::strcmp(asked, "avx2") == 0 && found == Isa::kAvx512)
      found = Isa::kAvx2;
    return found;
  }();
  return isa;
}

}  // namespace jaxconv_onednn
