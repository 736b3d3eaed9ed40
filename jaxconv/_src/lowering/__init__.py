"""The formulations of the three kernels, one module per family, and their registry.

* ``common``: what the formulations share (accumulation types, padding, windows, per-tap
  products);
* ``convolution``: one relabelled ``lax.conv_general_dilated`` (``"conv"``,
  ``"feature_group"``, ``"vjp"``, ``"grid"``);
* ``phases``: the data gradient by stride phases (``"phases"``);
* ``taps``: matrix products per kernel tap (``"dot"``);
* ``shifted``: depthwise multiply-adds per tap (``"shifted"``);
* ``grouped``: the combinators of grouped problems (``"per_group"``, ``"block_diagonal"``);
* ``method``: the record of one method; ``methods``: all of them; ``registry``: ``run``,
  which executes a call's plan, and the ops' ``lowering=`` paragraphs;
* ``chooser``: the one place that decides, each call's resolved plan (its method and
  parameters, per device's blocks or not, its fallback, and why), from ``tables`` (the
  per-backend rules, data) and ``measured`` (the timed candidates' verdicts, cached);
  ``execute``: runs a plan; ``spmd``: the per-device calls of a partitioned program;
  ``onednn``: the oneDNN method and ``applies``; ``max_pool``: the handler's max pool.
"""

from jaxconv._src.lowering.chooser import (
    BACKENDS,
    CHOOSING,
    PLATFORMS,
    keep_freed_memory,
    lax_computes,
    max_pool_on_handler,
    max_pool_why_not,
    one_device_method,
    plan,
    product_on_onednn,
    product_why_not,
)
from jaxconv._src.lowering.common import accumulation_dtype, strided_and_dilated
from jaxconv._src.lowering.method import Method
from jaxconv._src.lowering.registry import (
    METHODS,
    choose,
    data_grad,
    document_lowering,
    forward,
    methods,
    run,
    weight_grad,
    why_not,
)

__all__ = [
    "BACKENDS",
    "CHOOSING",
    "METHODS",
    "PLATFORMS",
    "Method",
    "accumulation_dtype",
    "choose",
    "data_grad",
    "document_lowering",
    "forward",
    "keep_freed_memory",
    "lax_computes",
    "max_pool_on_handler",
    "max_pool_why_not",
    "methods",
    "one_device_method",
    "plan",
    "product_on_onednn",
    "product_why_not",
    "run",
    "strided_and_dilated",
    "weight_grad",
    "why_not",
]
