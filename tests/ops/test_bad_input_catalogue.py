"""The bad-input catalogue: every invalid call of the per-family error tables, across all ops.

The tables (``tests/ops/test_*_errors.py``) hold the invalid calls; this module joins them,
checks the catalogue's coverage (at least 40 calls, every op, every kind of mistake), runs each
call once more under the booby trap (nothing may be computed before the error), and keeps the
table of ``docs/errors.md`` equal to what the calls really raise:

    python -m tests.ops.test_bad_input_catalogue > docs/errors.md
"""

from __future__ import annotations

import pathlib
import re

import pytest

from jaxconv._src import registry
from tests.ops import (
    test_conv_transpose_errors,
    test_convolution_errors,
    test_lax_conv_errors,
    test_openvino_errors,
    test_pooling_errors,
    test_tbe_errors,
)

FAMILIES = {
    "oneDNN Convolution": test_convolution_errors,
    "oneDNN ConvTranspose": test_conv_transpose_errors,
    "OpenVINO": test_openvino_errors,
    "Ascend TBE": test_tbe_errors,
    "JAX lax": test_lax_conv_errors,
    "Max pool": test_pooling_errors,
}
CATALOGUE = [(family, *case) for family, mod in FAMILIES.items() for case in mod.CASES]
DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "errors.md"

# Kinds of mistake the catalogue must cover, recognised from the case ids.
KINDS = {
    "wrong rank": r"rank",
    "inconsistent channels or groups": r"channel|group",
    "inconsistent spatial shapes": r"spatial|output-shape|ho|wo|crop|size",
    "negative, zero or wrong-length attributes": r"negative|zero|length|nonpositive|stride|dilation|pad",
    "unknown strings": r"unknown|format|auto-pad|res-dtype|kind",
    "wrong dtypes": r"dtype|bool|complex|int",
    "traced shape arguments": r"traced",
    "non-array inputs": r"not-array|kind|para-kind",
}


def _raise(thunk):
    try:
        thunk()
    except (ValueError, TypeError) as e:
        return e
    raise AssertionError("no error raised")


def _op_names() -> set[str]:
    return set(registry.ARRAY_OPS) | set(registry.OTHER_OPS)


def test_catalogue_covers_every_op_and_kind():
    assert len(CATALOGUE) >= 40
    ops_seen = {str(_raise(thunk)).split(":")[0] for _, _, thunk, _, _ in CATALOGUE}
    missing = _op_names() - ops_seen
    assert not missing, f"no invalid call of {sorted(missing)} in the catalogue"
    for kind, pattern in KINDS.items():
        assert any(re.search(pattern, cid) for _, cid, *_ in CATALOGUE), f"no case of {kind}"


@pytest.mark.parametrize("family,cid,thunk,exc,parts", CATALOGUE,
                         ids=[f"{f.split()[-1]}-{c[0]}" for f, *c in CATALOGUE])
def test_each_call_raises_before_computing(no_compute, family, cid, thunk, exc, parts):
    err = _raise(thunk)
    assert type(err) is exc or isinstance(err, exc)
    msg = str(err)
    op = msg.split(":")[0]
    assert op in _op_names() | {"from_openvino_ir", "to_5hd", "from_5hd", "to_fractal_z",
                                "from_fractal_z"}, msg
    assert ": " in msg and len(msg) > len(op) + 10, msg


def render() -> str:
    lines = [
        "# Bad input: the catalogue",
        "",
        "Every invalid call below raises before anything is computed (the tests booby-trap",
        "`lax.conv_general_dilated` and `lax.pad`), with a `ValueError` for a wrong value or shape",
        "and a `TypeError` for a wrong kind of argument; the message starts with the op's name,",
        "names the argument, and states what was expected and what was given. The table is",
        "generated from the tests (`python -m tests.ops.test_bad_input_catalogue > docs/errors.md`), and",
        "`tests/ops/test_bad_input_catalogue.py` fails when it is out of date.",
        "",
        f"{len(CATALOGUE)} invalid calls across the {len(FAMILIES)} families.",
        "",
        "| family | case | raises | message |",
        "|---|---|---|---|",
    ]
    for family, cid, thunk, exc, _ in CATALOGUE:
        msg = str(_raise(thunk)).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {family} | `{cid}` | `{exc.__name__}` | {msg} |")
    return "\n".join(lines) + "\n"


def test_docs_table_is_up_to_date():
    assert DOC.read_text() == render(), (
        "docs/errors.md is out of date: python -m tests.ops.test_bad_input_catalogue > docs/errors.md")


if __name__ == "__main__":
    print(render(), end="")
