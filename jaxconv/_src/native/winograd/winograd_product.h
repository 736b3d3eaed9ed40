// The products of the Winograd passes (winograd.h): c (rows x cols) = or += a (rows x inner)
// times b (inner x cols), by jaxconv's register-blocked kernels, and the vector ISA every pass
// is compiled for.
#pragma once

#include <cstdint>

#include "isa.h"

namespace jaxconv_onednn {

// Rows of c each kernel call keeps in registers (AVX-512: 12, AVX2: 6).
int RowsPerBlock();

// Cache lines a product asks for while it runs, one every other step of its inner loop (the
// AVX-512 and AVX2 kernels; the plain one ignores them): `lines` lines from
// base + r * row + tap[t], for r in [0, rows) and t in [0, taps), rows outermost. The blocked
// forward (winograd.cc) has it fetch the next block of the filter, whose rows lie far apart,
// while the arithmetic keeps the core busy.
struct Prefetches {
  const char* base = nullptr;
  int64_t row = 0, rows = 0;
  int64_t tap[9] = {};
  int taps = 0, lines = 0;
  // where the next line is: row r, tap t, line l
  int64_t r = 0;
  int t = 0, l = 0;
};

// Element (r, i) of a is a[r * ar + i * ai]; b and c are row-major with row strides ldb, ldc.
struct Operands {
  const float* a;
  int64_t ar, ai;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  Prefetches* prefetch = nullptr;  // none, or lines to fetch along the way
};

// c (rows x cols) = a . b, or += where `accumulate`; cols a multiple of 32.
void Product(const Operands& o, int64_t rows, int64_t inner, int64_t cols, bool accumulate);

}  // namespace jaxconv_onednn
