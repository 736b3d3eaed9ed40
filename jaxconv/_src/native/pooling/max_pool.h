// A 2D max pool's forward and each window's argmax in one pass over x (NHWC), for the
// gradient of jaxconv.max_pool (jaxconv/_src/pooling.py): XLA:CPU computes the argmax's chain
// of compares and selects one element at a time, several times the pool's own time (ResNet's
// stem pool at batch 8: docs/onednn.md, "Max pool").
//
//   y[o]   = max_t xp[o S + t]            xp: x padded with -inf, t a tap, row-major in the window
//   arg[o] = the first t where xp[o S + t] > every earlier tap (the first maximum)
//
// A NaN tap makes y NaN (as XLA's maximum) and never becomes the argmax; a tap in the padding
// never does either unless it is the window's first (a window of padding alone: -inf, tap 0).
#pragma once

#include <cstdint>

namespace jaxconv_onednn {

struct PoolShape {
  int64_t n = 0, h = 0, w = 0, c = 0;  // x
  int64_t oh = 0, ow = 0;               // y and arg
  int64_t kh = 0, kw = 0, sh = 0, sw = 0, pad_top = 0, pad_left = 0;
  bool bfloat16 = false;                // x and y bfloat16, else float32
};

// Rows [begin, end) of the n * oh output rows: y's and arg's (int8).
void MaxPoolRows(const PoolShape& s, const void* x, void* y, int8_t* arg, int64_t begin,
                 int64_t end);

// In how many parts of its output rows a pool runs on XLA's pool (1: whole on the calling
// thread): one per kMinPoolPartWork of its taps' elements (the output's elements times the
// window's taps, a compare and blends each; the dtype's width aside: both compute in float32),
// at most one per pool thread and row. ResNet's stem pool at batch 1 (56 x 56 x 64 x 9 taps)
// makes 3 (two on 2 cores): by its bytes it ran whole in bfloat16, 0.68 ms against 0.24 in
// float32's two parts (2-core Zen 4).
constexpr int64_t kMinPoolPartWork = int64_t{1} << 19;
int64_t PoolParts(const PoolShape& s, int64_t pool_threads);

}  // namespace jaxconv_onednn
