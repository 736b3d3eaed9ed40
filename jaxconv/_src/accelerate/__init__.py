"""``jaxconv.accelerate`` (``transform.py``; its rewrites, ``rewrites/``, read a jaxpr's
``analysis.py``; 16-bit arithmetic, ``widening.py``) and ``jaxconv.explain`` (``explain.py``)."""

from jaxconv._src.accelerate.explain import Explanation, explain
from jaxconv._src.accelerate.transform import accelerate

__all__ = ["Explanation", "accelerate", "explain"]
