"""``"winograd"``: 2D 3x3 stride-1 convolutions by Winograd's minimal filtering (CPU; float32
and bfloat16 operands, float32 arithmetic).

F(m x m, 3 x 3) computes a tile of m x m outputs from (m + 2) x (m + 2) inputs with
(m + 2)^2 multiplications per channel pair instead of 9 m^2 (Lavin and Gray, 2016):
``"winograd_2x2"`` (m = 2: 2.25x fewer), ``"winograd_3x3"`` (m = 3: 3.24x fewer),
``"winograd_4x4"`` (m = 4: 4x fewer), and ``"winograd"``, of the tiles its accuracy allows
(:func:`tile`) the one that multiplies least (:func:`fewest_products_tile`).
The handler (``native/winograd/winograd.h``) transforms the filter, x and dy tile by tile and
multiplies the transformed tiles with its own register-blocked products:

    forward      y  = A^T [ U (.) (B^T d B) ] A,  U = G g G^T  (per tile, summed over C)
    weight grad  dW = G^T dU G,  dU = sum over tiles of (B^T d B) (.) (A dy A^T)
    data grad    the forward of the flipped filter, its channels swapped, padded by 2 - pads:
                 for stride 1, dx[i] = sum_k dy[i + pb - k] g[k] is a correlation of dy with
                 the flipped filter, padded by (K - 1 - pb) = 2 - pb per side.

The rounding error grows with the tile: the transforms' entries (up to 8 for m = 4) scale
values before the float32 products sum them. docs/precision.md ("Winograd") holds the
measured error of each tile size against float64 on the benchdnn 3x3 problems. The ops keep
``Precision.HIGHEST`` and other dtypes on direct arithmetic (``chooser.plan``);
``lowering="auto"`` takes Winograd where it pays (``tables.py``): the fastest on the running
machine of oneDNN and the tiles whose measured error stays within half of float32's bound in
``jaxconv.testing.TOLERANCE`` (:func:`tile`; ``measured.py``).

The handler takes NHWC activations (those of another layout are transposed by XLA around the
call) and reads the filter, and writes the weight gradient, in the caller's layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Array, DType, Kernel, Precision
from jaxconv._src.lowering.method import Method
from jaxconv._src.native import library

#: the output tile sides the handler implements
TILES = (2, 3, 4)

# G (alpha x 3) of F(m, 3): the filter transform, U = G g G^T. Toom-Cook's matrices for the
# interpolation points 0, 1, -1 (and 2 for m = 3, 2 and -1/2 for m = 4) and infinity: F(3, 3)'s
# and F(4, 3)'s points are ones whose float32 error measured smallest among sets of small
# rationals (F(4, 3)'s 2.5x below the usual 0, +-1, +-2; F(3, 3)'s level with 0, 1, -1, 1/2
# and 1.3x below 0, 1, -1, 3 or 3/2; docs/precision.md, "Winograd").
_G = {
    2: np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
    3: np.array([[0.5, 0, 0], [-0.5, -0.5, -0.5], [-1 / 6, 1 / 6, -1 / 6],
                 [1 / 6, 1 / 3, 2 / 3], [0, 0, 1]]),
    4: np.array([[1, 0, 0], [-1 / 3, -1 / 3, -1 / 3], [1 / 3, -1 / 3, 1 / 3],
                 [1 / 15, 2 / 15, 4 / 15], [-16 / 15, 8 / 15, -4 / 15], [0, 0, 1]]),
}


def matrices(m: int) -> dict[str, np.ndarray]:
    """B^T, G and A^T of F(m x m, 3 x 3) in float64 (the handler's transforms are these,
    written out; tests/lowering/test_winograd.py checks them against direct convolution)."""
    bt: list[list[float]]
    at: list[list[float]]
    if m == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif m == 3:
        bt = [[2, -1, -2, 1, 0], [0, -2, -1, 1, 0], [0, 2, -3, 1, 0], [0, -1, 0, 1, 0],
              [0, 2, -1, -2, 1]]
        at = [[1, 1, 1, 1, 0], [0, 1, -1, 2, 0], [0, 1, 1, 4, 1]]
    elif m == 4:
        bt = [[1, 1.5, -2, -1.5, 1, 0], [0, -1, -2.5, -0.5, 1, 0], [0, 1, 0.5, -2.5, 1, 0],
              [0, -0.5, -1, 0.5, 1, 0], [0, 2, -1, -2, 1, 0], [0, 1, 1.5, -2, -1.5, 1]]
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -0.5, 0], [0, 1, 1, 4, 0.25, 0],
              [0, 1, -1, 8, -0.125, 1]]
    else:
        raise ValueError(f"winograd: the tile must be one of {TILES}, got {m}")
    return {"BT": np.array(bt, np.float64), "G": _G[m], "AT": np.array(at, np.float64)}


#: The most channels a forward or data gradient sums per output for which the 4x4 and 3x3
#: tiles are allowed; above, only 2x2. Their error grows with them: against float64 on the
#: benchdnn 3x3 problems (docs/precision.md, "Winograd") the 4x4 forward measured 2.4e-6 at 64
#: channels, 2.7e-6 at 128, 4.3e-6 at 256 and 6.2e-6 at 512, the largest measured, the 3x3
#: one 2.8e-6 to 6.6e-6; the bound is 2e-5 and the rule keeps to half of it. The 2x2 tile stays
#: below 1e-6 at 512, and a weight gradient's error (a sum over the batch's positions) at
#: 4.8e-6 with any tile.
WINOGRAD_4X4_MAX_CHANNELS = 512


def tile(kernel: Kernel, p: ConvProblem, dtype: DType = np.dtype(np.float32)) -> int:
    """The widest output tile side the accuracy rule allows for ``kernel`` of ``p`` (and every
    narrower one): 4 where the channels each output sums are at most
    :data:`WINOGRAD_4X4_MAX_CHANNELS` (always for the weight gradient, and for bfloat16
    operands, whose result's rounding is 200x the 4x4 tile's float32 error), else 2."""
    summed = {Kernel.FORWARD: p.in_channels, Kernel.DATA: p.out_channels}.get(kernel, 0)
    wide = np.dtype(dtype) == np.float32 and summed > WINOGRAD_4X4_MAX_CHANNELS
    return 2 if wide else 4


def products(m: int, p: ConvProblem, kernel: Kernel = Kernel.FORWARD) -> int:
    """Multiplications per channel pair and image of the m x m tile on ``kernel`` of ``p``, over
    the map it tiles (y; dx for the data gradient, the forward of the flipped filter; dy for
    the weight gradient): per side, m + 2 positions for each whole tile and m + 1 for a last
    tile that runs past the map's edge, which skips its point at infinity (the handler's
    winograd_tiles.h, "Short tiles"); the product of the two sides."""
    def side(n: int) -> int:
        return n // m * (m + 2) + (m + 1 if n % m else 0)

    oh, ow = p.input_size if kernel is Kernel.DATA else p.output_size
    return side(oh) * side(ow)


def timed_tiles(kernel: Kernel, p: ConvProblem,
                dtype: DType = np.dtype(np.float32)) -> tuple[int, ...]:
    """The tiles ``lowering="auto"`` times for ``kernel`` of ``p`` (``measured.py``), widest
    first: those up to :func:`tile`'s, the 3x3 one only where it multiplies less than the 4x4
    one (an output the 4x4 tiles cover with waste: 5x5, 6x6, 9x9)."""
    widest = tile(kernel, p, dtype)
    return tuple(m for m in sorted(TILES, reverse=True)
                 if m <= widest and (m != 3 or products(3, p, kernel) < products(4, p, kernel)))


def fewest_products_tile(kernel: Kernel, p: ConvProblem,
                         dtype: DType = np.dtype(np.float32)) -> int:
    """The tile ``"winograd"`` computes with: of :func:`timed_tiles`, the one that multiplies
    least (the widest of a tie)."""
    return min(timed_tiles(kernel, p, dtype), key=lambda m: products(m, p, kernel))


def inapplicable(p: ConvProblem) -> str | None:
    """Why the handler's Winograd does not compute ``p``, or None."""
    if p.rank != 2 or p.kernel != (3, 3):
        return f"computes 2D 3x3 kernels, got a {'x'.join(map(str, p.kernel))} kernel"
    if p.strides != (1, 1) or p.dilations != (1, 1):
        return (f"needs strides and dilations 1, got strides {list(p.strides)}, dilations "
                f"{list(p.dilations)}")
    if p.groups != 1:
        return f"needs groups=1, got groups={p.groups}"
    if not all(0 <= q <= 2 for q in (*p.pads_begin, *p.pads_end)):
        return (f"needs pads in [0, 2], got pads_begin {list(p.pads_begin)}, pads_end "
                f"{list(p.pads_end)}")
    found = library.status()
    if not found.available:
        return f"is not available: {found.detail}"
    return None


