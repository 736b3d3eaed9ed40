"""The oneDNN handler's own filter moves against oneDNN 3.2's reorders of the same filters,
for the layouts oneDNN's kernels ask of ResNet's filters (docs/onednn.md, "Filter moves"):

    python -m benchmarks.filter_moves --out docs/benchmarks/filter-moves-zen4.json

Each row: the best of ``--reps`` calls of each, interleaved in one process, the source written
afresh before each call (as XLA writes a filter before the call that reads it), timed alone
and with one thread's read of the whole result after it (as the next operation reads it:
streaming stores leave the result in memory); the handler's move is checked bit for bit
against oneDNN's reorder first. Prints and writes ms and the ratios ours / oneDNN's. Needs the
built handler (``jaxconv build-onednn``).
"""

from __future__ import annotations

import argparse
import json
import math

from jaxconv._src.bench import machine
from jaxconv._src.native import library

# (layout, dtype, O, I, taps): the layouts ONEDNN_VERBOSE lists for ResNet-50's bfloat16 step
# (brgconv's forwards "64a2b", "32a2b", "48a2b" padded; jit_bf16's "8b16a2b"; data gradients'
# "64b2a", "32b2a", "48b2a" padded, "8a16b2a") and float32's tiles (a forward's, and the
# weight gradient's copy out of "16b16a")
ROWS = [
    ("64a2b", "bfloat16", 512, 512, (3, 3)), ("32a2b", "bfloat16", 512, 512, (3, 3)),
    ("8b16a2b", "bfloat16", 512, 512, (3, 3)), ("8b16a2b", "bfloat16", 2048, 1024, (1, 1)),
    ("48a2b", "bfloat16", 2048, 512, (1, 1)), ("64a2b", "bfloat16", 256, 256, (3, 3)),
    ("64a2b", "bfloat16", 1024, 256, (1, 1)), ("64a2b", "bfloat16", 128, 128, (3, 3)),
    ("64a2b", "bfloat16", 256, 64, (1, 1)),
    ("32b2a", "bfloat16", 512, 512, (3, 3)), ("64b2a", "bfloat16", 256, 256, (3, 3)),
    ("8a16b2a", "bfloat16", 2048, 512, (1, 1)), ("48b2a", "bfloat16", 512, 1024, (1, 1)),
    ("64b2a", "bfloat16", 256, 1024, (1, 1)),
    ("64b2a", "bfloat16", 128, 128, (3, 3)), ("64b2a", "bfloat16", 256, 64, (1, 1)),
    ("16a16b", "float32", 512, 512, (3, 3)), ("16a16b", "float32", 256, 256, (3, 3)),
    ("16b16a", "float32", 512, 512, (3, 3)),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not library.status().available:
        raise SystemExit(f"filter_moves: the handler is not loaded: {library.status().detail}")
    rows = []
    for blocks, dtype, o, i, taps in ROWS:
        row = {"layout": blocks, "dtype": dtype, "filter": [o, i, *taps],
               "bytes": o * i * (4 if dtype == "float32" else 2) * math.prod(taps)}
        if not library.check_filter_move(blocks, o, i, taps, dtype):
            row["applies"] = False  # oneDNN's reorder runs (e.g. no AVX-512 on this CPU)
        else:
            row["applies"] = True
            for read, key in ((False, ""), (True, "_read")):
                times = library.time_filter_move(blocks, o, i, taps, dtype, args.reps, read)
                assert times is not None
                ours, theirs = times
                row.update({f"jaxconv{key}_ms": round(1e3 * ours, 4),
                            f"onednn{key}_ms": round(1e3 * theirs, 4),
                            f"ratio{key}": round(ours / theirs, 3)})
        print(json.dumps(row))
        rows.append(row)
    machine.write(args.out, machine.result("python -m benchmarks.filter_moves", reps=args.reps,
                                           rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
