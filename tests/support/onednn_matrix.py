"""The problems the oneDNN lowering's tests share, each with its float64 torch oracle, and the
check of a call on each layout the handler's trial races (:func:`each_layout_kept`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support import oracles

HIGHEST = lax.Precision.HIGHEST
AVAILABLE = library.status().available
needs_onednn = pytest.mark.skipif(not AVAILABLE, reason=f"onednn: {library.status().detail}")

# (rank, data_format, filter_format, groups, in, out, spatial, kernel, strides, dilations, pb, pe)
MATRIX = [
    (1, "NCX", "OIX", 1, 4, 3, (11,), (3,), (2,), (1,), (1,), (0,)),
    (2, "NXC", "XIO", 2, 4, 6, (9, 7), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1)),
    (2, "NCX", "OIX", 4, 4, 8, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),  # depthwise x2
    (2, "NXC", "OIX", 4, 4, 4, (7, 9), (5, 4), (2, 2), (1, 1), (2, 1), (2, 2)),  # depthwise
    (3, "NCX", "XIO", 1, 3, 5, (6, 5, 7), (2, 3, 2), (1, 2, 1), (2, 1, 1), (0, 1, 1), (1, 0, 0)),
    (3, "NXC", "XIO", 2, 4, 2, (5, 4, 5), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
    # 1x1, stride 3 over 9 rows: two trailing rows no window reads (oneDNN 3.2's 1x1 weight
    # gradient got this wrong by 38% until the handler received the exactly fitted problem)
    (2, "NXC", "XIO", 1, 4, 3, (9, 7), (1, 1), (3, 1), (1, 2), (0, 0), (0, 0)),
    # a strided 1x1 with pads on both sides, grouped: its weight gradient is the unit-stride
    # one on the grid of x it reads, zeros where the grid falls in the padding
    (2, "NCX", "OIX", 2, 4, 6, (8, 9), (1, 1), (2, 3), (1, 1), (1, 0), (2, 1)),
    # output positions whose windows read only padding (their dy is cut before oneDNN's data
    # and weight gradients): a 1x1x1 kernel with pads (benchdnn 3d_conv_pad:4), and pads past
    # the kernel with a stride past it (the cut leaves a negative begin pad: x's head cropped)
    (3, "NXC", "XIO", 1, 4, 3, (4, 3, 5), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    (2, "NCX", "OIX", 2, 4, 6, (7, 6), (2, 1), (3, 2), (1, 1), (4, 1), (3, 2)),
]
IDS = [f"{m[0]}d-{m[1]}-{m[2]}-g{m[3]}-k{'x'.join(map(str, m[7]))}" for m in MATRIX]


def _problem(m, seed=0, dtype=jnp.float32, batch=2):
    rank, df, ff, g, ic, oc, spatial, k, s, d, pb, pe = m
    rng = np.random.default_rng(seed)
    x = h.random(rng, h.data_shape(df, batch, ic, spatial)).astype(dtype)
    w = h.random(rng, h.conv_filter_shape(ff, oc, ic // g, k)).astype(dtype)
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=g, data_format=df,
                 filter_format=ff)
    y_ncx = oracles.conv_output_shape(h.data_to_ncx(np.zeros(x.shape), df).shape,
                                      h.conv_filter_to_oix(np.zeros(w.shape), ff).shape,
                                      strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=g)
    dy = h.random(rng, h.data_from_ncx(np.zeros(y_ncx), df).shape).astype(dtype)
    y, dx, dw = oracles.conv_all(h.data_to_ncx(h.to_f64(x), df),
                                 h.conv_filter_to_oix(h.to_f64(w), ff),
                                 h.data_to_ncx(h.to_f64(dy), df), strides=s, dilations=d,
                                 pads_begin=pb, pads_end=pe, groups=g)
    return x, w, dy, attrs, (h.data_from_ncx(y, df), h.data_from_ncx(dx, df),
                             h.conv_filter_from_oix(dw, ff))


LARGE = (2, "NXC", "XIO", 2, 32, 48, (40, 36), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1))
# a deep layer: 5.5e6 multiply-adds per example, and a filter (2.8e5 weights) heavier than a
# chunk's activations, so that its forward and data gradient are one OpenMP call too
DEEP = (2, "NCX", "OIX", 1, 192, 160, (5, 4), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))

SPREAD = [
    ((2, "NXC", "XIO", 1, 16, 24, (10, 11), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)), 2),
    ((1, "NCX", "OIX", 1, 6, 5, (13,), (1,), (3,), (1,), (0,), (0,)), 3),
    ((3, "NXC", "OIX", 2, 8, 6, (5, 4, 7), (1, 1, 1), (2, 1, 2), (1, 1, 1), (0, 0, 0),
      (0, 0, 0)), 2),
    ((2, "NCX", "XIO", 1, 128, 128, (32, 31), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)), 3),
]


def each_layout_kept(kernel: str, run: Callable[[], Any],
                     check: Callable[[Any], None]) -> set[str]:
    """``run()`` (a call of oneDNN's ``kernel``: "forward", "data", "weight") with the layout
    trial on (the ``layout_trial`` fixture), then again for each activation layout among the
    trial's candidates, kept for every problem of the call that raced it by an earlier
    process's verdict (``library.remember``): ``check`` each result, and that the call took
    the remembered primitive. The layouts, the caller's included."""
    check(jax.block_until_ready(run()))
    mine = [c for c in library.choices() if c["kernel"] == kernel]
    assert mine, library.choices()
    layouts = {c["layout"] for e in mine for c in e["candidates"]}
    for layout in sorted(layouts):
        library.forget()
        verdicts = {e["key"]: (layout, c["impl"]) for e in mine for c in e["candidates"]
                    if c["layout"] == layout}
        assert library.remember(verdicts) == len(verdicts)
        check(jax.block_until_ready(run()))
        kept = [e for e in library.choices() if e["key"] in verdicts]
        assert kept and all(e["source"] == "cache" and e["candidates"][0]["layout"] == layout
                            for e in kept), (layout, kept)
    return layouts