#: the operand dtypes the handler takes: it computes in float32 and rounds a bfloat16 result once
DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16))


def dtype_why(dtype: DType | None, preferred_element_type: DType = None) -> str | None:
    """Why the handler's Winograd does not take operands of ``dtype`` (None: operands of two
    dtypes), or None."""
    if dtype is None:
        return "needs operands of one dtype"
    if np.dtype(dtype) not in DTYPES:
        return f"computes float32 and bfloat16, got {np.dtype(dtype)}"
    if preferred_element_type is not None and np.dtype(preferred_element_type) != np.dtype(dtype):
        return (f"returns its operands' dtype, got preferred_element_type "
                f"{np.dtype(preferred_element_type)} for {np.dtype(dtype)} operands")
    return None


#: the dtypes ``lowering="auto"`` takes Winograd for, where it times faster than oneDNN's
#: direct kernel (measured.py): float32, and bfloat16 (computed in float32, the result rounded
#: once). In bfloat16 oneDNN's direct kernels run at twice float32's rate on AVX-512 BF16, and
#: the two are close: N8, forward / data / weight gradient, best of 20, ms, oneDNN against the
#: 4x4 tile: 56x56 64 -> 64 4.35 / 4.24 / 4.93 against 3.60 / 3.53 / 3.65; 28x28 128 -> 128
#: 4.05 / 4.98 / 4.33 against 3.08 / 3.01 / 3.80; 14x14 256 -> 256 3.97 / 3.90 / 4.25 against
#: 4.71 / 4.65 / 4.53 (2-core Zen 4; docs/lowerings.md, "Winograd"); so in bfloat16 Winograd
#: must time clearly faster (measured.WINOGRAD_BFLOAT16_MARGIN).
AUTO_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16))


