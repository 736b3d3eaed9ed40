"""No negative pad reaches XLA, and every entry point computes crops right (docs/semantics.md,
"Negative pads"; HAZARDS: XLA:CPU reads beside the input of a convolution with a negative pad).

The oracle is PyTorch (float64) on the input cropped and padded by ``F.pad``. XLA:CPU's wrong
values come from the memory beside the input, so every case first allocates and frees arrays
of large non-zero values (``_dirty``): the memory the program's buffers then reuse is not
fresh zeros. Each case also asserts that no convolution or pad of the compiled program has a
negative width, the property itself, whatever the memory holds.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import lowering
from jaxconv._src.kernel import Kernel
from tests.support import helpers as h
from tests.support import oracles

torch = pytest.importorskip("torch")
F = torch.nn.functional

HIGHEST = lax.Precision.HIGHEST
#: (input dtype, preferred_element_type): float32, and 16-bit with and without a wide result
DTYPES = [(jnp.float32, None), (jnp.float16, None), (jnp.float16, jnp.float32),
          (jnp.bfloat16, None), (jnp.bfloat16, jnp.float32)]
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _dirty(*arrays):
    """Fills and frees memory that the next buffers reuse (large values, not zeros), then
    returns fresh copies of ``arrays``: XLA:CPU's wrong values come from beside its input."""
    for size in (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20):
        for dtype in (jnp.float32, jnp.float16):
            jax.block_until_ready(jnp.full((size,), 1e4, dtype) + 0)
        junk = np.full((size,), 1e30, np.float32)
        del junk
    return [jnp.array(np.asarray(a)) for a in arrays]


def _torch_cropped(x_ncx, w_oix, dy_ncx, *, pads, strides, dilations, groups=1):
    """(y, dx, dW) of PyTorch's convolution of x cropped and padded by ``pads`` (F.pad:
    negative widths crop), float64."""
    return oracles.conv_all(x_ncx, w_oix, dy_ncx, strides=strides, dilations=dilations,
                            pads_begin=[lo for lo, _ in pads], pads_end=[hi for _, hi in pads],
                            groups=groups)


def _check(outs, refs, dtype, pet):
    """y in the result's precision; the gradients come back in their primal's dtype."""
    y, *grads = outs
    y_ref, *grad_refs = refs
    h.assert_close(y, y_ref, pet or dtype)
    for got, want in zip(grads, grad_refs):
        h.assert_close(got, want, dtype)


# --------------------------------------------- lax's negative pads: the user's convolution

# (spatial size, kernel, stride, dilation, pads) per case: low and high crops, beside
# positive pads, on one to three spatial axes
_LAX_CASES = [
    ((9,), (2,), (1,), (1,), [(-3, 1)]),
    ((9,), (3,), (2,), (1,), [(2, -2)]),
    ((8,), (2,), (1,), (2,), [(-1, -2)]),
    ((7, 8), (3, 3), (1, 1), (1, 1), [(-1, 1), (0, -1)]),
    ((7, 8), (3, 2), (2, 1), (1, 2), [(1, -2), (-2, 2)]),
    ((5, 6, 5), (2, 3, 2), (1, 1, 2), (1, 1, 1), [(-1, 0), (1, -2), (0, 1)]),
]


def _lax_problem(case, dtype, rng):
    size, kernel, _, _, _ = case
    x = h.random(rng, (2, 3, *size), dtype)
    w = h.random(rng, (4, 3, *kernel), dtype)
    return x, w


def _out_shape(case):
    size, kernel, strides, dil, pads = case
    return [(i + lo + hi - (k - 1) * d - 1) // s + 1
            for i, k, s, d, (lo, hi) in zip(size, kernel, strides, dil, pads)]


