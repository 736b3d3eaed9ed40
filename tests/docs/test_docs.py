"""The documentation: the site builds (warnings are errors) and runs every notebook; the API
reference and the docstrings are complete."""

from __future__ import annotations

import importlib.util
import inspect
import json
import pathlib
import re
import subprocess
import sys

import pytest

import jaxconv
from jaxconv import tbe
from jaxconv._src import registry

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# The public ops (array in, array out) must also state their formula.
OPS = list(registry.ARRAY_OPS)


def _public_functions():
    for name in jaxconv.__all__:
        obj = getattr(jaxconv, name)
        if inspect.isfunction(obj):
            yield name, obj
    for name in tbe.__all__:
        yield f"tbe.{name}", getattr(tbe, name)


def test_api_reference_lists_every_public_name():
    text = (DOCS / "api.md").read_text()
    documented = set(re.findall(r"\.\. auto(?:function|class):: jaxconv\.(\w+)", text))
    module = re.search(r"\.\. automodule:: jaxconv\.tbe\n\s+:members: ([\w, ]+)", text)
    assert module, "api.md must document jaxconv.tbe with its members"
    members = {m.strip() for m in module.group(1).split(",")}
    missing = [n for n in jaxconv.__all__ if n not in documented | {"__version__", "tbe"}]
    assert not missing, f"in jaxconv.__all__ but not in docs/api.md: {missing}"
    assert members >= set(tbe.__all__) - {"conv2d_backprop_filter"}
    assert not documented - set(jaxconv.__all__), "api.md documents a name not in __all__"


@pytest.mark.parametrize("name,fn", [pytest.param(n, f, id=n) for n, f in _public_functions()])
def test_docstring_sections(name, fn):
    doc = inspect.getdoc(fn) or ""
    has_params = bool(inspect.signature(fn).parameters)
    for section in (["Args:", "Raises:"] if has_params else []) + ["Returns:", "Example"]:
        assert section in doc, f"{name}: the docstring has no {section!r} section"
    assert ">>>" in doc, f"{name}: the docstring has no runnable example"
    if name in OPS or name == "tbe.conv2d_backprop_filter":
        assert ".. math::" in doc, f"{name}: the docstring does not state the formula"
        assert re.search(r"NXC|NCX|5HD", doc), f"{name}: the docstring does not state the layouts"


def test_every_notebook_is_in_the_docs_and_stored_without_outputs():
    index = (DOCS / "index.md").read_text()
    for nb in NOTEBOOKS:
        assert f"_generated/notebooks/{nb.stem}" in index, f"{nb.name} is not in docs/index.md"
        cells = json.loads(nb.read_text())["cells"]
        assert not any(c.get("outputs") for c in cells if c["cell_type"] == "code"), \
            f"{nb.name} is stored with outputs"
    assert {"quickstart", "onednn", "openvino", "tbe", "performance"} <= {nb.stem for nb in NOTEBOOKS}


@pytest.mark.skipif(importlib.util.find_spec("myst_nb") is None,
                    reason="the docs extra (sphinx, myst-nb, furo) is not installed")
def test_docs_build_and_execute_every_notebook(tmp_path):
    """sphinx -W: any warning, broken reference, missing API entry or notebook error fails."""
    out = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
         str(DOCS), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for nb in NOTEBOOKS:  # executed: their outputs are in the pages
        page = (out / "_generated" / "notebooks" / f"{nb.stem}.html").read_text()
        assert "Traceback" not in page, f"{nb.name}: a cell printed a traceback"
        if nb.stem != "quickstart":
            assert "<img" in page, f"{nb.name}: no figure in the executed page"
    api = (out / "api.html").read_text()
    for name in OPS:
        assert f'id="jaxconv.{name}"' in api
    images = {p.name for p in (out / "_images").iterdir()}
    for fig in ("conv_padding", "conv_transpose_padding", "data_layouts", "filter_layouts",
                "tbe_5hd", "auto_pad_split"):
        assert f"{fig}.png" in images


def test_registry_names_every_public_name():
    """Every public name is an array op, another op or a known non-op: nothing is forgotten."""
    listed = set(registry.ARRAY_OPS) | set(registry.OTHER_OPS) | set(registry.NOT_OPS)
    assert listed == set(jaxconv.__all__)
