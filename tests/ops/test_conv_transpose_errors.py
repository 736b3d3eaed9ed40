"""Every validation error of the ConvTranspose family, raised before computing."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import jaxconv
from tests.support import helpers as h

OPS = re.compile(r"^(conv_transpose|conv_transpose_backward_data|conv_transpose_backward_weights|"
                 r"conv_transpose_backprop_filters): ")

X = jnp.ones((2, 4, 4, 4))         # NXC, IC = 4
W = jnp.ones((3, 3, 3, 4))         # XOI: (KH, KW, OC/g = 3, IC = 4)
S2 = dict(strides=2, pads_begin=1, pads_end=1, output_padding=1)
DY = jnp.ones((2, 8, 8, 3))        # S*(I-1)+DK-pb-pe+op = 6+3-2+1 = 8
WS = (3, 3, 3, 4)

ct = jaxconv.conv_transpose
ctd = jaxconv.conv_transpose_backward_data
ctw = jaxconv.conv_transpose_backward_weights
ctf = jaxconv.conv_transpose_backprop_filters

CASES = [
    ("outpad-ge-stride", lambda: ct(X, W, strides=2, output_padding=2), ValueError,
     ["conv_transpose: output_padding must be smaller than the stride",
      "output_padding [2, 2] with strides [2, 2]"]),
    ("outpad-stride1", lambda: ctw(X, DY, WS, output_padding=1), ValueError,
     ["output_padding [1, 1] with strides [1, 1]"]),
    ("outpad-negative", lambda: ct(X, W, strides=2, output_padding=-1), ValueError,
     ["output_padding must be >= 0, got [-1, -1]"]),
    ("outpad-length", lambda: ct(X, W, strides=2, output_padding=(1,)), ValueError,
     ["output_padding must have 2 value(s)"]),
    ("dy-spatial", lambda: ctw(X, jnp.ones((2, 9, 8, 3)), WS, **S2), ValueError,
     ["conv_transpose_backward_weights: diff_dst spatial shape must equal the ConvTranspose "
      "output size [8, 8]", "got [9, 8]"]),
    ("dy-spatial-filters", lambda: ctf(X, jnp.ones((2, 7, 7, 3)), (3, 3, 4, 3), **S2), ValueError,
     ["conv_transpose_backprop_filters: output_delta spatial shape must equal", "got [7, 7]"]),
    ("dy-batch", lambda: ctw(X, jnp.ones((1, 8, 8, 3)), WS, **S2), ValueError,
     ["src and diff_dst must have the same batch size, got 2 and 1"]),
    ("iox-per-group-reading", lambda: ctw(
        jnp.ones((1, 4, 1, 1)), jnp.ones((1, 8, 1, 1)), (2, 8, 1, 1), groups=2,
        data_format="NCX", weights_format="IOX"), ValueError,
     ["weights_shape [2, 8, 1, 1] in IOX format holds I=2, O=8",
      "expected I=4 (src channels, the full count) and O=4 (output channels 8 / groups 2)"]),
    ("weights-out", lambda: ctw(X, DY, (3, 3, 2, 4), **S2), ValueError,
     ["weights_shape [3, 3, 2, 4] in XOI format holds I=4, O=2", "O=3"]),
    ("weights-format", lambda: ctw(X, DY, WS, weights_format="OXI", **S2), ValueError,
     ["weights_format must be one of 'IOX', 'XOI', 'OIX', 'XIO', got 'OXI'"]),
    ("filter-format", lambda: ct(X, W, filter_format="HWIO"), ValueError,
     ["conv_transpose: filter_format must be one of"]),
    ("weights-missing", lambda: ctw(X, DY), TypeError,
     ["conv_transpose_backward_weights: weights_shape is required"]),
    ("filter-shape-missing", lambda: ctf(X, DY), TypeError,
     ["conv_transpose_backprop_filters: filter_shape is required"]),
    ("weights-traced", lambda: jax.jit(lambda s: ctw(X, DY, s, **S2))(jnp.array(WS)), TypeError,
     ["weights_shape must be a static value"]),
    ("groups-in", lambda: ct(X, W, groups=3), ValueError,
     ["input channels (4) must be divisible by groups (3)"]),
    ("output-shape-length", lambda: ct(X, W, (8, 8, 8), **S2), ValueError,
     ["conv_transpose: output_shape must hold the 2 spatial output sizes, got 3"]),
    ("output-shape-kind", lambda: ct(X, W, (8.0, 8), **S2), TypeError,
     ["output_shape must hold ints"]),
    ("output-shape-negative", lambda: ct(X, W, (-1, 8), **S2), ValueError,
     ["output_shape must be non-negative, got [-1, 8]"]),
    ("output-shape-traced", lambda: jax.jit(lambda s: ct(X, W, s))(jnp.array((8, 8))), TypeError,
     ["conv_transpose: output_shape must be a static value"]),
    ("pads-remove-output", lambda: ct(X, W, pads_begin=4, pads_end=4), ValueError,
     ["the pads remove more than the whole output", "ConvTranspose output size rule",
      "[-2, -2]"]),
    ("bwd-data-not-an-output", lambda: ctd(jnp.ones((2, 9, 8, 3)), W, **S2), ValueError,
     ["conv_transpose_backward_data: output_delta spatial shape [9, 8] is not a ConvTranspose "
      "output size", "nearest valid sizes [8, 10]"]),
    ("bwd-data-too-small", lambda: ctd(jnp.ones((2, 1, 8, 3)), W, **S2), ValueError,
     ["output_delta spatial shape [1, 8] is not a ConvTranspose output size"]),
    ("bwd-data-channels", lambda: ctd(jnp.ones((2, 8, 8, 5)), W, **S2), ValueError,
     ["filter [3, 3, 3, 4] in XOI format holds I=4, O=3", "O=5"]),
    ("dtype-mismatch", lambda: ctw(X, DY.astype(jnp.bfloat16), WS, **S2), TypeError,
     ["src, diff_dst must have the same dtype"]),
    ("dtype-int", lambda: ct(X.astype(jnp.int8), W.astype(jnp.int8)), TypeError,
     ["conv_transpose: input must have a floating dtype", "int8"]),
    ("not-array", lambda: ctd([1.0], W), TypeError,
     ["conv_transpose_backward_data: output_delta must be a jax.Array"]),
    ("rank", lambda: ct(jnp.ones((2, 4)), W), ValueError, ["input must have rank 3, 4 or 5"]),
    ("auto-pad", lambda: ct(X, W, auto_pad="samelower"), ValueError,
     ["auto_pad must be one of 'none', 'same_upper'", "got 'samelower'; did you mean "
      "'same_lower'?"]),
    # a torch.nn.ConvTranspose2d(16, 8, 3, groups=2) weight, (IC, OC/g, K, K), on NCX data
    # with data_format given but not filter_format (XOI by default)
    ("layout-channels-torch-weight", lambda: ct(
        jnp.ones((1, 16, 7, 7)), jnp.ones((16, 4, 3, 3)), groups=2, data_format="NCX"),
     ValueError, ["filter [16, 4, 3, 3] in XOI format holds", "these shapes match "
                  "filter_format='IOX': pass it"]),
    ("layout-channels-torch-weight-nxc", lambda: ct(
        jnp.ones((1, 16, 7, 7)), jnp.ones((16, 4, 3, 3)), groups=2), ValueError,
     ["these shapes match data_format='NCX', filter_format='IOX': pass them"]),
    ("layout-channels-weights-format", lambda: ctw(X, DY, (4, 3, 3, 3), **S2), ValueError,
     ["these shapes match weights_format='IOX': pass it"]),
    ("lowering-unknown", lambda: ct(X, W, **S2, lowering="phase"), ValueError,
     ["conv_transpose: lowering must be one of ['auto', 'direct', 'grid', 'phases', 'dot', 'vjp', "
      "'onednn', 'onednn_f32', 'winograd', 'winograd_2x2', 'winograd_3x3', 'winograd_4x4', 'per_group', "
      "'block_diagonal'], got 'phase'"]),
    ("lowering-inapplicable", lambda: ctw(X, DY, WS, **S2, lowering="shifted"), ValueError,
     ["conv_transpose_backward_weights: lowering='shifted' does not apply to this problem"]),
]


@pytest.mark.parametrize("thunk,exc,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(no_compute, thunk, exc, parts):
    h.check_bad_input(thunk, exc, parts, OPS)
