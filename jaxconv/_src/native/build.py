"""``jaxconv build-onednn``: compiles the oneDNN lowering's handler (the declared build step).

The ``onednn`` extra installs oneDNN 3.2 as PyPI's CPU-only GNU OpenMP build
(``onednn-cpu-gomp`` + ``onednn-devel-cpu-gomp`` 2023.2.0: ``lib/libdnnl.so.3`` needing only
the system's ``libgomp``, headers, CMake files). This step compiles the handler's sources
(``*/*.cc``, one compiler process per file, as many at once as there are cores) against it
and against XLA's FFI headers (shipped with jaxlib) with the system's C++ compiler, and links
them into :func:`library.artefact`. It runs only when asked, never at import.

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
from concurrent.futures import ThreadPoolExecutor

from jaxconv._src.native import library

#: sources compiled with more than -O2: the Winograd transforms' channel loops need -O3's
#: vectoriser (its loops with run-time alias checks and remainders), and its products' kernels
#: the full unrolling of their register blocks; the max pool's channel loops the vectoriser
OPTIMIZE = {"winograd.cc": "-O3", "winograd_passes.cc": "-O3", "winograd_product.cc": "-O3",
            "max_pool.cc": "-O3"}


def _cxx() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"


def compile_command(source: pathlib.Path, obj: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The compiler command that builds one of the handler's sources into object ``obj``."""
    import jax

    return [_cxx(), "-std=c++17", OPTIMIZE.get(source.name, "-O2"), "-fPIC", "-Wno-return-type", "-c",
            f"-I{jax.ffi.include_dir()}", f"-I{root / 'include'}", *(f"-I{d}" for d in library.SOURCE_DIRS),
            str(source), "-o", str(obj)]


def link_command(objs: list[pathlib.Path], out: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The command that links the handler's objects into the shared library ``out``."""
    return [_cxx(), "-shared", *map(str, objs), "-o", str(out), f"-L{root / 'lib'}", "-ldnnl"]


def _run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(shlex.join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"build-onednn: the compiler failed ({shlex.join(cmd)}):\n"
                           f"{proc.stderr[-4000:]}")


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
        objs = [pathlib.Path(tmp) / (src.stem + ".o") for src in library.SOURCES]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for done in [pool.submit(_run, compile_command(src, obj, root), verbose)
                         for src, obj in zip(library.SOURCES, objs)]:
                done.result()
        part = pathlib.Path(tmp) / out.name
        _run(link_command(objs, part, root), verbose)
        part.replace(out)  # atomic: a concurrent loader never sees a partial file
    return out
