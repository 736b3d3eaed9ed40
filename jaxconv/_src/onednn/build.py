"""``jaxconv build-onednn``: compiles the oneDNN lowering's handler (the declared build step).

The ``onednn`` extra installs oneDNN 3.2 as PyPI's CPU-only GNU OpenMP build
(``onednn-cpu-gomp`` + ``onednn-devel-cpu-gomp`` 2023.2.0: ``lib/libdnnl.so.3`` needing only
the system's ``libgomp``, headers, CMake files). This step compiles ``handler.cc`` against it
and against XLA's FFI headers (shipped with jaxlib) with the system's C++ compiler, into
:func:`library.artefact`. It runs only when asked, never at import.

Why that build (docs/onednn.md): the newer ``onednn`` 2026.1.0 wheel is a SYCL/TBB build whose
dependencies take 3.4 GB and which needs ``OCL_ICD_FILENAMES`` set before it can create a CPU
engine; no newer CPU-only wheel exists.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile

from jaxconv._src.onednn import library


def command(out: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The compiler command that builds the handler into ``out`` against oneDNN at ``root``."""
    import jax

    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"
    return [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-Wno-return-type",
            f"-I{jax.ffi.include_dir()}", f"-I{root / 'include'}", str(library.SOURCE),
            "-o", str(out), f"-L{root / 'lib'}", "-ldnnl"]


def build(root: pathlib.Path | None = None, *, verbose: bool = False) -> pathlib.Path:
    """Compiles the handler against the oneDNN at ``root`` (default: :func:`library.prefix`).

    Returns:
      the built library's path (already there when built before from the same inputs).

    Raises:
      FileNotFoundError: no oneDNN headers or library under ``root``.
      RuntimeError: the compiler failed (its output in the message).
    """
    root = library.prefix() if root is None else root
    if not (root / "include" / "oneapi" / "dnnl" / "dnnl.hpp").exists() or \
            library.library_file(root) is None:
        raise FileNotFoundError(
            f"build-onednn: oneDNN headers and library not found under {root} (expected "
            f"include/oneapi/dnnl/dnnl.hpp and lib/libdnnl.so.3); install them with "
            f"pip install -e \".[onednn]\" or set JAXCONV_ONEDNN_PREFIX")
    out = library.artefact(root)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = pathlib.Path(tmp) / out.name
        cmd = command(part, root)
        if verbose:
            print(shlex.join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"build-onednn: the compiler failed ({shlex.join(cmd)}):\n"
                               f"{proc.stderr[-4000:]}")
        part.replace(out)  # atomic: a concurrent loader never sees a partial file
    return out
