"""``jaxconv.accelerate`` (``transform.py``), the lax patterns it recognises (``patterns.py``)
and ``jaxconv.explain`` (``explain.py``)."""

from jaxconv._src.accelerate.explain import Explanation, explain
from jaxconv._src.accelerate.transform import accelerate

__all__ = ["Explanation", "accelerate", "explain"]
