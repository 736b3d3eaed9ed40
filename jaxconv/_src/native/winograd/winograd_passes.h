// The passes over Winograd's tiles (winograd.h), each for tile side m (2, 3 or 4) and for
// tiles or channels in [first, end): the transforms of x into V, of M into y, of dy into dM,
// of the filter into U and of dU into dW. Each runs the widest vector ISA this CPU has
// (winograd_product.h); the drivers (winograd.cc) split them between the team's threads.
#pragma once

#include <cstdint>

#include "winograd.h"

namespace jaxconv_onednn {

struct Rows;

// V rows of tiles [p0, p1): (B^T d B)[xi], d the tile's alpha x alpha inputs of x (zeros
// outside it).
void InputPass(int m, const WinogradShape& s, const void* x, const Rows& v, int64_t p0,
               int64_t p1);
// y's tiles [p0, p1) from M: A^T M A, the positions inside y only, into y's rows of ldy.
void OutputPass(int m, const WinogradShape& s, const Rows& mm, void* y, int64_t ldy, int64_t p0,
                int64_t p1);
// dM rows of tiles [p0, p1): (A e A^T)[xi], e the tile's m x m values of dy.
void GradPass(int m, const WinogradShape& s, const void* dy, const Rows& dm, int64_t p0,
              int64_t p1);
// U of input channels [c0, c1) and output channels [k0, k1): (G g G^T)[xi], element
// (xi, c, k) at u[(xi * plane + c - c0) * ld + k - k0]; `scratch` holds
// kWinogradFilterScratch floats where the filter's input channels are contiguous.
void FilterPass(int m, const WinogradShape& s, const void* g, float* u, int64_t plane,
                int64_t ld, int64_t c0, int64_t c1, int64_t k0, int64_t k1, float* scratch);
// dW of input channels [c0, c1) and output channels [k0, k1) from dU: G^T dU G, written
// through the filter's view.
void FilterGradPass(int m, const WinogradShape& s, const float* du, int64_t plane, int64_t ld,
                    void* g, int64_t c0, int64_t c1, int64_t k0, int64_t k1);

}  // namespace jaxconv_onednn
