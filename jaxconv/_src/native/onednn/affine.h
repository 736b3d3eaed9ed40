// A fused forward's channel-wise affine run, composed (docs/onednn.md, "Fused chains").
//
// The chain's leading run of channel post-ops that add, subtract, multiply or multiply by
// rsqrt(c + eps) (decisions.h, LeadingAffine: a bias; BatchNorm in inference mode as flax
// writes it, sub the mean, mul_rsqrt the variance, mul the scale, add the offset) is an affine
// map of each output channel o, a[o] * y + b[o], composed op by op from a = 1, b = 0:
//     add c: b + c;   sub c: b - c;   mul c: a * c, b * c;   mul_rsqrt c: a * r, b * r,
// r = 1 / sqrt(c + eps). A convolution is linear in its filter and y's channel o is the
// product with W's O-row o, so
//     a * conv(x, W) + b = conv(x, W * a) + b        (a along W's O axis):
// where the run folds, one add post-op and the scaled filter; else a multiply and an add
// post-op in place of the run. Either rounds differently from the program's chain (the folded
// filter once per element, as every runtime that folds BatchNorm does). A mul_rsqrt after the
// run becomes a multiply by its computed vector.
#pragma once

#include <vector>

#include "problem.h"

namespace jaxconv_onednn {

// Rewrites `p`'s post-ops, their operands `sides` and the filter `w` as above, for one call.
// The vectors and the scaled filter are the calling thread's buffers, kept between calls
// (a call's chunks on other threads read them while it waits).
void ComposeAffine(Problem& p, void*& w, std::vector<void*>& sides);

// Releases the calling thread's buffers past their keep size, after its call (buffers.h).
void TrimAffine();

}  // namespace jaxconv_onednn
