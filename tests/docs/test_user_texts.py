"""Every user-facing text stands on its own: no reference to a file the repository lacks.

User-facing texts: the README, the docs pages, the notebooks, the package's source (docstrings
and error messages), the benchmark scripts' help, and ``jaxconv --help`` with each command's
help. They may name files of this repository, never the development inputs a user does not have
(the specification notes, the issue tracker), nor call a vendor specification "the seed".
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from jaxconv._src import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
_SKIP_DIRS = {".git", "_generated", "build", "__pycache__", ".pytest_cache", ".mypy_cache",
              ".hypothesis", "results"}


def _repo_files() -> list[pathlib.Path]:
    return [p for p in ROOT.rglob("*") if p.is_file()
            and not _SKIP_DIRS & set(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)]


def _notebook_text(path: pathlib.Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])


def _cli_help() -> str:
    parser = cli.build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        texts += [sub.format_help() for sub in action.choices.values()]
    return "\n".join(texts)


def _texts() -> dict[str, str]:
    texts = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs").glob("*.py")):
        texts[str(path.relative_to(ROOT))] = path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        texts[str(path.relative_to(ROOT))] = _notebook_text(path)
    for path in sorted((ROOT / "jaxconv").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py")):
        texts[str(path.relative_to(ROOT))] = path.read_text()
    texts["jaxconv --help"] = _cli_help()
    return texts


TEXTS = _texts()

# Words that only mean something to the developers: the development inputs' file names,
# "seed" for a vendor specification, and issue numbers.
FORBIDDEN = re.compile(
    r"\b(?:SEMANTICS|HAZARDS|API)\.md\b|\.\./shared|"
    r"(?i:\bseeds?\s+\d{3}\b|\bthe seeds?\b|\bseed's\b|(?<!\w)\(seed\)|"
    r"\bseed (?:op|operator|ops|operators|prose|rule|text)s?\b|\bissue\s+#?\d+\b|"
    r"\bthe issue(?:'s)?\b)")

# Words of a lab notebook rather than of a product: the history of trying, runs and sessions
# by their order, dates of runs. Texts state what is true now; history goes to CHANGELOG.md.
DIARY = re.compile(
    r"(?i:\blast (?:stop|session)s?\b|\b(?:in|from|than) the last run\b|\blast run's\b|\bthis (?:session|stop)\b|"
    r"\bthe (?:stop|run|commit|session) before\b|\bprevious (?:stop|session|run|commit)s?\b|"
    r"\b(?:earlier|older|later) (?:run|stop|session)s?\b|\b(?:was|were) not kept\b|"
    r"\b(?:before|after) the fix\b|\bwhat was tried\b|\bwe tried\b|\bno longer\b|"
    r"\bused to (?:be|take|run)\b|\bfirst version\b|\bthis page's history\b|"
    r"\bthe last commit\b|\bstops? ago\b)|"
    r"\b20\d\d-[01]\d-[0-3]\d\b|"
    r"\b(?:January|February|March|April|May|June|July|August|September|October|November|"
    r"December) 20\d\d\b")


def _maintainer_texts() -> dict[str, str]:
    """What a maintainer reads besides the user-facing texts: the handler's C++ and the tests."""
    texts = dict(TEXTS)
    for path in sorted((ROOT / "jaxconv").rglob("*.cc")) + sorted((ROOT / "jaxconv").rglob("*.h")):
        texts[str(path.relative_to(ROOT))] = path.read_text()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name != "test_user_texts.py":  # this file names the phrases
            texts[str(path.relative_to(ROOT))] = path.read_text()
    return texts


_URL = re.compile(r"https?://\S+")
_PATH = re.compile(r"(?<![\w/.$<{-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:md|py|json|txt|ipynb|toml|png|cfg|ya?ml))\b")
# Paths a command writes (outputs) and placeholders are not references to repository files.
_OUTPUT = re.compile(r"(?:--out\s+|>\s*|results/|RESULTS / )[\"']?$")
# Scripts that write the files they name (figures, results).
_WRITERS = {"docs/figures.py"}


def _referenced_paths(text: str) -> list[str]:
    text = _URL.sub(" ", text)
    found = []
    for m in _PATH.finditer(text):
        before = text[max(0, m.start() - 12):m.start()]
        if _OUTPUT.search(before) or "results/" in m.group(1):
            continue
        found.append(m.group(1))
    return found


def _exists(ref: str, source: str, files: list[pathlib.Path]) -> bool:
    ref = ref.lstrip("./")
    if ref.startswith("_generated/figures/"):  # drawn by the docs build (docs/figures.py)
        return f'"{pathlib.PurePosixPath(ref).name}"' in (ROOT / "docs" / "figures.py").read_text()
    bases = [ROOT, (ROOT / source).parent, ROOT / "docs"]
    if any((base / ref).exists() for base in bases):
        return True
    return any(str(p.relative_to(ROOT)).endswith("/" + ref) for p in files)


@pytest.mark.parametrize("source", sorted(TEXTS))
def test_no_development_only_words(source):
    hits = sorted({m.group(0) for m in FORBIDDEN.finditer(TEXTS[source])})
    assert not hits, f"{source} mentions {hits}: name the vendor specification, or docs/semantics.md"


@pytest.mark.parametrize("source", sorted(_maintainer_texts()))
def test_no_diary(source):
    """README, docs, notebooks, docstrings and comments say what is true, not how it came to be."""
    text = _maintainer_texts()[source]
    hits = sorted({f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
                   for m in DIARY.finditer(text)})
    assert not hits, f"{source} reads as a diary ({hits}): state the rule; history goes to CHANGELOG.md"


def test_every_referenced_file_is_in_the_repository():
    files = _repo_files()
    missing = sorted({(source, ref) for source, text in TEXTS.items()
                      if source not in _WRITERS
                      for ref in _referenced_paths(text) if not _exists(ref, source, files)})
    assert not missing, f"user-facing texts name files that are not in the repository: {missing}"


def test_the_checks_can_fail():
    """The two checks above find what they are meant to find."""
    assert FORBIDDEN.search("see SEMANTICS.md section 1")
    assert FORBIDDEN.search("the seed's 3D example")
    assert FORBIDDEN.search("seed 001's prose")
    assert FORBIDDEN.search("the grouped case of issue 6")
    assert not FORBIDDEN.search("random seed (default 0)")
    assert not FORBIDDEN.search("rng = np.random.default_rng(seed)")
    assert not FORBIDDEN.search("docs/semantics.md and docs/api.md")
    for diary in ("as in the last stop's table", "measured on 2026-11-25", "a first version was not kept",
                  "the run before gave 1.1", "in November 2026",
                  "as in the last run"):
        assert DIARY.search(diary), diary
    for plain in ("the last run of zeros", "this version's figures", "stops at the first maximum",
                  "a version of 2026.4.1"):
        assert not DIARY.search(plain), plain
    files = _repo_files()
    assert _referenced_paths("read docs/missing_page.md and HAZARDS.md") == [
        "docs/missing_page.md", "HAZARDS.md"]
    assert not _exists("docs/missing_page.md", "README.md", files)
    assert _exists("docs/semantics.md", "README.md", files)
    assert _exists("semantics.md", "docs/onednn.md", files)
    # figures count when the docs build draws them, whether or not it has run yet
    assert _exists("_generated/figures/conv_padding.png", "docs/onednn.md", files)
    assert not _exists("_generated/figures/missing.png", "docs/onednn.md", files)
    assert _referenced_paths("python -m benchmarks.report full.json > table.md --out results/r.json"
                             ) == ["full.json"]
