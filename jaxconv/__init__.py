"""jaxconv: differentiable convolution-gradient operators for JAX.

The oneDNN Graph, OpenVINO and Ascend TBE convolution-gradient operators as
pure JAX functions that run under ``jit``, ``vmap`` and ``grad`` on any
backend. See ``README.md`` and ``docs/``.
"""

# first, before any module computes: keep the memory XLA:CPU frees (docs/training.md, "Host memory")
from jaxconv._src.host_memory import keep_at_import as _keep_at_import

_keep_at_import()

from jaxconv import tbe  # noqa: E402
from jaxconv._src.accelerate import Explanation, accelerate, explain
from jaxconv._src.config import xla_cpu_compiler_options
from jaxconv._src.conv_transpose import (
    conv_transpose,
    conv_transpose_backprop_filters,
    conv_transpose_backward_data,
    conv_transpose_backward_weights,
)
from jaxconv._src.convolution import (
    convolution,
    convolution_backprop_filters,
    convolution_backward_data,
    convolution_backward_weights,
)
from jaxconv._src.export import onednn_export_checks
from jaxconv._src.host_memory import LateImportWarning, keep_freed_memory
from jaxconv._src.lax_conv import conv_general_dilated
from jaxconv._src.openvino import (
    convolution_backprop_data,
    group_convolution,
    group_convolution_backprop_data,
)
from jaxconv._src.openvino_ir import from_openvino_ir
from jaxconv._src.pooling import max_pool
from jaxconv._src.tbe import conv2d_backprop_filter
from jaxconv._src.tune import Tuned, tune
from jaxconv._src.version import __version__

__all__ = [
    "Explanation",
    "LateImportWarning",
    "Tuned",
    "__version__",
    "accelerate",
    "conv2d_backprop_filter",
    "conv_general_dilated",
    "conv_transpose",
    "conv_transpose_backprop_filters",
    "conv_transpose_backward_data",
    "conv_transpose_backward_weights",
    "convolution",
    "convolution_backprop_data",
    "convolution_backprop_filters",
    "convolution_backward_data",
    "convolution_backward_weights",
    "explain",
    "from_openvino_ir",
    "group_convolution",
    "group_convolution_backprop_data",
    "keep_freed_memory",
    "max_pool",
    "onednn_export_checks",
    "tbe",
    "tune",
    "xla_cpu_compiler_options",
]
