"""Property-based tests (hypothesis): every public op on random valid configurations.

For each drawn problem (rank 1-3, data / filter layouts, groups incl. depthwise, asymmetric pads
or auto_pad, strides, dilations, ConvTranspose output_padding / output_shape, OpenVINO
output_shape) each op is checked

* against ``jax.vjp`` of its forward op (the forward op itself against ``lax.conv_general_dilated``),
* against PyTorch autograd in float64 (the independent oracle),
* for linearity in each argument: ``op(a*u + b*v, w) == a*op(u, w) + b*op(v, w)``.

Profiles (tests/conftest.py): ``ci`` (default, a few examples per op) and ``long``
(``HYPOTHESIS_PROFILE=long python -m pytest tests/ops/test_properties.py``, 300 per op).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from jax import lax

import jaxconv
from tests.support import helpers as h
from tests.support import oracles

HIGHEST = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class Problem:
    """A forward convolution x (N, IC, *I) -> y (N, OC, *O) with W OIX (OC, IC/g, *K)."""

    n: int
    ic: int
    oc: int
    groups: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    data_format: str
    seed: int

    @property
    def rank(self) -> int:
        return len(self.spatial)

    @property
    def output(self) -> tuple[int, ...]:
        return tuple((i + b + e - (k - 1) * d - 1) // s + 1 for i, k, s, d, b, e in zip(
            self.spatial, self.kernel, self.strides, self.dilations, self.pads_begin,
            self.pads_end))

    @property
    def remainder(self) -> tuple[int, ...]:
        return tuple((i + b + e - (k - 1) * d - 1) % s for i, k, s, d, b, e in zip(
            self.spatial, self.kernel, self.strides, self.dilations, self.pads_begin,
            self.pads_end))

    def arrays(self):
        rng = np.random.default_rng(self.seed)
        x = rng.standard_normal((self.n, self.ic, *self.spatial))
        w = rng.standard_normal((self.oc, self.ic // self.groups, *self.kernel))
        dy = rng.standard_normal((self.n, self.oc, *self.output))
        return x, w, dy

    def attrs(self) -> dict:
        return dict(strides=self.strides, dilations=self.dilations, pads_begin=self.pads_begin,
                    pads_end=self.pads_end, precision=HIGHEST)


@st.composite
def problems(draw, max_rank: int = 3, ranks=None) -> Problem:
    rank = draw(st.sampled_from(ranks or list(range(1, max_rank + 1))))
    groups_kind = draw(st.sampled_from(["g1", "g2", "depthwise"]))
    g = {"g1": 1, "g2": 2, "depthwise": draw(st.sampled_from([2, 3]))}[groups_kind]
    icg = 1 if groups_kind == "depthwise" else draw(st.integers(1, 3))
    ocg = draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    strides = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    dilations = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    pads_begin = tuple(draw(st.integers(0, 2)) for _ in range(rank))
    pads_end = tuple(draw(st.integers(0, 2)) for _ in range(rank))
    max_size = {1: 12, 2: 8, 3: 5}[rank]
    spatial = []
    for k, d, b, e in zip(kernel, dilations, pads_begin, pads_end):
        lo = max(1, (k - 1) * d + 1 - b - e)  # at least one output
        spatial.append(draw(st.integers(lo, max(lo, max_size))))
    return Problem(n=draw(st.integers(1, 2)), ic=icg * g, oc=ocg * g, groups=g,
                   spatial=tuple(spatial), kernel=kernel, strides=strides, dilations=dilations,
                   pads_begin=pads_begin, pads_end=pads_end,
                   data_format=draw(st.sampled_from(["NCX", "NXC"])), seed=draw(st.integers(0, 99)))


def _close(got, ref):
    h.assert_close(got, ref, jnp.float32)  # float32 at Precision.HIGHEST


def _linear(f, u, v, *rest, arg=0):
    """f is linear in argument ``arg``: f(2u - 3v) == 2 f(u) - 3 f(v)."""
    def at(a):
        args = list(rest)
        args.insert(arg, a)
        return np.asarray(f(*args), np.float64)
    lhs = at(2 * u - 3 * v)
    rhs = 2 * at(u) - 3 * at(v)
    # f(2u - 3v) and 2 f(u) - 3 f(v), each rounded to float32 once per term
    h.assert_close(lhs, rhs, jnp.float32)


def _bilinear(f, a, b, seed):
    """f is linear in each of its two arguments."""
    rng = np.random.default_rng(seed)
    va = jnp.asarray(rng.standard_normal(a.shape), a.dtype)
    vb = jnp.asarray(rng.standard_normal(b.shape), b.dtype)
    _linear(f, a, va, b, arg=0)
    _linear(f, b, vb, a, arg=1)


# ---------------------------------------------------------------- oneDNN Convolution family

def _with_auto_pad(p: Problem, auto_pad: str) -> Problem:
    """The drawn problem with the pads an auto_pad mode gives (an independent SAME rule)."""
    if auto_pad == "none":
        return p
    if auto_pad == "valid":
        pb = pe = (0,) * p.rank
    else:
        pb, pe = h.same_pads(p.spatial, p.kernel, p.strides, p.dilations,
                             upper=auto_pad == "same_upper")
    q = dataclasses.replace(p, pads_begin=tuple(pb), pads_end=tuple(pe))
    assume(all(o >= 1 for o in q.output) and all(
        i + b + e >= (k - 1) * d + 1 for i, b, e, k, d in zip(
            q.spatial, q.pads_begin, q.pads_end, q.kernel, q.dilations)))
    return q


@given(problems(), st.sampled_from(["XIO", "OIX"]),
       st.sampled_from(["none", "same_upper", "same_lower", "valid"]))
def test_convolution_family(p: Problem, filter_format, auto_pad):
    p = _with_auto_pad(p, auto_pad)
    x, w, dy = p.arrays()
    y_t, dx_t, dw_t = oracles.conv_all(x, w, dy, strides=p.strides, dilations=p.dilations,
                                       pads_begin=p.pads_begin, pads_end=p.pads_end,
                                       groups=p.groups)
    df = p.data_format
    xj, dyj = (jnp.asarray(h.data_from_ncx(a, df), jnp.float32) for a in (x, dy))
    wj = jnp.asarray(h.conv_filter_from_oix(w, filter_format), jnp.float32)
    a = dict(p.attrs(), groups=p.groups, data_format=df, filter_format=filter_format)
    if auto_pad != "none":  # the op resolves the pads itself
        a = {k: v for k, v in a.items() if k not in ("pads_begin", "pads_end")}
        a["auto_pad"] = auto_pad

    y = jaxconv.convolution(xj, wj, **a)
    dx = jaxconv.convolution_backward_data(dyj, wj, xj.shape, **a)
    dw = jaxconv.convolution_backprop_filters(xj, dyj, wj.shape, **a)
    dw2 = jaxconv.convolution_backward_weights(
        xj, dyj, wj.shape, **{k: v for k, v in a.items() if k != "filter_format"},
        weights_format=filter_format)
    # torch (independent)
    _close(h.data_to_ncx(y, df), y_t)
    _close(h.data_to_ncx(dx, df), dx_t)
    _close(h.conv_filter_to_oix(dw, filter_format), dw_t)
    _close(dw2, dw)
    # jax.vjp of the forward op
    _, vjp = jax.vjp(lambda x, w: jaxconv.convolution(x, w, **a), xj, wj)
    rx, rw = vjp(dyj)
    _close(dx, rx)
    _close(dw, rw)
    # linearity in each argument of each op
    _bilinear(lambda x, w: jaxconv.convolution(x, w, **a), xj, wj, p.seed)
    _bilinear(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, wj.shape, **a), xj, dyj,
              p.seed + 1)
    _bilinear(lambda dy, w: jaxconv.convolution_backward_data(dy, w, xj.shape, **a), dyj, wj,
              p.seed + 2)


# ---------------------------------------------------------------- oneDNN ConvTranspose family

@given(problems(), st.sampled_from(["IOX", "XOI", "OIX", "XIO"]), st.booleans())
def test_conv_transpose_family(p: Problem, fmt, with_output_shape):
    """The ConvTranspose of the drawn convolution: input = its y, output = its x."""
    x, w, dy = p.arrays()  # transposed roles: input dy (OC ch), output x (IC ch), W IOX = w
    df = p.data_format
    out_size = p.spatial
    a = dict(p.attrs(), groups=p.groups, data_format=df)
    if with_output_shape:
        a.pop("pads_end")
        extra = dict(output_shape=out_size)
    else:
        extra = dict(output_padding=p.remainder)
    if any(r >= s for r, s in zip(p.remainder, p.strides)):  # pragma: no cover - by construction
        return
    y_t, dx_t, dw_t = oracles.conv_transpose_all(dy, w, x, strides=p.strides,
                                                 dilations=p.dilations, pads_begin=p.pads_begin,
                                                 out_size=out_size, groups=p.groups)
    inp = jnp.asarray(h.data_from_ncx(dy, df), jnp.float32)
    grad_out = jnp.asarray(h.data_from_ncx(x, df), jnp.float32)
    wj = jnp.asarray(h.convt_filter_from_iox(w, fmt), jnp.float32)

    y = jaxconv.conv_transpose(inp, wj, out_size if with_output_shape else None, **a,
                               filter_format=fmt, **({} if with_output_shape else extra))
    _close(h.data_to_ncx(y, df), y_t)
    if with_output_shape:
        return  # the gradient ops take output_padding, not output_shape
    dxi = jaxconv.conv_transpose_backward_data(grad_out, wj, **a, filter_format=fmt, **extra)
    dwi = jaxconv.conv_transpose_backward_weights(inp, grad_out, wj.shape, **a,
                                                  weights_format=fmt, **extra)
    dwf = jaxconv.conv_transpose_backprop_filters(inp, grad_out, wj.shape, **a,
                                                  filter_format=fmt, **extra)
    _close(h.data_to_ncx(dxi, df), dx_t)
    _close(h.convt_filter_to_iox(dwi, fmt), dw_t)
    _close(dwf, dwi)
    _, vjp = jax.vjp(lambda i, w: jaxconv.conv_transpose(i, w, **a, filter_format=fmt, **extra),
                     inp, wj)
    ri, rw = vjp(grad_out)
    _close(dxi, ri)
    _close(dwi, rw)
    _bilinear(lambda i, w: jaxconv.conv_transpose(i, w, **a, filter_format=fmt, **extra), inp, wj,
              p.seed)
    _bilinear(lambda g, w: jaxconv.conv_transpose_backward_data(g, w, **a, filter_format=fmt,
                                                                **extra), grad_out, wj, p.seed + 1)
    _bilinear(lambda i, g: jaxconv.conv_transpose_backward_weights(
        i, g, wj.shape, **a, weights_format=fmt, **extra), inp, grad_out, p.seed + 2)


# ---------------------------------------------------------------- OpenVINO family

@given(problems(), st.sampled_from(["explicit", "same_upper", "same_lower", "valid"]),
       st.booleans())
def test_openvino_family(p: Problem, auto_pad, with_output_shape):
    """GroupConvolutionBackpropData against jax.vjp of group_convolution and torch."""
    x, w, dy = p.arrays()
    g = p.groups
    # GroupConvolution [G, C_OUT, C_IN, *K] of the forward = GCBD [G, C_IN, C_OUT, *K]: one array
    fj = jnp.asarray(w.reshape(g, p.oc // g, p.ic // g, *p.kernel), jnp.float32)
    data = jnp.asarray(dy, jnp.float32)
    if auto_pad == "explicit":
        a = dict(p.attrs(), output_padding=p.remainder)
    else:  # same_* and valid: pads from the rule, output size from output_shape or the formula
        a = dict(strides=p.strides, dilations=p.dilations, auto_pad=auto_pad, precision=HIGHEST)
    out_shape = (p.spatial if auto_pad == "explicit" else tuple(s + 1 for s in p.output)) \
        if with_output_shape else None
    y = jaxconv.group_convolution_backprop_data(data, fj, out_shape, **a)
    assert bool(jnp.all(jnp.isfinite(y)))
    if auto_pad == "explicit":
        y_t, dx_t, _ = oracles.conv_all(x, w, dy, strides=p.strides, dilations=p.dilations,
                                        pads_begin=p.pads_begin, pads_end=p.pads_end, groups=g)
        _close(y, dx_t)
        _close(jaxconv.group_convolution(jnp.asarray(x, jnp.float32), fj, **p.attrs()), y_t)
        if not with_output_shape:  # the same layer read from OpenVINO IR
            fn, shape = jaxconv.from_openvino_ir(_gcbd_ir(p, data.shape, fj.shape))
            assert shape == y.shape
            _close(fn(data, fj), y)
        fwd = lambda v: jaxconv.group_convolution(v, fj, **p.attrs())  # noqa: E731
        _close(y, jax.vjp(fwd, jnp.zeros((p.n, p.ic, *p.spatial)))[1](data)[0])
    else:  # torch's transposed convolution, cropped by the rule of SEMANTICS.md section 3
        full = [s * (i - 1) + (k - 1) * d + 1
                for i, k, s, d in zip(p.output, p.kernel, p.strides, p.dilations)]
        size = list(out_shape) if out_shape else full
        totals = [max(0, f - o) for f, o in zip(full, size)]
        pb = [0] * p.rank if auto_pad == "valid" or not out_shape else [
            t // 2 if auto_pad == "same_upper" else t - t // 2 for t in totals]
        y_t, _, _ = oracles.conv_transpose_all(dy, w, None, strides=p.strides,
                                               dilations=p.dilations, pads_begin=pb,
                                               out_size=size, groups=g)
        _close(y, y_t)
    # the G = 1 op on the first group agrees with GroupConvolutionBackpropData on one group
    if g == 1:
        y1 = jaxconv.convolution_backprop_data(data, fj[0], out_shape, **a)
        _close(y1, y)
        _bilinear(lambda d, f: jaxconv.convolution_backprop_data(d, f, out_shape, **a), data,
                  fj[0], p.seed + 2)
    _bilinear(lambda d, f: jaxconv.group_convolution_backprop_data(d, f, out_shape, **a), data, fj,
              p.seed)
    if auto_pad == "explicit":
        _bilinear(lambda v, f: jaxconv.group_convolution(v, f, **p.attrs()),
                  jnp.asarray(x, jnp.float32), fj, p.seed + 1)


def _gcbd_ir(p: Problem, data_shape, filters_shape) -> str:
    def dims(shape):
        return "".join(f"<dim>{d}</dim>" for d in shape)

    def csv(v):
        return ",".join(map(str, v))

    out = (p.n, p.ic, *p.spatial)
    return (f'<layer id="1" name="up" type="GroupConvolutionBackpropData"><data strides='
            f'"{csv(p.strides)}" dilations="{csv(p.dilations)}" pads_begin="{csv(p.pads_begin)}" '
            f'pads_end="{csv(p.pads_end)}" output_padding="{csv(p.remainder)}"/><input><port id="0">'
            f'{dims(data_shape)}</port><port id="1">{dims(filters_shape)}</port></input><output>'
            f'<port id="2" precision="FP32">{dims(out)}</port></output></layer>')


# ---------------------------------------------------------------- Ascend TBE

@given(problems(ranks=[2]))
def test_tbe_conv2d_backprop_filter(p: Problem):
    x, w, dy = p.arrays()
    _, _, dw_t = oracles.conv_all(x, w, dy, strides=p.strides, dilations=p.dilations,
                                  pads_begin=p.pads_begin, pads_end=p.pads_end, groups=p.groups)
    para = {"strides": list(p.strides),
            "padding": [p.pads_begin[0], p.pads_end[0], p.pads_begin[1], p.pads_end[1]],
            "dilations": [1, 1, *p.dilations], "groups": p.groups}
    x5 = jaxconv.tbe.to_5hd(jnp.asarray(x, jnp.float32))
    dy5 = jaxconv.tbe.to_5hd(jnp.asarray(dy, jnp.float32))
    res = jaxconv.conv2d_backprop_filter(x5, dy5, w.shape, para)
    dw = jaxconv.tbe.from_fractal_z(res, w.shape, p.groups)
    _close(dw, dw_t)
    _bilinear(lambda a, b: jaxconv.conv2d_backprop_filter(a, b, w.shape, para), x5, dy5, p.seed)


@given(st.integers(1, 2), st.integers(1, 40), st.integers(1, 5), st.integers(1, 5),
       st.integers(1, 4))
def test_tbe_layout_round_trips(n, channels, h_, w_, groups):
    rng = np.random.default_rng(channels)
    x = jnp.asarray(rng.standard_normal((n, channels, h_, w_)), jnp.float32)
    x5 = jaxconv.tbe.to_5hd(x)
    assert x5.shape == (n, -(-channels // 16), h_, w_, 16)
    np.testing.assert_array_equal(jaxconv.tbe.from_5hd(x5, channels), x)
    cout, cin_g = 4 * groups, 1 + channels % 7
    wt = jnp.asarray(rng.standard_normal((cout, cin_g, h_, w_)), jnp.float32)
    wz = jaxconv.tbe.to_fractal_z(wt, groups)
    assert wz.shape == jaxconv.tbe.fractal_z_shape((cout, cin_g, h_, w_), groups)
    np.testing.assert_array_equal(jaxconv.tbe.from_fractal_z(wz, wt.shape, groups), wt)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_strategy_draws_every_feature(rank):
    """A test of the test: the strategy reaches strides, dilations, groups and pads."""
    seen = set()

    @given(problems(ranks=[rank]))
    def collect(p):
        seen.update({("stride", max(p.strides) > 1), ("dilation", max(p.dilations) > 1),
                     ("groups", p.groups > 1), ("asym", p.pads_begin != p.pads_end),
                     ("nxc", p.data_format == "NXC")})

    collect()
    assert {(k, True) for k in ("stride", "dilation", "groups", "asym", "nxc")} <= seen
