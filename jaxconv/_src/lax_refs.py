"""lax's convolution as it was when jaxconv was imported.

A program can make third-party code use jaxconv by assigning
``jax.lax.conv_general_dilated = jaxconv.conv_general_dilated`` (docs/migration.md). jaxconv
itself calls lax's function (for the calls it hands to lax, in its XLA formulations, in its
checks and benchmarks' baselines): every such call goes through the reference held here,
taken at import, so that the assignment never sends jaxconv back into itself.
"""

from __future__ import annotations

from jax import lax

#: ``jax.lax.conv_general_dilated`` as imported (never looked up again)
conv_general_dilated = lax.conv_general_dilated
