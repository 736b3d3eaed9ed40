"""Compiler options a caller can give its own ``jax.jit``.

The lowering of each op is chosen by its static ``lowering=`` argument (and,
for ``"auto"``, per backend inside the traced program: ``lowering/tables.py``); no
global state changes a program behind JAX's jit cache.
"""

from __future__ import annotations


def xla_cpu_compiler_options() -> dict[str, str]:
    """XLA:CPU compiler options that speed up large-kernel convolutions (jaxlib 0.10).

    An op cannot set compiler options for the ``jax.jit`` it is traced in, so
    they are offered to the caller: ``jax.jit(step, compiler_options=
    jaxconv.xla_cpu_compiler_options())``. They select XLA:CPU's
    individual-dot convolution library, measured 3-5x faster on 7x7 and 11x11
    weight gradients and slower on depthwise ones (``docs/lowerings.md``, "Compiler options").
    The option is experimental in XLA: a jaxlib that does not know it rejects
    it at compile time.

    Returns:
      A dict for the ``compiler_options`` argument of ``jax.jit`` (CPU only).

    Example:
      >>> import jaxconv
      >>> jaxconv.xla_cpu_compiler_options()
      {'xla_cpu_experimental_ynn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'}
    """
    return {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
