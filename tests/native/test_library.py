"""The native library's sources and build (``jaxconv/_src/native/library.py``, ``build.py``):
one file per concern in ``runtime/``, ``onednn/`` and ``winograd/``, none past 400 lines, Winograd
free of oneDNN, and every source in the build and in the handler's key."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from jaxconv._src.native import build, library

MAX_LINES = 400


def test_every_source_is_built_and_keys_the_handler():
    found = sorted(p for d in library.SOURCE_DIRS for p in d.iterdir() if p.suffix in (".cc", ".h"))
    assert found == sorted(library.SOURCES + library.HEADERS)
    assert {p.parent.name for p in found} == {"runtime", "onednn", "winograd", "pooling"}
    assert len({p.stem for p in library.SOURCES}) == len(library.SOURCES)  # one object each
    cmd = build.compile_command(library.SOURCES[0], pathlib.Path("x.o"), pathlib.Path("/r"))
    assert all(f"-I{d}" in cmd for d in library.SOURCE_DIRS)


def test_no_source_is_longer_than_400_lines():
    long = {p.name: n for p in library.SOURCES + library.HEADERS
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concern: {long}"


def test_winograd_does_not_use_onednn():
    for p in (s for s in library.SOURCES + library.HEADERS if s.parent.name == "winograd"):
        text = p.read_text()
        assert "dnnl" not in text and '#include "execute.h"' not in text, p.name


@pytest.mark.skipif(library.handler() is None or shutil.which("nm") is None,
                    reason="needs the built handler and binutils' nm")
def test_the_tile_transforms_are_compiled_into_each_isas_pass():
    """winograd_tiles.h's transforms are inlined into every ISA's pass: called out of line they
    run compiled for no ISA (a bfloat16 forward took 1.7x as long)."""
    symbols = subprocess.run(["nm", "-C", str(library.artefact())], capture_output=True,
                             text=True, check=True).stdout
    assert "Tile<" not in symbols