def pays_for(dtype: DType | None) -> bool:
    """Whether ``lowering="auto"`` takes Winograd for operands of ``dtype``."""
    return dtype is not None and np.dtype(dtype) in AUTO_DTYPES


def _to_nhwc(a: Array, p: ConvProblem) -> Array:
    n, c, h, w = p.data.spec
    return jnp.transpose(a, (n, h, w, c))


def _from_nhwc(a: Array, p: ConvProblem) -> Array:
    return jnp.transpose(a, tuple(np.argsort(np.array(p.data.spec)[[0, 2, 3, 1]])))


def _filter_view(p: ConvProblem, transposed: bool = False) -> np.ndarray:
    """The handler's view of the filter buffer (``native/winograd/winograd.h``, FilterView): offset and
    the strides of its rows, columns, input and output channels; ``transposed``, the data
    gradient's filter (flipped, its channels swapped) over the same buffer."""
    shape = p.filter_shape
    strides = [int(np.prod(shape[a + 1:])) for a in range(len(shape))]
    o, i, h, w = (strides[a] for a in p.filter_layout.spec(swap=p.filter_swap))
    if transposed:
        return np.array([2 * h + 2 * w, -h, -w, o, i], np.int64)
    return np.array([0, h, w, i, o], np.int64)


def _call(kernel: Kernel, a: Array, b: Array, out_shape: tuple[int, ...], p: ConvProblem,
          m: int, pads: tuple[int, int], view: np.ndarray) -> Array:
    call = jax.ffi.ffi_call(library.WINOGRAD_TARGETS[kernel.value],
                            jax.ShapeDtypeStruct(out_shape, a.dtype))  # type: ignore[no-untyped-call]
    return call(a, b, op=p.op, m=np.int64(m), pad_top=np.int64(pads[0]),
                pad_left=np.int64(pads[1]), filter=view)


def _kernel(kernel: Kernel, tile_side: int | None) -> object:
    """The kernel of a tile's method (``tile_side``), or of ``"winograd"`` (None: the tile is
    the plan's parameter, which the chooser resolves: :func:`fewest_products_tile`)."""
    def compute(a: Array, b: Array, p: ConvProblem, precision: Precision,
                preferred_element_type: DType, tile: int | None = None) -> Array:
        m = tile_side if tile_side is not None else tile
        if m is None:
            raise RuntimeError("jaxconv: 'winograd' planned without its tile")
        pt, pl = p.pads_begin  # the end pads follow from the sizes (stride 1)
        n = p.batch
        if kernel is Kernel.FORWARD:  # a = x, b = W
            y = _call(Kernel.FORWARD, _to_nhwc(a, p), b, (n, *p.output_size, p.out_channels),
                      p, m, (pt, pl), _filter_view(p))
            return _from_nhwc(y, p)
        if kernel is Kernel.DATA:  # a = dy, b = W: the forward of the flipped, swapped filter
            dx = _call(Kernel.FORWARD, _to_nhwc(a, p), b, (n, *p.input_size, p.in_channels),
                       p, m, (2 - pt, 2 - pl), _filter_view(p, transposed=True))
            return _from_nhwc(dx, p)
        return _call(Kernel.WEIGHT, _to_nhwc(a, p), _to_nhwc(b, p), p.filter_shape, p, m,
                     (pt, pl), _filter_view(p))  # a = x, b = dy
    return compute


def _method(name: str, m: int | None, summary: str) -> Method:
    return Method(name, summary, {k: _kernel(k, m) for k in Kernel},  # type: ignore[misc]
                  inapplicable, platforms=("cpu",))


WINOGRAD = _method("winograd", None, "Winograd's F(4x4, 3x3), F(3x3, 3x3) where it multiplies "
                                     "less, or F(2x2, 3x3) where more than 512 float32 channels "
                                     "are summed, for 2D 3x3 stride-1 "
                                     "problems, in float32 arithmetic, through the ``onednn`` "
                                     "extra's handler (CPU)")
WINOGRAD_2X2 = _method("winograd_2x2", 2, "Winograd's F(2x2, 3x3), fewer roundings than the "
                                          "4x4 tile (CPU)")
WINOGRAD_3X3 = _method("winograd_3x3", 3, "Winograd's F(3x3, 3x3), for outputs the 4x4 tile "
                                          "covers with waste (5x5: 8x8) (CPU)")
WINOGRAD_4X4 = _method("winograd_4x4", 4, "Winograd's F(4x4, 3x3) (CPU)")