@pytest.mark.parametrize("dtype,pet", DTYPES, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("case", _LAX_CASES, ids=lambda c: f"{len(c[0])}d-{c[4]}")
@pytest.mark.parametrize("entry", ["jaxconv", "accelerate"])
def test_lax_negative_pads(entry, case, dtype, pet):
    """``jaxconv.conv_general_dilated`` and ``accelerate`` over a user's lax convolution with
    negative pads: the value and both gradients, against PyTorch on the cropped input."""
    rng = np.random.default_rng(0)
    size, kernel, strides, dil, pads = case
    x, w = _lax_problem(case, dtype, rng)
    dy = h.random(rng, (2, 4, *_out_shape(case)), pet or dtype)
    conv = jaxconv.conv_general_dilated if entry == "jaxconv" else lax.conv_general_dilated

    def f(x, w):
        return conv(x, w, strides, pads, rhs_dilation=dil, precision=HIGHEST,
                    preferred_element_type=pet)

    def step(x, w, dy):
        y, vjp = jax.vjp(f, x, w)
        return (y, *vjp(dy))

    run = jax.jit(jaxconv.accelerate(step) if entry == "accelerate" else step)
    assert h.negative_widths(run, x, w, dy) == []
    ref = _torch_cropped(h.to_f64(x), h.to_f64(w), h.to_f64(dy), pads=pads, strides=strides,
                         dilations=dil)
    for _ in range(2):
        _check(run(*_dirty(x, w, dy)), ref, dtype, pet)


@pytest.mark.parametrize("pads", [[(4, 4)], [(5, 1)]], ids=str)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: d.__name__)
def test_accelerate_gradient_of_pads_past_the_kernel(pads, dtype):
    """A user's forward convolution padded past its kernel: the data gradient JAX's transpose
    rule writes has a negative pad; under ``accelerate`` it is right, and no negative pad is
    lowered."""
    rng = np.random.default_rng(1)
    x, w = h.random(rng, (2, 3, 6), dtype), h.random(rng, (4, 3, 2), dtype)
    dy = h.random(rng, (2, 4, 6 + sum(pads[0]) - 1), dtype)

    def step(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: lax.conv_general_dilated(
            x, w, (1,), pads, precision=HIGHEST), x, w)
        return (y, *vjp(dy))

    run = jax.jit(jaxconv.accelerate(step))
    assert h.negative_widths(run, x, w, dy) == []
    ref = _torch_cropped(h.to_f64(x), h.to_f64(w), h.to_f64(dy), pads=pads, strides=(1,),
                         dilations=(1,))
    _check(run(*_dirty(x, w, dy)), ref, dtype, None)


# ------------------------------- ConvTranspose / GroupConvolutionBackpropData past the kernel

def _data_methods():
    """Every data-gradient method but the Winograd family (3x3 stride-1 2-D only) and the
    combinators (grouped problems: per_group and block_diagonal run below with groups)."""
    return [m for m in lowering.methods(Kernel.DATA) if not m.startswith("winograd")]


# (size, kernel, stride, dilation, pads_begin, pads_end, groups): pads_begin past the dilated
# kernel minus one, the hidden case's (1-D, kernel 2, stride 1, pads_begin 3) first
_CT_CASES = [
    ((20,), (2,), (1,), (1,), (3,), (0,), 1),
    ((7,), (3,), (2,), (1,), (4,), (3,), 1),
    ((6, 5), (2, 3), (1, 2), (2, 1), (3, 4), (1, 0), 2),
    ((4, 3, 4), (2, 2, 2), (1, 1, 2), (1, 1, 1), (2, 3, 1), (0, 1, 2), 1),
]


def _ct_case_id(c):
    return f"{len(c[0])}d-k{c[1]}-s{c[2]}-pb{c[4]}-g{c[6]}"


def _convt_ref(x, w_iox, dy, case):
    size, kernel, strides, dil, pb, pe, groups = case
    out = [s * (i - 1) + (k - 1) * d + 1 - a - b
           for i, k, s, d, a, b in zip(size, kernel, strides, dil, pb, pe)]
    return oracles.conv_transpose_all(x, w_iox, dy, strides=strides, dilations=dil,
                                      pads_begin=pb, out_size=out, groups=groups), out


