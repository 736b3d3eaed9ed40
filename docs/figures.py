"""The pictures of the documentation, drawn from jaxconv's own geometry.

``python docs/figures.py OUTDIR`` writes them; ``docs/conf.py`` runs it on every build into
``docs/_generated/``. The padding pictures ask :mod:`jaxconv._src.geometry` for the pads and
sizes they draw, so they cannot drift from what the ops compute.
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from jaxconv._src import geometry  # noqa: E402

BLUE, ORANGE, GREY, GREEN, RED = "#4C72B0", "#DD8452", "#D9D9D9", "#55A868", "#C44E52"
CHANNEL_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]


def _cell(ax, x, y, colour, text="", w=1.0, h=1.0, hatch=None, fontsize=8):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="black", lw=0.6,
                           hatch=hatch))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _finish(ax, fig, path: pathlib.Path):
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def conv_padding(path: pathlib.Path, i=10, k=3, s=2, d=2, mode="explicit", pads=(1, 1)) -> None:
    """One spatial axis of a forward convolution: pads, dilated taps, strides, remainder."""
    (pb,), (pe,) = geometry.auto_pads(mode, geometry.PadRule.CONV, (i,), (k,), (s,), (d,),
                                      (pads[0],), (pads[1],))
    dk = (k - 1) * d + 1
    o = (i + pb + pe - dk) // s + 1
    rem = (i + pb + pe - dk) % s
    fig, ax = plt.subplots(figsize=(9, 3.2))
    total = pb + i + pe
    for j in range(total):
        inside = pb <= j < pb + i
        never = j >= total - rem
        _cell(ax, j, 2, BLUE if inside else GREY, f"x{j - pb}" if inside else "0",
              hatch="//" if never else None)
    for t in range(o):
        _cell(ax, t * s + (dk - 1) / 2, 0, ORANGE, f"y{t}")
        for kk in range(k):
            x0 = t * s + kk * d + 0.5
            ax.add_patch(FancyArrowPatch((x0, 2), (t * s + (dk - 1) / 2 + 0.5, 1),
                                         arrowstyle="-", lw=0.5, color="black", alpha=0.5))
    ax.text(pb / 2, 3.3, f"pads_begin={pb}", ha="center", fontsize=8)
    ax.text(pb + i + pe / 2, 3.3, f"pads_end={pe}", ha="center", fontsize=8)
    ax.set_title(f"convolution, one axis: I={i}, K={k}, S={s}, D={d} (DK={dk}), pads {pb}/{pe}"
                 f" -> O = (I+pb+pe-DK)//S + 1 = {o}\nhatched: the remainder (I+pb+pe-DK) % S "
                 f"= {rem}, read by no window", fontsize=9)
    ax.set_xlim(-0.5, total + 0.5)
    ax.set_ylim(-0.5, 3.8)
    _finish(ax, fig, path)


def conv_transpose_padding(path: pathlib.Path, i=4, k=3, s=2, d=1, pb=1, pe=0, op=1) -> None:
    """One axis of a transposed convolution: the full result, then the crop and output_padding."""
    dk = (k - 1) * d + 1
    full = s * (i - 1) + dk
    o = geometry.conv_transpose_output_size(i, k, s, d, pb, pe, op)
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for j in range(i):
        _cell(ax, j * s + (dk - 1) / 2, 2, BLUE, f"x{j}")
        for kk in range(k):
            ax.add_patch(FancyArrowPatch((j * s + (dk - 1) / 2 + 0.5, 2), (j * s + kk * d + 0.5, 1),
                                         arrowstyle="-", lw=0.5, color="black", alpha=0.5))
    for j in range(max(full, pb + o)):
        kept = pb <= j < pb + o
        past = j >= full
        _cell(ax, j, 0, ORANGE if kept else GREY, f"y{j - pb}" if kept else "",
              hatch="//" if past else None)
    ax.text(pb / 2, -0.6, f"crop pads_begin={pb}", ha="center", fontsize=8)
    ax.text(full / 2, -0.6, f"full = S(I-1)+DK = {full} elements", ha="center", fontsize=8)
    ax.set_title(f"transposed convolution, one axis: I={i}, K={k}, S={s}, D={d}, pads {pb}/{pe}, "
                 f"output_padding={op}\nO = S(I-1)+DK-pb-pe+output_padding = {o}: y[o] = full[o + pb],"
                 f" hatched: zeros past the end of full", fontsize=9)
    ax.set_xlim(-0.5, max(full, pb + o) + 0.5)
    ax.set_ylim(-1.0, 3.3)
    _finish(ax, fig, path)


def auto_pad_split(path: pathlib.Path) -> None:
    """same_upper / same_lower for an odd total, as jaxconv and the OpenVINO runtime split it."""
    i, k, s = 6, 4, 1
    fig, axes = plt.subplots(1, 2, figsize=(9, 1.9))
    for ax, mode in zip(axes, ("same_upper", "same_lower")):
        (pb,), (pe,) = geometry.auto_pads(mode, geometry.PadRule.CONV, (i,), (k,), (s,), (1,),
                                          (0,), (0,))
        for j in range(pb + i + pe):
            inside = pb <= j < pb + i
            _cell(ax, j, 0, BLUE if inside else GREY, f"x{j - pb}" if inside else "0")
        ax.set_title(f"{mode}: total {pb + pe} = {pb} + {pe}", fontsize=9)
        ax.set_xlim(-0.5, pb + i + pe + 0.5)
        ax.set_ylim(-0.3, 1.3)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(f"I={i}, K={k}, S={s}: an odd total; same_upper puts the extra pad at the end",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def data_layouts(path: pathlib.Path) -> None:
    """Memory order of one image, C=3, H=W=2, in NCX and NXC."""
    c, h, w = 3, 2, 2
    fig, ax = plt.subplots(figsize=(9, 2.4))
    order = {"NCX (NCHW)": [(ci, hi, wi) for ci in range(c) for hi in range(h) for wi in range(w)],
             "NXC (NHWC)": [(ci, hi, wi) for hi in range(h) for wi in range(w) for ci in range(c)]}
    for row, (name, cells) in enumerate(order.items()):
        y = 2.2 * (1 - row)
        ax.text(-0.3, y + 0.5, name, ha="right", va="center", fontsize=9)
        for j, (ci, hi, wi) in enumerate(cells):
            _cell(ax, j, y, CHANNEL_COLOURS[ci], f"c{ci}\n{hi},{wi}", fontsize=7)
    ax.text(len(order["NCX (NCHW)"]) / 2, -0.8,
            "memory order, left to right; colour = channel. 'X' stands for the spatial axes in "
            "order (W, HW or DHW).", ha="center", fontsize=8)
    ax.set_xlim(-4, 12.5)
    ax.set_ylim(-1.2, 3.4)
    _finish(ax, fig, path)


def filter_layouts(path: pathlib.Path) -> None:
    """Which axis holds what, for the four weight formats of the oneDNN families."""
    rows = [
        ("convolution  OIX", ["O = OC", "I = IC/g", "KH", "KW"]),
        ("convolution  XIO", ["KH", "KW", "I = IC/g", "O = OC"]),
        ("ConvTranspose IOX", ["I = IC", "O = OC/g", "KH", "KW"]),
        ("ConvTranspose XOI", ["KH", "KW", "O = OC/g", "I = IC"]),
        ("OpenVINO GCBD", ["G", "C_IN", "C_OUT", "KH", "KW"]),
    ]
    fig, ax = plt.subplots(figsize=(9, 3.0))
    for r, (name, axes_) in enumerate(rows):
        y = (len(rows) - 1 - r) * 1.2
        ax.text(-0.2, y + 0.5, name, ha="right", va="center", fontsize=9)
        for j, a in enumerate(axes_):
            colour = (ORANGE if a.startswith("O") or a == "C_OUT" else
                      BLUE if a.startswith("I") or a == "C_IN" else
                      GREEN if a == "G" else GREY)
            _cell(ax, 2.2 * j, y, colour, a, w=2.1, fontsize=8)
    ax.text(5.5, -0.9, "axis order of the stored array; IC/OC: the op's input/output channels, "
            "g: groups; I (ConvTranspose) holds the full count (see Semantics)", ha="center",
            fontsize=8)
    ax.set_xlim(-5, 11.5)
    ax.set_ylim(-1.3, len(rows) * 1.2 + 0.1)
    _finish(ax, fig, path)


def tbe_5hd(path: pathlib.Path) -> None:
    """5HD: channels cut into C1 blocks of C0 = 16, zero-padded; the channel axis moves last."""
    c = 20
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for j in range(32):
        real = j < c
        _cell(ax, j * 0.5, 1.4, BLUE if j < 16 else ORANGE if real else GREY,
              "" if not real else "", w=0.5, h=0.5)
    ax.text(4, 2.1, "C1 = 0: channels 0-15", ha="center", fontsize=8)
    ax.text(12, 2.1, "C1 = 1: channels 16-19, then 12 padded slots", ha="center", fontsize=8)
    ax.text(8, 0.7, "x5[n, c1, h, w, c0] = x[n, 16*c1 + c0, h, w]   (N, C1, H, W, C0=16); "
            "jaxconv reads only the real channels, whatever the padded slots hold", ha="center",
            fontsize=8)
    ax.set_xlim(-0.5, 16.5)
    ax.set_ylim(0.3, 2.5)
    _finish(ax, fig, path)


FIGURES = {
    "conv_padding.png": conv_padding,
    "conv_transpose_padding.png": conv_transpose_padding,
    "auto_pad_split.png": auto_pad_split,
    "data_layouts.png": data_layouts,
    "filter_layouts.png": filter_layouts,
    "tbe_5hd.png": tbe_5hd,
}


def main(outdir: str) -> None:
    out = pathlib.Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        draw(out / name)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/_generated")
