// Winograd's minimal filtering for 2D 3x3 stride-1 convolutions: F(m x m, 3 x 3)
// with output tiles of m = 2, 3 or 4 (alpha = m + 2 inputs per tile side), the "winograd"
// lowering (lowering/winograd.py; docs/lowerings.md, "Winograd").
//
// Per tile of m x m outputs, with the tile's alpha x alpha inputs d and a 3x3 filter g,
//     y = A^T [ (G g G^T) (.) (B^T d B) ] A
// where (.) multiplies element by element: alpha^2 products per tile and channel pair instead
// of 9 m^2 (2.25x fewer for m = 2, 3.24x for m = 3, 4x for m = 4). Summed over input
// channels, each of the alpha^2 positions xi is one matrix product over tiles:
//     M[xi] (tiles x K) = V[xi] (tiles x C) . U[xi] (C x K),   U = G g G^T.
// The weight gradient is the products' adjoint: with dM = A dy A^T per tile,
//     dU[xi] (C x K) = V[xi]^T (C x P) . dM[xi] (P x K),   dW = G^T dU G.
// The data gradient is the forward of the flipped filter with its channels swapped (the
// caller's filter strides say so: FilterView).
//
// Rules:
// - x and dy are N x H x W x C buffers (NHWC; the caller moves other layouts); the filter is
//   read and dW written in the caller's layout, through FilterView's strides;
// - the operands are float32 or bfloat16; every transform and product computes in float32,
//   and a bfloat16 result is rounded once, to nearest even;
// - the forward is fused per block of tiles: each thread transforms a block of tiles into
//   V, multiplies, and transforms M into y while the block is in its cache (kWinogradBlockBytes);
//   the weight gradient likewise, each thread adding its blocks' products into a dU of its
//   own (summed at the end) where dU takes at most kWinogradFusedMaxWeightBytes;
//   where U is larger than kWinogradFusedMaxFilterBytes (each block would read all of it), or
//   dU larger than kWinogradFusedMaxWeightBytes, the passes run over chunks of tiles instead:
//   transform a chunk (V, M or dM within kWinogradChunkBytes), then the products, then y;
//   a forward's chunk of more than kWinogradBlockedMaxTiles tiles is multiplied by the whole U
//   (transformed first; the threads share positions and column blocks), a smaller one block
//   by block, each thread transforming kWinogradFilterBlock input x kWinogradFilterColumns
//   output channels of U from the filter into its cache as it goes, the products fetching
//   the filter's next block (writing all of U and reading it back cost more than a 7x7
//   layer's products); the weight gradient's sum over
//   tiles stays in registers, and where all tiles fit one chunk and number at most twice a
//   block's input channels (kWinogradWeightRows), dU is computed block by block in the cache
//   and dW from there (WeightBlocked); working memory is kept between calls up to
//   kWinogradKeepBytes;
// - U reads the filter in runs of output channels (float32 ones where they lie), or of input
//   channels transposed into the cache (the data gradient's swapped view), or else through a
//   dense copy, its taps prefetched; U's positions lie u_plane() rows apart
//   (docs/lowerings.md, "Winograd");
// - a tile that runs past y's last row (column) skips the products of its last position row
//   (column), the point at infinity, which reach only its last output: the tiles are
//   numbered by kind so that the tiles using each position are one run (winograd_tiles.h,
//   "Short tiles");
// - the products are jaxconv's own register-blocked kernel (AVX-512: 12 rows x 32 columns,
//   AVX2: 6 x 16); K is padded to a multiple of 32 in U, M and dM;
// - every pass is split between threads (openmp.h, OnTeam): a forward's (and a data
//   gradient's) between parts on XLA's pool, a weight gradient's between oneDNN's OpenMP
//   team's threads (decisions.h, WinogradOnPool).
#pragma once

#include <cstddef>
#include <cstdint>

#include "winograd_decisions.h"

namespace jaxconv_onednn {

// A 3 x 3 x C x K filter in the caller's buffer: element (i, j, c, k) is at
// offset + i * row + j * col + c * in + k * out (strides may be negative: a flipped filter).
struct FilterView {
  int64_t offset = 0, row = 0, col = 0, in = 0, out = 0;
  // the element of tap ij (i * 3 + j), input channel c and output channel k
  int64_t at(int ij, int64_t c, int64_t k) const {
    return offset + ij / 3 * row + ij % 3 * col + c * in + k * out;
  }
};

struct WinogradShape {
  int64_t n = 0, h = 0, w = 0, c = 0;  // x: N x H x W x C
  int64_t k = 0;                       // output channels
  int64_t oh = 0, ow = 0;              // y: N x OH x OW x K
  int64_t pad_top = 0, pad_left = 0;   // x's padding before its first row and column
  int m = 4;                           // output tile side: 2, 3 or 4
  bool bf16 = false;                   // x, y, dy and the filter in bfloat16 (else float32)
  FilterView filter;
  int64_t filter_elements = 0;  // the filter buffer's size

  int alpha() const { return m + 2; }
  int64_t tiles_h() const { return (oh + m - 1) / m; }
  int64_t tiles_w() const { return (ow + m - 1) / m; }
  int64_t tiles() const { return n * tiles_h() * tiles_w(); }
  int64_t k_padded() const { return (k + 31) / 32 * 32; }
  // U's rows a position: C and one more, so that a power-of-two C does not put the alpha^2
  // rows a filter transform writes at once into the same sets of the L1 cache (the
  // transform took 1.4x as long with them there on a Zen 4); likewise a block of U.
  int64_t u_plane() const { return c + 1; }
  // Empty where the shape is consistent, else what is wrong.
  const char* Invalid() const;
};

// The vector ISA of the passes: 0 AVX-512, 1 AVX2, 2 neither (for the tests).
int WinogradIsa();
// The chunk of the staged passes in bytes (0: kWinogradChunkBytes); the tests make it small.
void SetWinogradChunkBytes(size_t bytes);

// y (N x OH x OW x K) from x and the filter g.
void WinogradForward(const WinogradShape& s, const void* x, const void* g, void* y);
// dW (the filter's layout) from x and dy (N x OH x OW x K).
void WinogradWeight(const WinogradShape& s, const void* x, const void* dy, void* dw);

}  // namespace jaxconv_onednn
