"""Every validation error of the oneDNN convolution family.

Each bad call must raise the stated exception type, before any computation
(``lax.conv_general_dilated`` and ``lax.pad`` are booby-trapped here), with a
message that starts with the op's name, names the argument, and says what was
expected and what was given.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from tests.support import helpers as h

OPS = re.compile(
    r"^(convolution|convolution_backward_data|convolution_backprop_filters|"
    r"convolution_backward_weights): ")

X = jnp.ones((2, 8, 8, 4))        # NXC, IC = 4
DY = jnp.ones((2, 8, 8, 6))       # same_upper / pads 1 output, OC = 6
W = jnp.ones((3, 3, 4, 6))        # XIO
FS = (3, 3, 4, 6)
P1 = dict(pads_begin=1, pads_end=1)

bpf = jaxconv.convolution_backprop_filters
bww = jaxconv.convolution_backward_weights
bwd = jaxconv.convolution_backward_data
fwd = jaxconv.convolution


def _traced_shape():
    return jax.jit(lambda s: bpf(X, DY, s, **P1))(jnp.array(FS))


CASES = [
    # (id, thunk, exception, [substrings that must appear])
    ("x-not-array", lambda: bpf([[1.0]], DY, FS), TypeError,
     ["convolution_backprop_filters: input_forward must be a jax.Array or numpy.ndarray", "list"]),
    ("x-rank-2", lambda: bpf(jnp.ones((2, 4)), DY, FS), ValueError,
     ["input_forward must have rank 3, 4 or 5", "got rank 2"]),
    ("x-rank-6", lambda: bpf(jnp.ones((1,) * 6), DY, FS), ValueError,
     ["input_forward must have rank", "got rank 6"]),
    ("dy-rank", lambda: bpf(X, jnp.ones((2, 8, 6)), FS, **P1), ValueError,
     ["output_delta must have rank 4 like input_forward", "got rank 3"]),
    ("shape-missing", lambda: bpf(X, DY), TypeError, ["filter_shape is required"]),
    ("shape-length", lambda: bpf(X, DY, (3, 3, 4), **P1), ValueError,
     ["filter_shape must have 4 entries", "got 3"]),
    ("shape-floats", lambda: bpf(X, DY, (3.0, 3, 4, 6), **P1), TypeError,
     ["filter_shape must hold ints"]),
    ("shape-2d-array", lambda: bpf(X, DY, np.ones((2, 2), np.int32), **P1), TypeError,
     ["filter_shape must be a 1-D integer array", "(2, 2)"]),
    ("shape-traced", _traced_shape, TypeError, ["filter_shape must be a static value", "traced"]),
    ("shape-nonpositive", lambda: bpf(X, DY, (0, 3, 4, 6), **P1), ValueError,
     ["filter_shape must be positive", "[0, 3, 4, 6]"]),
    ("in-channels", lambda: bpf(X, DY, (3, 3, 3, 6), **P1), ValueError,
     ["filter_shape [3, 3, 3, 6] in XIO format holds O=6, I=3", "expected O=6", "I=4"]),
    ("out-channels", lambda: bpf(X, DY, (3, 3, 4, 5), **P1), ValueError,
     ["filter_shape [3, 3, 4, 5]", "O=5", "expected O=6"]),
    ("in-channels-groups", lambda: bpf(X, DY, (3, 3, 4, 6), groups=3, **P1), ValueError,
     ["input_forward channels (4) must be divisible by groups (3)"]),
    ("out-channels-groups", lambda: bpf(jnp.ones((2, 8, 8, 6)), jnp.ones((2, 8, 8, 4)),
                                        (3, 3, 2, 4), groups=3, **P1), ValueError,
     ["output channels (4) must be divisible by groups (3)"]),
    ("groups-zero", lambda: bpf(X, DY, FS, groups=0, **P1), ValueError, ["groups must be >= 1, got 0"]),
    ("groups-float", lambda: bpf(X, DY, FS, groups=2.0, **P1), TypeError, ["groups must be an int"]),
    ("dy-spatial", lambda: bpf(X, DY, FS), ValueError,
     ["output_delta spatial shape must equal the forward output size [6, 6]", "got [8, 8]"]),
    ("dy-spatial-stride", lambda: bpf(X, DY, FS, strides=2, **P1), ValueError,
     ["forward output size [4, 4]", "strides [2, 2]", "got [8, 8]"]),
    ("batch", lambda: bpf(X, jnp.ones((3, 8, 8, 6)), FS, **P1), ValueError,
     ["input_forward and output_delta must have the same batch size, got 2 and 3"]),
    ("strides-zero", lambda: bpf(X, DY, FS, strides=(1, 0), **P1), ValueError,
     ["strides must be positive, got [1, 0]"]),
    ("dilations-negative", lambda: bpf(X, DY, FS, dilations=-1, **P1), ValueError,
     ["dilations must be positive, got [-1, -1]"]),
    ("pads-negative", lambda: bpf(X, DY, FS, pads_begin=(1, -1), pads_end=1), ValueError,
     ["pads_begin must be >= 0, got [1, -1]"]),
    ("strides-length", lambda: bpf(X, DY, FS, strides=(1, 1, 1), **P1), ValueError,
     ["strides must have 2 value(s), one per spatial axis, got 3"]),
    ("pads-end-length", lambda: bpf(X, DY, FS, pads_begin=1, pads_end=(1,)), ValueError,
     ["pads_end must have 2 value(s)", "got 1"]),
    ("strides-kind", lambda: bpf(X, DY, FS, strides="2", **P1), TypeError,
     ["strides must be an int or a sequence of ints"]),
    ("auto-pad-unknown", lambda: bpf(X, DY, FS, auto_pad="same_uper"), ValueError,
     ["auto_pad must be one of 'none', 'same_upper', 'same_lower', 'valid'",
      "'same' means 'same_upper'", "got 'same_uper'; did you mean 'same_upper'?"]),
    ("auto-pad-unknown-typo-of-explicit", lambda: bpf(X, DY, FS, auto_pad="explict"), ValueError,
     ["got 'explict'; did you mean 'none'?"]),
    # NCX data passed without data_format: the filter's channels disagree with the
    # misread data, and the error names the layout that explains it
    ("layout-channels-ncx-data", lambda: fwd(jnp.ones((2, 4, 9, 9)), W), ValueError,
     ["filter [3, 3, 4, 6] in XIO format holds O=6, I=4; expected",
      "these shapes match data_format='NCX': pass it"]),
    ("layout-channels-ncx-data-and-oix", lambda: bpf(
        jnp.ones((2, 4, 9, 9)), jnp.ones((2, 6, 9, 9)), (6, 4, 3, 3), **P1), ValueError,
     ["these shapes match data_format='NCX', filter_format='OIX': pass them"]),
    ("auto-pad-kind", lambda: bpf(X, DY, FS, auto_pad=1), TypeError, ["auto_pad must be a string"]),
    ("data-format", lambda: bpf(X, DY, FS, data_format="NHWC", **P1), ValueError,
     ["data_format must be one of 'NXC', 'NCX', got 'NHWC'"]),
    ("filter-format", lambda: bpf(X, DY, FS, filter_format="IOX", **P1), ValueError,
     ["filter_format must be one of 'XIO', 'OIX', got 'IOX'"]),
    ("dtype-mismatch", lambda: bpf(X, DY.astype(jnp.float16), FS, **P1), TypeError,
     ["input_forward, output_delta must have the same dtype", "float32", "float16"]),
    ("dtype-int", lambda: bpf(X.astype(jnp.int32), DY.astype(jnp.int32), FS, **P1), TypeError,
     ["input_forward must have a floating dtype", "int32"]),
    ("dtype-bool", lambda: bpf(X > 0, DY > 0, FS, **P1), TypeError,
     ["must have a numeric dtype, got bool"]),
    ("kernel-too-big", lambda: bpf(X, DY, (11, 3, 4, 6)), ValueError,
     ["the dilated kernel [11, 3] is larger than the padded input_forward [8, 8]",
      "oneDNN's output size rule", "gives [-2, 6]"]),
    ("precision", lambda: bpf(X, DY, FS, precision="max", **P1), ValueError,
     ["precision must be None, a lax.Precision", "'max'"]),
    ("preferred-type", lambda: bpf(X, DY, FS, preferred_element_type="nope", **P1), TypeError,
     ["preferred_element_type must be a dtype or None"]),
    ("preferred-int", lambda: bpf(X, DY, FS, preferred_element_type=jnp.int32, **P1), TypeError,
     ["preferred_element_type must be a floating dtype for float32 inputs, got int32"]),
    # the alias speaks oneDNN's current names
    ("alias-names", lambda: bww(X, DY, (3, 3, 3, 6), **P1), ValueError,
     ["convolution_backward_weights: weights_shape [3, 3, 3, 6] in XIO format"]),
    ("alias-format", lambda: bww(X, DY, FS, weights_format="XOI", **P1), ValueError,
     ["convolution_backward_weights: weights_format must be one of"]),
    ("alias-dy", lambda: bww(X, DY, FS), ValueError,
     ["convolution_backward_weights: diff_dst spatial shape must equal"]),
    ("alias-missing", lambda: bww(X, DY), TypeError,
     ["convolution_backward_weights: weights_shape is required"]),
    # convolution_backward_data
    ("bwd-input-shape-length", lambda: bwd(DY, W, (8, 8, 8), **P1), ValueError,
     ["convolution_backward_data: input_shape must hold 2 spatial sizes or the full 4-entry shape",
      "got 3"]),
    ("bwd-input-shape-batch", lambda: bwd(DY, W, (3, 8, 8, 4), **P1), ValueError,
     ["input_shape [3, 8, 8, 4] has batch 3, but output_delta has batch 2"]),
    ("bwd-input-shape-channels", lambda: bwd(DY, W, (2, 8, 8, 5), **P1), ValueError,
     ["input_shape [2, 8, 8, 5] has 5 channels", "give 4"]),
    ("bwd-input-shape-traced", lambda: jax.jit(lambda s: bwd(DY, W, s, **P1))(jnp.array((8, 8))),
     TypeError, ["convolution_backward_data: input_shape must be a static value"]),
    ("bwd-dy-spatial", lambda: bwd(DY, W, (8, 8)), ValueError,
     ["output_delta spatial shape must equal the forward output size [6, 6]"]),
    ("bwd-filter-rank", lambda: bwd(DY, jnp.ones((3, 4, 6)), (8, 8), **P1), ValueError,
     ["convolution_backward_data: filter must have rank 4 like output_delta, got rank 3"]),
    ("bwd-filter-channels", lambda: bwd(DY, jnp.ones((3, 3, 4, 5)), (8, 8), **P1), ValueError,
     ["filter [3, 3, 4, 5] in XIO format holds O=5"]),
    ("bwd-dtype", lambda: bwd(DY, W.astype(jnp.bfloat16), (8, 8), **P1), TypeError,
     ["output_delta, filter must have the same dtype"]),
    # convolution (forward)
    ("fwd-filter-not-array", lambda: fwd(X, (3, 3, 4, 6)), TypeError,
     ["convolution: filter must be a jax.Array or numpy.ndarray", "tuple"]),
    ("fwd-filter-rank", lambda: fwd(X, jnp.ones((3, 4, 6))), ValueError,
     ["convolution: filter must have 4 entries for 2 spatial axes, got 3"]),
    ("fwd-channels", lambda: fwd(X, jnp.ones((3, 3, 2, 6))), ValueError,
     ["convolution: filter [3, 3, 2, 6] in XIO format holds O=6, I=2", "I=4"]),
    ("fwd-groups", lambda: fwd(X, jnp.ones((3, 3, 4, 6)), groups=2), ValueError,
     ["filter [3, 3, 4, 6] in XIO format holds O=6, I=4", "I=2 (input channels 4 / groups 2)"]),
    ("lowering-unknown", lambda: bpf(X, DY, FS, **P1, lowering="fast"), ValueError,
     ["convolution_backprop_filters: lowering must be one of ['auto', 'direct', 'conv', 'feature_group', "
      "'shifted', 'dot', 'vjp', 'onednn', 'onednn_f32', 'winograd', 'winograd_2x2', 'winograd_3x3', "
      "'winograd_4x4', 'per_group', 'block_diagonal'], got 'fast'"]),
    ("lowering-inapplicable-shifted", lambda: bpf(X, DY, FS, **P1, lowering="shifted"), ValueError,
     ["convolution_backprop_filters: lowering='shifted' does not apply to this problem: 'shifted' "
      "needs one input channel per group (depthwise), got 4 input channels in 1 group(s); use one "
      "of ['auto', 'direct', 'conv', 'dot', 'vjp']"]),
    ("lowering-inapplicable-feature-group",
     lambda: bww(X, DY, FS, **P1, lowering="feature_group"), ValueError,
     ["convolution_backward_weights: lowering='feature_group' does not apply", "groups=1"]),
    ("lowering-unknown-data", lambda: bwd(DY, W, (8, 8), **P1, lowering="fft"), ValueError,
     ["convolution_backward_data: lowering must be one of ['auto', 'direct', 'grid', 'phases', 'dot', "
      "'vjp', 'onednn', 'onednn_f32', 'winograd', 'winograd_2x2', 'winograd_3x3', 'winograd_4x4', "
      "'per_group', 'block_diagonal'], got 'fft'"]),
    ("lowering-unknown-forward", lambda: fwd(X, W, lowering="grid"), ValueError,
     ["convolution: lowering must be one of ['auto', 'direct', 'conv', 'dot', 'shifted', 'onednn', "
      "'onednn_f32', 'winograd', 'winograd_2x2', 'winograd_3x3', 'winograd_4x4', 'per_group', "
      "'block_diagonal'], got 'grid'"]),
    ("lowering-inapplicable-forward", lambda: fwd(X, W, lowering="shifted"), ValueError,
     ["convolution: lowering='shifted' does not apply to this problem: 'shifted' needs one "
      "input channel per group (depthwise), got 4 input channels in 1 group(s); use one of "
      "['auto', 'direct', 'conv', 'dot']"]),
    ("lowering-kind", lambda: bwd(DY, W, (8, 8), **P1, lowering=1), TypeError,
     ["convolution_backward_data: lowering must be a string", "got 1"]),
]


@pytest.mark.parametrize("thunk,exc,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(no_compute, thunk, exc, parts):
    h.check_bad_input(thunk, exc, parts, OPS)



def test_bad_input_names_the_op_of_the_call():
    """Each op's messages start with its own name."""
    with pytest.raises(ValueError, match=r"^convolution_backprop_filters: "):
        bpf(X, DY, FS)
    with pytest.raises(ValueError, match=r"^convolution_backward_weights: "):
        bww(X, DY, FS)
    with pytest.raises(ValueError, match=r"^convolution_backward_data: "):
        bwd(DY, W, (8, 8))
    with pytest.raises(ValueError, match=r"^convolution: "):
        fwd(X, W, strides=0)
