"""The declarative problem matrices the test modules share (rank x layout x groups x geometry).

``ConvCase`` / ``CONV_MATRIX``: the oneDNN convolution family; ``ConvTransposeCase`` /
``CONV_TRANSPOSE_MATRIX``: the ConvTranspose family; ``pack_fractal_z_loop``: the Ascend
FRACTAL_Z packing written as the DSL's loop (an oracle independent of ``jaxconv.tbe``).
Test modules import these from here, never from each other.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax.numpy as jnp
import numpy as np

from tests.support import helpers as h
from tests.support import oracles

CONV_SPATIAL = {1: (11,), 2: (9, 7), 3: (6, 5, 7)}
CONV_KERNEL = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}

# name -> attributes (sliced to the rank); pads given with auto_pad != none are
# deliberately odd values that must be ignored.
CONV_GEOMETRIES = {
    "asym_pads": dict(strides=(1, 1, 1), dilations=(1, 1, 1), pads_begin=(2, 0, 1),
                      pads_end=(0, 1, 2), auto_pad="none"),
    "stride_dil_remainder": dict(strides=(2, 3, 2), dilations=(2, 1, 2), pads_begin=(1, 2, 0),
                                 pads_end=(0, 1, 2), auto_pad="explicit"),
    "same_upper": dict(strides=(2, 1, 3), dilations=(1, 2, 1), pads_begin=(9, 9, 9),
                       pads_end=(9, 9, 9), auto_pad="same_upper"),
    "same_lower": dict(strides=(2, 2, 1), dilations=(1, 1, 2), pads_begin=(9, 9, 9),
                       pads_end=(9, 9, 9), auto_pad="SAME_LOWER"),
    "valid": dict(strides=(3, 1, 2), dilations=(1, 2, 1), pads_begin=(5, 5, 5),
                  pads_end=(5, 5, 5), auto_pad="VALID"),
    "none_stride_pads": dict(strides=(2, 2, 2), dilations=(1, 1, 1), pads_begin=(1, 1, 0),
                             pads_end=(1, 0, 1), auto_pad="None"),
}
CONV_GROUPS = {"g1": (1, 4, 3), "g2": (2, 4, 6), "depthwise": (4, 4, 8)}  # groups, IC, OC


@dataclasses.dataclass(frozen=True)
class ConvCase:
    rank: int
    data_format: str
    filter_format: str
    groups_name: str
    geometry: str

    @property
    def id(self) -> str:
        return f"{self.rank}d-{self.data_format}-{self.filter_format}-{self.groups_name}-{self.geometry}"

    @property
    def attrs(self) -> dict:
        geo = CONV_GEOMETRIES[self.geometry]
        out = {k: (v[: self.rank] if isinstance(v, tuple) else v) for k, v in geo.items()}
        out.update(groups=CONV_GROUPS[self.groups_name][0], data_format=self.data_format,
                   filter_format=self.filter_format)
        return out

    def torch_pads(self):
        a = self.attrs
        mode = a["auto_pad"].lower()
        if mode in ("none", "explicit"):
            return a["pads_begin"], a["pads_end"]
        if mode == "valid":
            return (0,) * self.rank, (0,) * self.rank
        return h.same_pads(CONV_SPATIAL[self.rank], CONV_KERNEL[self.rank], a["strides"], a["dilations"],
                           upper=mode == "same_upper")

    def make(self, seed: int = 0, dtype=jnp.float32):
        g, ic, oc = CONV_GROUPS[self.groups_name]
        rng = np.random.default_rng(seed)
        x = h.random(rng, h.data_shape(self.data_format, 2, ic, CONV_SPATIAL[self.rank]), dtype)
        w_shape = h.conv_filter_shape(self.filter_format, oc, ic // g, CONV_KERNEL[self.rank])
        w = h.random(rng, w_shape, dtype)
        pb, pe = self.torch_pads()
        y_ncx = oracles.conv_output_shape(
            h.data_to_ncx(np.zeros(x.shape), self.data_format).shape,
            h.conv_filter_to_oix(np.zeros(w_shape), self.filter_format).shape,
            strides=self.attrs["strides"], dilations=self.attrs["dilations"],
            pads_begin=pb, pads_end=pe, groups=g)
        y_shape = h.data_from_ncx(np.zeros(y_ncx), self.data_format).shape
        dy = h.random(rng, y_shape, dtype)
        return x, w, dy

    def torch_reference(self, x, w, dy):
        pb, pe = self.torch_pads()
        y, dx, dw = oracles.conv_all(
            h.data_to_ncx(h.to_f64(x), self.data_format),
            h.conv_filter_to_oix(h.to_f64(w), self.filter_format),
            h.data_to_ncx(h.to_f64(dy), self.data_format),
            strides=self.attrs["strides"], dilations=self.attrs["dilations"],
            pads_begin=pb, pads_end=pe, groups=CONV_GROUPS[self.groups_name][0])
        return (h.data_from_ncx(y, self.data_format), h.data_from_ncx(dx, self.data_format),
                h.conv_filter_from_oix(dw, self.filter_format))


CONV_MATRIX = [
    ConvCase(*c)
    for c in itertools.product((1, 2, 3), ("NXC", "NCX"), ("XIO", "OIX"), tuple(CONV_GROUPS),
                               tuple(CONV_GEOMETRIES))
]


CONV_LAYOUTS = list(itertools.product(("NXC", "NCX"), ("XIO", "OIX")))


def _rotated(shift: int) -> list[ConvCase]:
    """Every (rank, groups, geometry), each with one of the four layout pairs.

    The pair is number (rank + groups + geometry + shift) mod 4 (their indices): with
    3, 3 and 6 values, every layout pair meets every rank, every groups value and
    every geometry (all pairs of factors are covered, a quarter of CONV_MATRIX).
    """
    return [ConvCase(rank, *CONV_LAYOUTS[(r + gi + gj + shift) % 4], gname, geo)
            for (r, rank), (gi, gname), (gj, geo) in itertools.product(
                enumerate((1, 2, 3)), enumerate(CONV_GROUPS), enumerate(CONV_GEOMETRIES))]


# forward and data gradient: every (rank, groups, geometry), the layout pairs rotating.
CONV_ROTATED = _rotated(0)
# the weight gradient's default run: the other half of the layout assignments (shifted
# by 2); the rest of CONV_MATRIX runs with -m slow
CONV_WEIGHT_DEFAULT = {c.id for c in _rotated(2)}


# ---- ConvTranspose family --------------------------------------------------

CONV_TRANSPOSE_SPATIAL = {1: (7,), 2: (5, 4), 3: (4, 3, 4)}
CONV_TRANSPOSE_KERNEL = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}
CONV_TRANSPOSE_GROUPS = {"g1": (1, 4, 3), "g2": (2, 4, 6), "depthwise": (4, 4, 8)}  # groups, IC, OC
CONV_TRANSPOSE_FORMATS = ("IOX", "XOI", "OIX", "XIO")

CONV_TRANSPOSE_GEOMETRIES = {
    "asym_pads": dict(strides=(1, 1, 1), dilations=(1, 1, 1), pads_begin=(1, 0, 1),
                      pads_end=(0, 1, 0), output_padding=(0, 0, 0), auto_pad="none"),
    "stride_dil_outpad": dict(strides=(2, 3, 2), dilations=(2, 1, 2), pads_begin=(1, 2, 0),
                              pads_end=(0, 1, 1), output_padding=(1, 2, 0), auto_pad="explicit"),
    "same_upper": dict(strides=(2, 1, 3), dilations=(1, 2, 1), pads_begin=(9, 9, 9),
                       pads_end=(9, 9, 9), output_padding=(0, 0, 0), auto_pad="same_upper"),
    "same_lower_outpad": dict(strides=(2, 2, 1), dilations=(1, 1, 2), pads_begin=(9, 9, 9),
                              pads_end=(9, 9, 9), output_padding=(1, 1, 0),
                              auto_pad="SAME_LOWER"),
    "valid_outpad": dict(strides=(3, 1, 2), dilations=(1, 2, 1), pads_begin=(5, 5, 5),
                         pads_end=(5, 5, 5), output_padding=(2, 0, 1), auto_pad="VALID"),
    "big_pads": dict(strides=(2, 2, 2), dilations=(1, 1, 1), pads_begin=(2, 1, 2),
                     pads_end=(2, 2, 1), output_padding=(1, 1, 1), auto_pad="None"),
}


@dataclasses.dataclass(frozen=True)
class ConvTransposeCase:
    rank: int
    data_format: str
    weights_format: str
    groups_name: str
    geometry: str

    @property
    def id(self) -> str:
        return (f"{self.rank}d-{self.data_format}-{self.weights_format}-{self.groups_name}-"
                f"{self.geometry}")

    @property
    def attrs(self) -> dict:
        geo = CONV_TRANSPOSE_GEOMETRIES[self.geometry]
        out = {k: (v[: self.rank] if isinstance(v, tuple) else v) for k, v in geo.items()}
        out.update(groups=CONV_TRANSPOSE_GROUPS[self.groups_name][0], data_format=self.data_format)
        return out

    def torch_geometry(self):
        """(pads_begin, output size), computed independently of jaxconv."""
        a = self.attrs
        mode = a["auto_pad"].lower()
        k, s, d = CONV_TRANSPOSE_KERNEL[self.rank], a["strides"], a["dilations"]
        if mode in ("none", "explicit"):
            pb, pe = a["pads_begin"], a["pads_end"]
        elif mode == "valid":
            pb = pe = (0,) * self.rank
        else:
            pb, pe = h.deconv_same_pads(k, s, d, upper=mode == "same_upper")
        out = [si * (i - 1) + (ki - 1) * di + 1 - b - e + o for i, ki, si, di, b, e, o in
               zip(CONV_TRANSPOSE_SPATIAL[self.rank], k, s, d, pb, pe, a["output_padding"])]
        return pb, out

    def make(self, seed: int = 0, dtype=jnp.float32):
        g, ic, oc = CONV_TRANSPOSE_GROUPS[self.groups_name]
        rng = np.random.default_rng(seed)
        x = h.random(rng, h.data_shape(self.data_format, 2, ic, CONV_TRANSPOSE_SPATIAL[self.rank]), dtype)
        w = h.random(rng, h.convt_filter_shape(self.weights_format, ic, oc // g,
                                               CONV_TRANSPOSE_KERNEL[self.rank]), dtype)
        _, out = self.torch_geometry()
        dy = h.random(rng, h.data_shape(self.data_format, 2, oc, out), dtype)
        return x, w, dy

    def torch_reference(self, x, w, dy):
        pb, out = self.torch_geometry()
        y, dx, dw = oracles.conv_transpose_all(
            h.data_to_ncx(h.to_f64(x), self.data_format),
            h.convt_filter_to_iox(h.to_f64(w), self.weights_format),
            h.data_to_ncx(h.to_f64(dy), self.data_format),
            strides=self.attrs["strides"], dilations=self.attrs["dilations"], pads_begin=pb,
            out_size=out, groups=CONV_TRANSPOSE_GROUPS[self.groups_name][0])
        return (h.data_from_ncx(y, self.data_format), h.data_from_ncx(dx, self.data_format),
                h.convt_filter_from_iox(dw, self.weights_format))


CONV_TRANSPOSE_LAYOUTS = list(itertools.product(("NXC", "NCX"), CONV_TRANSPOSE_FORMATS))
CONV_TRANSPOSE_MATRIX = [
    ConvTransposeCase(rank, *CONV_TRANSPOSE_LAYOUTS[j % len(CONV_TRANSPOSE_LAYOUTS)], gname, geo)
    for j, (rank, gname, geo) in enumerate(
        itertools.product((1, 2, 3), tuple(CONV_TRANSPOSE_GROUPS), tuple(CONV_TRANSPOSE_GEOMETRIES)))
]
CONV_TRANSPOSE_EVERY_LAYOUT = [ConvTransposeCase(2, df, wf, "g2", "stride_dil_outpad")
                               for df, wf in CONV_TRANSPOSE_LAYOUTS]


# ---- Ascend TBE ------------------------------------------------------------

def pack_fractal_z_loop(dw: np.ndarray, groups: int) -> np.ndarray:
    """FRACTAL_Z by a plain loop over SEMANTICS.md section 4 (independent of jaxconv)."""
    cout, cin_g, kh, kw = dw.shape
    cout_g = cout // groups
    mag0 = math.lcm(cin_g, 16) // cin_g
    mag1 = math.lcm(cout_g, 16) // cout_g
    mag = min(math.lcm(mag0, mag1), groups)
    real_g = -(-groups // mag)
    cin1_g = -(-(mag * cin_g) // 16)
    cout_pad = -(-(mag * cout_g) // 16) * 16
    out = np.zeros((real_g, cin1_g * kh * kw, cout_pad, 16), dw.dtype)
    for g in range(groups):
        j = g % mag
        for co in range(cout_g):
            for ci in range(cin_g):
                ce = j * cin_g + ci
                for a in range(kh):
                    for b in range(kw):
                        out[g // mag, (ce // 16 * kh + a) * kw + b, j * cout_g + co, ce % 16] = \
                            dw[g * cout_g + co, ci, a, b]
    return out
