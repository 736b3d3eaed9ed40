"""The benchmark runner (``jaxconv bench``) and the oneDNN benchdnn problem lists it reads.

``main`` is the command line; ``parse_line`` / ``load`` read benchdnn problems; ``measure``
times one problem's gradient through jaxconv, ``jax.vjp`` and (when installed) PyTorch,
interleaved in this process. Needs the ``bench`` extra for PyTorch and the plots.
"""

from jaxconv._src.bench.benchdnn import SHAPES, Problem, load, parse_line
from jaxconv._src.bench.run import PRESETS, main, measure

__all__ = ["PRESETS", "SHAPES", "Problem", "load", "main", "measure", "parse_line"]
