"""docs/performance.md is what its JSONs give, and no page tells history.

The page is written by ``python -m benchmarks.report --page`` (``jaxconv/_src/bench/page.py``)
from the JSONs it cites, so a figure cannot drift from its JSON; README and docs/index.md quote
the page's headline. No docs page but CHANGELOG.md names a commit or a VM by its ordinal:
measurements are named once, by the page's generated "measured" table.
"""

from __future__ import annotations

import json
import pathlib
import re

from jaxconv._src.bench import page

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "benchmarks"

#: a commit: 7 to 40 hex digits with a digit and a letter among them
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
#: a VM named by its ordinal ("a third VM of the same kind")
ORDINAL = re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|another)\s+VM\b", re.I)


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_page_is_what_its_jsons_give():
    assert page.PAGE.read_text() == page.page(), (
        "docs/performance.md differs from its JSONs: run `python -m benchmarks.report --page`")


def test_the_page_is_short_and_every_table_names_its_commit():
    text = page.PAGE.read_text()
    assert len(text.splitlines()) <= 250  # serving on two CPUs (AMD and Intel), on 2-16 cores
    for t in page.TABLES:
        assert t.commit(), t.title
        for j in t.jsons:
            assert (BENCH / j).is_file(), j


def test_no_page_names_a_commit_or_a_vm_ordinal():
    found = []
    for path in _pages():
        text = path.read_text()
        if path == page.PAGE:  # the generated table of what was measured where
            begin, end = text.index(page.MEASURED_BEGIN), text.index(page.MEASURED_END)
            text = text[:begin] + text[end:]
        text = re.sub(r"libjaxconv_onednn-[0-9a-f]+\.so", "", text)  # a library's key
        for n, line in enumerate(text.splitlines(), 1):
            if HASH.search(line) or ORDINAL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "history belongs in CHANGELOG.md:\n" + "\n".join(found)


def test_every_json_of_docs_benchmarks_is_cited():
    texts = "".join(p.read_text() for p in _pages())
    unused = [p.name for p in sorted(BENCH.glob("*.json")) if p.name not in texts]
    assert not unused, f"JSONs no page cites (remove them): {unused}"


def test_readme_and_index_quote_the_pages_headline():
    """The float32 step ratios' range, without and with BatchNorm, as the page's JSONs give."""
    quoted = []
    for name in page.TABLES[0].jsons:
        ratios = [r["torch_over_accelerate"] for r in json.loads((BENCH / name).read_text())[
            "steps"]]
        quoted.append(f"{min(ratios):.2f}-{max(ratios):.2f}x")
    for path in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        text = " ".join(path.read_text().split())
        for q in quoted:
            assert q in text, f"{path.name} does not quote the page's {q}"
