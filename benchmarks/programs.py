"""Whether a change altered jaxconv's compiled programs: dump them in two checkouts, compare.

A refactoring that should leave the programs as they are (a new module layout, a registry)
leaves the programs of the commit it started from when every program is the same, which no timing can show
as sharply. ``dump`` writes, for each benchdnn problem of the lists (the first ``--per-list``
of each, batch capped), the optimized HLO of the jitted op that ``jaxconv bench`` times
(instructions only: no names' numeric suffixes, no source metadata); ``compare`` lists the
problems whose programs differ.

usage:
  python -m benchmarks.programs dump benchmarks/results/programs.json     # this checkout
  (cd ../previous && python -m benchmarks.programs dump /tmp/old.json)   # the other one
  python -m benchmarks.programs compare /tmp/old.json benchmarks/results/programs.json
"""

from __future__ import annotations

import argparse
import json
import pathlib

from jaxconv._src.bench import run

LISTS = run.TARGET_LISTS + run.DECONV_LISTS + ["conv_shapes_3d", "conv_shapes_dilated"]


def dump(lists: list[str], per_list: int, batch_cap: int) -> dict[str, str]:
    out = {}
    for prob, kind in run.tasks_for(lists, per_list, batch_cap):
        impls = run.build(prob, kind, with_torch=False)
        out[f"{prob.name}:{kind}"] = "\n".join(run.hlo_instructions(impls["jaxconv"]))
    return out


def compare(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The problems whose programs differ, or that only one side has."""
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.programs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="write the programs of this checkout")
    d.add_argument("out", type=pathlib.Path)
    d.add_argument("--lists", nargs="+", default=LISTS)
    d.add_argument("--per-list", type=int, default=8)
    d.add_argument("--batch-cap", type=int, default=2)
    c = sub.add_parser("compare", help="list the problems whose programs differ")
    c.add_argument("a", type=pathlib.Path)
    c.add_argument("b", type=pathlib.Path)
    args = ap.parse_args(argv)
    if args.command == "dump":
        programs = dump(args.lists, args.per_list, args.batch_cap)
        args.out.write_text(json.dumps(programs))
        print(f"{len(programs)} programs -> {args.out}")
        return 0
    a, b = json.loads(args.a.read_text()), json.loads(args.b.read_text())
    differ = compare(a, b)
    for k in differ:
        print(f"differs: {k}")
    print(f"{len(a.keys() & b.keys()) - len(set(differ) & a.keys() & b.keys())} of "
          f"{len(a.keys() | b.keys())} programs the same")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