@pytest.mark.parametrize("dtype,pet", DTYPES[:3], ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("case", _CT_CASES, ids=_ct_case_id)
@pytest.mark.parametrize("method", ["auto", *_data_methods()])
def test_conv_transpose_pads_past_the_kernel(method, case, dtype, pet):
    """``conv_transpose`` (the data-gradient kernel) with every lowering that takes the problem,
    and its gradients, against PyTorch's ConvTranspose cropped at pads_begin."""
    size, kernel, strides, dil, pb, pe, groups = case
    if method in ("per_group", "block_diagonal") and groups == 1:
        pytest.skip(f"{method} computes grouped problems only")  # they run on the g2 case
    rng = np.random.default_rng(2)
    ic, ocg = 2 * groups, 3
    x = h.random(rng, (2, ic, *size), dtype)
    w = h.random(rng, (ic, ocg, *kernel), dtype)  # IOX
    (y_ref, _, _), out = _convt_ref(h.to_f64(x), h.to_f64(w), None, case)
    dy = h.random(rng, (2, groups * ocg, *out), pet or dtype)
    ref = _convt_ref(h.to_f64(x), h.to_f64(w), h.to_f64(dy), case)[0]

    def f(x, w):
        return jaxconv.conv_transpose(x, w, strides=strides, pads_begin=pb, pads_end=pe,
                                      dilations=dil, groups=groups, data_format="NCX",
                                      filter_format="IOX", precision=HIGHEST,
                                      preferred_element_type=pet, lowering=method)

    def step(x, w, dy):
        y, vjp = jax.vjp(f, x, w)
        return (y, *vjp(dy))

    try:
        jax.eval_shape(f, x, w)
    except ValueError as e:
        if "does not apply" in str(e) or "cannot" in str(e):
            pytest.skip(f"{method} does not compute this problem: {e}")
        raise
    assert h.negative_widths(step, x, w, dy) == []
    for _ in range(2):
        _check(jax.jit(step)(*_dirty(x, w, dy)), ref, dtype, pet)


@pytest.mark.parametrize("dtype,pet", DTYPES[:3], ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("method", ["auto", "vjp", "grid", "phases", "dot"])
def test_group_convolution_backprop_data_pads_past_the_kernel(method, dtype, pet):
    """OpenVINO's GroupConvolutionBackpropData with pads past the kernel (G = 2, 2-D)."""
    rng = np.random.default_rng(3)
    g, cin, cout = 2, 2, 3
    size, kernel, strides, pb, pe = (5, 4), (2, 3), (2, 1), (3, 4), (2, 0)
    x = h.random(rng, (2, g * cin, *size), dtype)
    w = h.random(rng, (g, cin, cout, *kernel), dtype)
    case = (size, kernel, strides, (1, 1), pb, pe, g)
    (_, _, _), out = _convt_ref(h.to_f64(x), h.to_f64(w).reshape(g * cin, cout, *kernel), None,
                                case)
    dy = h.random(rng, (2, g * cout, *out), pet or dtype)
    ref = _convt_ref(h.to_f64(x), h.to_f64(w).reshape(g * cin, cout, *kernel), h.to_f64(dy),
                     case)[0]

    def step(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: jaxconv.group_convolution_backprop_data(
            x, w, strides=strides, pads_begin=pb, pads_end=pe, precision=HIGHEST,
            preferred_element_type=pet, lowering=method), x, w)
        dx, dw = vjp(dy)
        return y, dx, dw.reshape(g * cin, cout, *kernel)

    assert h.negative_widths(step, x, w, dy) == []
    _check(jax.jit(step)(*_dirty(x, w, dy)), ref, dtype, pet)


def test_the_hazard_is_real_here_or_fixed():
    """The control: plain ``lax.conv_general_dilated`` with a negative low pad, in this dirty
    process. Where this jaxlib still computes it wrong, the sweep above ran where a lowering
    that handed XLA a negative pad would have failed; where it computes it right, say so."""
    rng = np.random.default_rng(0)
    x = h.random(rng, (2, 16, 16, 8))
    w = h.random(rng, (3, 3, 8, 8))
    dn = ("NHWC", "HWIO", "NHWC")
    cropped = lax.conv_general_dilated(x[:, 1:], w, (1, 1), [(0, 1), (0, 0)],
                                       dimension_numbers=dn, precision=HIGHEST)
    worst = 0.0
    for _ in range(8):
        got = lax.conv_general_dilated(*_dirty(x, w), (1, 1), [(-1, 1), (0, 0)],
                                       dimension_numbers=dn, precision=HIGHEST)
        worst = max(worst, float(jnp.abs(got - cropped).max()))
    if worst < 1e-3:
        pytest.skip(f"jax {jax.__version__}: lax's negative pad computed right in this process "
                    f"(the sweep still checks that no negative pad is lowered)")
    ours = jaxconv.conv_general_dilated(x, w, (1, 1), [(-1, 1), (0, 0)], dimension_numbers=dn,
                                        precision=HIGHEST)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(cropped), atol=1e-4)


def test_crop_helpers_match_lax():
    """``lax_refs.pad`` and ``lax_refs.conv`` give lax's values (shape included) for every
    width in a small range, interior and input dilation included, empty crops too."""
    from jaxconv._src import lax_refs

    a = jnp.arange(1.0, 6.0)
    for lo, hi, interior in itertools.product(range(-8, 3), range(-8, 3), range(3)):
        if (5 - 1) * (interior + 1) + 1 + lo + hi < 0:
            continue
        want = np.asarray(lax.pad(a, 0.0, [(lo, hi, interior)]))
        got = np.asarray(lax_refs.pad(a, 0.0, [(lo, hi, interior)]))
        assert got.shape == want.shape and np.array_equal(got, want), (lo, hi, interior)
    rng = np.random.default_rng(4)
    x, w = h.random(rng, (1, 2, 5)), h.random(rng, (3, 2, 2))
    for lo, hi, s in itertools.product(range(-10, 2), range(-10, 2), (1, 2)):
        span = (5 - 1) * s + 1 + lo + hi
        if span < 2:
            continue
        spread = lax.pad(x, 0.0, [(0, 0, 0), (0, 0, 0), (lo, hi, s - 1)])  # lax's pad: exact
        want = lax.conv_general_dilated(spread, w, (1,), "VALID", precision=HIGHEST)
        got = lax_refs.conv(x, w, (1,), [(lo, hi)], (s,), precision=HIGHEST)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5,
                                   err_msg=str((lo, hi, s)))
