"""The public array ops as data: the kernel each one's lowering runs.

The one list of which public names are ops (the command line, the docs test and
the bad-input catalogue read it), and of what an op's ``lowering=`` chooses among.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Kernel = Literal["forward", "data", "weight"]


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """One public array op (arrays in, one array out)."""

    #: the gradient kernel it lowers to ("forward": no lowering= choice)
    kernel: Kernel


ARRAY_OPS: dict[str, OpInfo] = {
    "convolution": OpInfo("forward"),
    "convolution_backward_data": OpInfo("data"),
    "convolution_backprop_filters": OpInfo("weight"),
    "convolution_backward_weights": OpInfo("weight"),
    "conv_transpose": OpInfo("data"),
    "conv_transpose_backward_data": OpInfo("forward"),
    "conv_transpose_backward_weights": OpInfo("weight"),
    "conv_transpose_backprop_filters": OpInfo("weight"),
    "group_convolution": OpInfo("forward"),
    "convolution_backprop_data": OpInfo("data"),
    "group_convolution_backprop_data": OpInfo("data"),
    "conv2d_backprop_filter": OpInfo("weight"),
    "conv_general_dilated": OpInfo("forward"),
}

#: Public ops that are not array ops: ``from_openvino_ir`` builds one from an IR layer.
OTHER_OPS = ("from_openvino_ir",)

#: Public names that are not ops at all.
NOT_OPS = ("__version__", "tbe", "xla_cpu_compiler_options")
