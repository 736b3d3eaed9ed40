"""The public array ops as data: the kernel each one's lowering runs.

The one list of which public names are ops (the command line, the docs test and
the bad-input catalogue read it), and of what an op's ``lowering=`` chooses among.
"""

from __future__ import annotations

import dataclasses

from jaxconv._src.kernel import Kernel


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """One public array op (arrays in, one array out)."""

    #: the kernel it lowers to (its ``lowering=`` chooses among that kernel's methods)
    kernel: Kernel


ARRAY_OPS: dict[str, OpInfo] = {
    "convolution": OpInfo(Kernel.FORWARD),
    "convolution_backward_data": OpInfo(Kernel.DATA),
    "convolution_backprop_filters": OpInfo(Kernel.WEIGHT),
    "convolution_backward_weights": OpInfo(Kernel.WEIGHT),
    "conv_transpose": OpInfo(Kernel.DATA),
    "conv_transpose_backward_data": OpInfo(Kernel.FORWARD),
    "conv_transpose_backward_weights": OpInfo(Kernel.WEIGHT),
    "conv_transpose_backprop_filters": OpInfo(Kernel.WEIGHT),
    "group_convolution": OpInfo(Kernel.FORWARD),
    "convolution_backprop_data": OpInfo(Kernel.DATA),
    "group_convolution_backprop_data": OpInfo(Kernel.DATA),
    "conv2d_backprop_filter": OpInfo(Kernel.WEIGHT),
    "conv_general_dilated": OpInfo(Kernel.FORWARD),
}

#: Public ops that are not array ops: ``from_openvino_ir`` builds one from an IR layer.
OTHER_OPS = ("from_openvino_ir", "max_pool")

#: Public names that are not ops at all.
NOT_OPS = ("Explanation", "LateImportWarning", "Tuned", "__version__", "accelerate", "explain",
           "keep_freed_memory", "onednn_export_checks", "tbe", "tune", "xla_cpu_compiler_options")
