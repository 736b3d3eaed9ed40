"""The formulations of the three kernels, one module per family, and their registry.

* ``common``: what the formulations share (accumulation types, padding, windows, per-tap
  products);
* ``convolution``: one relabelled ``lax.conv_general_dilated`` (``"conv"``,
  ``"feature_group"``, ``"vjp"``, ``"grid"``);
* ``phases``: the data gradient by stride phases (``"phases"``);
* ``taps``: matrix products per kernel tap (``"dot"``);
* ``shifted``: depthwise multiply-adds per tap (``"shifted"``);
* ``grouped``: the combinators of grouped problems (``"per_group"``, ``"block_diagonal"``);
* ``method``: the record of one method; ``registry``: all of them, and ``run``, which
  executes a call's plan;
* ``policy``: the plan of each call (its method, per device's blocks or not, fenced or not);
  ``measured``: the small CPU problems timed against XLA's own program; ``spmd``: the
  per-device calls of a partitioned program; ``onednn``: the oneDNN method and ``applies``.

Which method ``"auto"`` picks per problem and backend is ``jaxconv/_src/backends.py``.
"""

from jaxconv._src.lowering.common import accumulation_dtype, strided_and_dilated
from jaxconv._src.lowering.method import Method
from jaxconv._src.lowering.registry import (
    METHODS,
    choose,
    chosen_by,
    data_grad,
    document_lowering,
    forward,
    methods,
    one_device_method,
    run,
    weight_grad,
    why_not,
)

__all__ = [
    "METHODS",
    "Method",
    "accumulation_dtype",
    "choose",
    "chosen_by",
    "data_grad",
    "document_lowering",
    "forward",
    "methods",
    "one_device_method",
    "run",
    "strided_and_dilated",
    "weight_grad",
    "why_not",
]
