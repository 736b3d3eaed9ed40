// The vector ISA the handler's own vectorised code runs (Winograd's passes and products, the
// max pool), each compiled for AVX-512, AVX2 and no vector ISA beside one another.
#pragma once

namespace jaxconv_onednn {

enum class Isa { kAvx512, kAvx2, kPlain };

// The widest ISA this CPU has (kAvx512: AVX-512 F, VL and BW; kAvx2: AVX2 and FMA), or a
// narrower one named by JAXCONV_WINOGRAD_ISA ("avx2", "plain"; read once): the tests run every
// path on one machine.
Isa IsaForCpu();

}  // namespace jaxconv_onednn
