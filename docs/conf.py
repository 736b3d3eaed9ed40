"""Sphinx configuration: MyST pages, notebooks executed by myst-nb, API from docstrings.

Build (warnings are errors):  python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import pathlib
import shutil
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

import jaxconv  # noqa: E402

project = "jaxconv"
author = "jaxconv developers"
release = version = jaxconv.__version__
copyright = "2026, jaxconv developers"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "benchmarks", "README.md", "**.ipynb_checkpoints"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# Notebooks: the ones in ../notebooks, copied here and executed on every build; an error in
# any cell fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_merge_streams = True

autodoc_typehints = "none"  # the signatures show the hints; the Args sections say the rest
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"jaxconv {release}"
suppress_warnings = ["myst.header"]


def _prepare() -> None:
    """Pictures drawn from the geometry module, and the notebooks, into docs/_generated."""
    import figures

    gen = DOCS / "_generated"
    figures.main(str(gen / "figures"))
    nb_dir = gen / "notebooks"
    if nb_dir.exists():
        shutil.rmtree(nb_dir)
    nb_dir.mkdir(parents=True)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copy(nb, nb_dir / nb.name)
    shutil.copy(DOCS / "benchmarks" / "full.json", gen / "full.json")


_prepare()


# ------------------------------------------------------------------ API completeness check
_DOCUMENTED: set[str] = set()


def _record(app, what, name, obj, options, lines):
    _DOCUMENTED.add(name)


def _check_api(app, exception):
    if exception is not None:
        return
    missing = [n for n in jaxconv.__all__
               if n != "__version__" and f"jaxconv.{n}" not in _DOCUMENTED]
    if missing:
        from sphinx.util import logging
        logging.getLogger(__name__).warning(
            "jaxconv.__all__ names missing from the API reference (docs/api.md): %s",
            ", ".join(missing))
        app.statuscode = 1


def setup(app):
    app.connect("autodoc-process-docstring", _record)
    app.connect("build-finished", _check_api)
