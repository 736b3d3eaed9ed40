"""Tap products (``native/onednn/taps.h``): a data gradient as one matrix product per filter
tap on oneDNN's matmul, the products placed on dx.

The layout trial offers them as a candidate for a float32, one-group, channels-last data
gradient whose filter's taps merge into one axis; kept by an earlier process's verdict
(``library.remember``), they compute what ``jax.vjp`` of lax's forward convolution computes at
HIGHEST. A problem outside their reach (groups, channels-first data) is never offered them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support.onednn_matrix import HIGHEST, needs_onednn

# (id, x shape (N, X..., C), kernel, out channels, strides, dilations, pads_begin, pads_end,
#  filter format; "transpose": jaxconv.conv_transpose of the filter in ConvTranspose's XIO,
#  whose taps are plain O x I matrices): a DCGAN layer's filter-heavy batch-1 problem (chunks
#  of its channels), a light one whose rows split (single-threaded chunks, each its own
#  problem), a batch, 1D and 3D
CASES = [
    ("dcgan-4x4-s2", (1, 8, 8, 32), (4, 4), 64, (2, 2), (1, 1), (1, 1), (1, 1), "XIO"),
    ("dcgan-transpose", (1, 8, 8, 32), (4, 4), 64, (2, 2), (1, 1), (1, 1), (1, 1), "transpose"),
    ("rows-3x3", (1, 9, 7, 8), (3, 3), 8, (1, 1), (1, 1), (1, 0), (1, 2), "XIO"),
    ("batch-uneven", (3, 7, 6, 16), (3, 2), 24, (2, 3), (1, 1), (2, 0), (0, 1), "XIO"),
    ("1d-dilated", (2, 17, 8), (3,), 16, (3,), (2,), (1,), (2,), "XIO"),
    ("3d", (1, 4, 5, 4, 8), (2, 3, 2), 16, (2, 1, 2), (1, 1, 1), (0, 1, 1), (1, 1, 0), "XIO"),
]


def _case(case):
    _, xs, kernel, out, s, d, pb, pe, fmt = case
    n = len(kernel)
    rng = np.random.default_rng(len(case[0]))
    w_xio = h.random(rng, (*kernel, xs[-1], out))
    spec = "".join("DHW"[3 - n:]) if n > 1 else "W"
    dn = (f"N{spec}C", f"{spec}IO", f"N{spec}C")

    def forward(x):
        return lax.conv_general_dilated(x, w_xio, s, list(zip(pb, pe)), None, d, dn,
                                        precision=HIGHEST)
    x = jnp.zeros(xs)
    dy = h.random(rng, jax.eval_shape(forward, x).shape)
    want = jax.vjp(forward, x)[1](dy)[0]
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, data_format="NXC",
                 precision=HIGHEST)
    if fmt == "transpose":  # the ConvTranspose's I is the forward's O: (X, O, I) of the forward
        w = jnp.swapaxes(w_xio, n, n + 1)
        return (lambda: jaxconv.conv_transpose(dy, w, xs[1:-1], **attrs, filter_format="XIO",
                                               lowering="onednn")), want
    return (lambda: jaxconv.convolution_backward_data(dy, w_xio, xs, **attrs, filter_format=fmt,
                                                      lowering="onednn")), want


def _mine(xs):
    """The cache's entries of a case's calls: the whole problem's, its chunks of rows', or
    its chunks of channels' (a part of x's channels)."""
    return [c for c in library.choices() if c["kernel"] == "data" and c["x"][0] == xs[0]
            and xs[-1] % c["x"][-1] == 0 and c["x"][2:-1] == tuple(xs[2:-1])]


@needs_onednn
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_tap_products_compute_the_data_gradient(case, layout_trial):
    run, want = _case(case)
    h.assert_close(jax.block_until_ready(run()), want, jnp.float32)
    mine = _mine(case[1])
    assert mine, library.choices()
    taps = [[r for r in c["candidates"] if r["layout"] == "taps"] for c in mine]
    assert all(t and t[0]["impl"].startswith("taps:") for t in taps), mine
    library.forget()
    assert library.remember({c["key"]: ("taps", t[0]["impl"]) for c, t in zip(mine, taps)}) \
        == len(mine)
    h.assert_close(jax.block_until_ready(run()), want, jnp.float32)
    again = _mine(case[1])
    assert again and all(c["source"] == "cache" and c["candidates"][0]["layout"] == "taps"
                         for c in again), again


@needs_onednn
@pytest.mark.parametrize("groups, layout", [(2, "NXC"), (1, "NCX")])
def test_no_tap_products_for_groups_or_channels_first(groups, layout, layout_trial):
    rng = np.random.default_rng(3)
    xs = (1, 6, 6, 8) if layout == "NXC" else (1, 8, 6, 6)
    w = h.random(rng, (3, 3, 8 // groups, 8))
    attrs = dict(strides=2, pads_begin=1, pads_end=1, groups=groups, data_format=layout,
                 filter_format="XIO")
    dy = h.random(rng, (1, 3, 3, 8) if layout == "NXC" else (1, 8, 3, 3))
    jax.block_until_ready(jaxconv.convolution_backward_data(dy, w, xs, **attrs,
                                                            lowering="onednn"))
    found = [c for c in library.choices() if c["kernel"] == "data"]
    assert found and not any(r["layout"] == "taps" for c in found for r in c["candidates"])
