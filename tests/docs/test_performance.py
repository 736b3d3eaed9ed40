"""docs/performance.md's tables against the JSONs they cite: a table the report script writes
from its JSONs must be in the page as the script writes it now, so a figure cannot drift from
its JSON (issue: one page tells). Each entry: the report's arguments, the JSONs, in
``docs/benchmarks/``."""

from __future__ import annotations

import pathlib

import pytest

from jaxconv._src.bench import model_report

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "performance.md"
BENCH = ROOT / "docs" / "benchmarks"

#: the generated tables: (what the page calls it, the report's options, the JSONs)
GENERATED = [
    ("whole steps against PyTorch, float32", ["--lead"],
     ["models-steps-nobn-zen4.json", "models-steps-bn-zen4.json"]),
]


@pytest.mark.parametrize("name, options, jsons", GENERATED, ids=[g[0] for g in GENERATED])
def test_each_generated_table_is_what_its_jsons_give(name, options, jsons, capsys):
    assert model_report.main([*options, *(str(BENCH / j) for j in jsons)]) == 0
    table = capsys.readouterr().out.strip()
    assert table and table in PAGE.read_text(), (
        f"{name}: the page's table differs from `python -m jaxconv._src.bench.model_report "
        f"{' '.join(options)} {' '.join('docs/benchmarks/' + j for j in jsons)}`")
    for j in jsons:
        assert j in PAGE.read_text()
