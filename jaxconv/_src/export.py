"""``jaxconv.onednn_export_checks``: serializing jaxconv's oneDNN calls with ``jax.export``.

An export holds no oneDNN call by default: the primitive's lowering sees that it lowers for
``jax.export`` (``primitive.exported``) and emits the portable XLA formulations, which any
process runs, with or without jaxconv. An op called with ``lowering="onednn"`` keeps the
call; JAX serializes a custom call without a compatibility guarantee only when the caller
disables that check, and the process that runs the artifact must have the handler registered.
"""

from __future__ import annotations

import jax

from jaxconv._src.native import library


def onednn_export_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The checks ``jax.export`` must skip to serialize jaxconv's oneDNN calls; registers them.

    By default ``jax.export`` of a function that uses jaxconv holds no oneDNN call (the
    portable XLA formulations: the artifact runs in any process, one that never imports
    jaxconv included). An op called with ``lowering="onednn"`` keeps its call in the export;
    pass this list as ``disabled_checks`` to serialize it. The process that runs such an
    artifact needs jaxconv's handler registered: call this function there too (it loads the
    handler and registers its FFI targets). Without it the call fails with XLA's
    ``NOT_FOUND: No FFI handler registered for jaxconv_onednn_...``.

    Returns:
      One ``jax.export.DisabledSafetyCheck.custom_call`` per oneDNN target of jaxconv
      (forward, data gradient, weight gradient).

    Raises:
      RuntimeError: jaxconv's oneDNN handler is not available in this process (the message
        says why: the extra not built, switched off by ``JAXCONV_ONEDNN=0``, ...).

    Example:
      >>> import jax, jax.numpy as jnp, jaxconv
      >>> x, dy = jnp.ones((2, 8, 8, 4)), jnp.ones((2, 8, 8, 6))
      >>> f = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(
      ...     x, dy, (3, 3, 4, 6), pads_begin=1, pads_end=1))
      >>> exported = jax.export.export(f)(x, dy)  # portable: no oneDNN call
      >>> "jaxconv_onednn" in exported.mlir_module()
      False
    """
    status = library.status()
    if not status.available:
        raise RuntimeError(f"onednn_export_checks: jaxconv's oneDNN handler is not available "
                           f"in this process: {status.line()}")
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in library.TARGETS.values()]
