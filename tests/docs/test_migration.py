"""docs/migration.md: every example runs and agrees with the library it maps from.

Each ```python block of the page is executed as it stands (its own imports, its own
``jaxconv.testing.assert_close`` against PyTorch or ``jax.lax``: the per-dtype bound of the
test suite's tolerance table); a block that raises fails here.
"""

from __future__ import annotations

import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "migration.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def _title(code: str) -> str:
    text = PAGE.read_text()
    heading = re.findall(r"^#+ (.+)$", text[:text.index(code)], flags=re.M)
    return re.sub(r"\W+", "-", heading[-1]).strip("-").lower()


def test_the_page_has_examples():
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("code", BLOCKS, ids=[_title(b) for b in BLOCKS])
def test_example(code):
    exec(compile(code, str(PAGE), "exec"), {"__name__": "migration_example"})


def test_the_handed_to_lax_table_is_the_codes():
    """docs/migration.md lists the calls jaxconv.conv_general_dilated hands to lax from the same
    table the code uses (HANDED_TO_LAX), row for row, and docs/training.md points to it."""
    from jaxconv._src.lowering.chooser import HANDED_TO_LAX

    text = PAGE.read_text()
    section = text[text.index("#### Computed by jaxconv, handed to lax"):]
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", section, flags=re.M)
    assert rows[1:1 + len(HANDED_TO_LAX)] == list(HANDED_TO_LAX.items())  # after the header
    training = (PAGE.parent / "training.md").read_text()
    assert "{doc}`migration`, \"Computed by\n  jaxconv, handed to lax\"" in training
