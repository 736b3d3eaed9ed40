"""Parse oneDNN benchdnn problem lines (see shapes/README.md for the syntax)."""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any

SHAPES = pathlib.Path(__file__).parent / "shapes"
_TOKEN = re.compile(r'(mb|ic|oc|id|ih|iw|od|oh|ow|kd|kh|kw|sd|sh|sw|pd|ph|pw|dd|dh|dw|g|n)'
                    r'("[^"]*"|\d+)')


@dataclasses.dataclass(frozen=True)
class Problem:
    """One convolution, in convolution roles (x: the larger input, y: the output).

    For a deconv line, ``transposed`` is set: the ConvTranspose maps y -> x.
    Pads are explicit (begin, end); an end pad that benchdnn derives as
    negative (a crop) is folded into a smaller input (or, for a ConvTranspose,
    into output_padding).
    """

    name: str
    source: str
    batch: int
    groups: int
    in_channels: int
    out_channels: int
    input_size: tuple[int, ...]
    output_size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    transposed: bool = False
    output_padding: tuple[int, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def flops(self) -> float:
        out = 1
        for o in self.output_size:
            out *= o
        k = 1
        for v in self.kernel:
            k *= v
        return 2.0 * self.batch * self.out_channels * (self.in_channels // self.groups) * out * k

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.in_channels

    @property
    def category(self) -> str:
        if self.depthwise:
            return "depthwise"
        if self.groups > 1:
            return "grouped"
        return f"{self.rank}d"


def parse_line(line: str, source: str, batch_cap: int | None = 16) -> Problem | None:
    """One benchdnn problem line (e.g. ``'g32mb16ic256ih28oc256oh28kh3ph1n"name"'``).

    Args:
      line: the line; blank lines and ``#`` comments give ``None``.
      source: the list it comes from; a name starting with ``deconv`` reads it as a
        transposed convolution (benchdnn's deconv driver).
      batch_cap: the largest minibatch kept (``None``: the line's own).

    Returns:
      The :class:`Problem`, or ``None`` for a blank or comment line.
    """
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    vals: dict[str, Any] = {}
    for key, value in _TOKEN.findall(line):
        vals[key] = value.strip('"') if key == "n" else int(value)
    deconv = source.startswith("deconv")
    dims = "dhw" if any(k in vals for k in ("id", "od", "kd", "sd", "pd", "dd")) else (
        "hw" if any(k in vals for k in ("ih", "oh", "kh", "sh", "ph", "dh")) else "w")

    def get(prefix, default=None):
        out = {}
        for a in dims:
            out[a] = vals.get(prefix + a)
        # a missing entry is copied from the next one present (d <- h <- w), then back
        order = list(dims)
        for i, a in enumerate(order):
            if out[a] is None:
                nxt = [out[b] for b in order[i + 1:] if out[b] is not None]
                prv = [out[b] for b in order[:i] if out[b] is not None]
                out[a] = nxt[0] if nxt else (prv[-1] if prv else default)
        return [out[a] for a in order]

    k = get("k", 1)
    s = get("s", 1)
    p = get("p", 0)
    dl = [v + 1 for v in get("d", 0)]  # benchdnn dilation 0 = none
    i = get("i")
    o = get("o")
    dk = [(kk - 1) * d + 1 for kk, d in zip(k, dl)]
    mb = int(vals.get("mb", 2))
    if batch_cap is not None:
        mb = min(mb, batch_cap)
    g = int(vals.get("g", 1))
    ic, oc = int(vals["ic"]), int(vals["oc"])
    if deconv:
        # benchdnn deconv: i is the deconv input (small), o its output (large).
        small, big = i, o
        if any(v is None for v in big):
            big = [(si - 1) * st - 2 * pp + dd for si, st, pp, dd in zip(small, s, p, dk)]
        pe = [(si - 1) * st + dd - pp - bi for si, st, dd, pp, bi in zip(small, s, dk, p, big)]
        opad = [max(0, -e) for e in pe]
        if any(op >= st for op, st in zip(opad, s)):
            return None
        pe = [max(0, e) for e in pe]
        return Problem(str(vals.get("n", line)), source, mb, g, oc, ic, tuple(big), tuple(small),
                       tuple(k), tuple(s), tuple(dl), tuple(p), tuple(pe), True, tuple(opad))
    if any(v is None for v in o):
        o = [(ii - dd + 2 * pp) // st + 1 for ii, dd, pp, st in zip(i, dk, p, s)]
    pe = [(oo - 1) * st - ii + dd - pp for oo, st, ii, dd, pp in zip(o, s, i, dk, p)]
    # a negative end pad crops the input: those elements are never read
    i = [ii + min(0, e) for ii, e in zip(i, pe)]
    pe = [max(0, e) for e in pe]
    return Problem(str(vals.get("n", line)), source, mb, g, ic, oc, tuple(i), tuple(o), tuple(k),
                   tuple(s), tuple(dl), tuple(p), tuple(pe))


def load(name: str, batch_cap: int | None = 16) -> list[Problem]:
    """The problems of ``shapes/<name>.txt``, duplicates removed."""
    out, seen = [], set()
    for line in (SHAPES / f"{name}.txt").read_text().splitlines():
        prob = parse_line(line, name, batch_cap)
        if prob is None:
            continue
        key = dataclasses.replace(prob, name="")
        if key in seen:
            continue
        seen.add(key)
        out.append(prob)
    return out
