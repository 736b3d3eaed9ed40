"""The geometry of every jaxconv op: arguments, padding, layouts, the resolved problem.

Every public op is thin: it hands its arguments to a problem builder
(:func:`convolution_problem`, :func:`conv_transpose_problem`, and
``tbe_geometry.tbe_problem`` beside the TBE op), which validates everything
*before* any computation and returns a frozen :class:`ConvProblem`; the
kernels in ``lowering/`` only read that object. There is no other copy of
padding or shape logic in the package. By purpose:

* ``arguments``: arrays, dtypes, ranks, static shapes, int attributes, groups;
* ``padding``: output sizes, pad arithmetic and the auto_pad rules;
* ``layouts``: data and filter format strings;
* ``problem``: :class:`ConvProblem`, the attributes every family shares;
* ``convolution``, ``conv_transpose``: each family's problem builder.
"""

from jaxconv._src.geometry.arguments import (
    check_array,
    check_groups,
    check_same_dtype,
    int_tuple,
    spatial_rank,
    static_shape,
)
from jaxconv._src.geometry.conv_transpose import conv_transpose_problem
from jaxconv._src.geometry.convolution import convolution_problem, full_input_shape
from jaxconv._src.geometry.layouts import (
    CONV_TRANSPOSE_FILTER_FORMATS,
    CONVOLUTION_FILTER_FORMATS,
    DATA_FORMATS,
    ConvolutionFilterFormat,
    ConvTransposeFilterFormat,
    DataFormat,
    DataLayout,
    FilterLayout,
    data_layout,
    filter_layout,
)
from jaxconv._src.geometry.padding import (
    AUTO_PAD_MODES,
    AutoPadMode,
    PadRule,
    SizeRule,
    TransposePadRule,
    auto_pads,
    canonical_auto_pad,
    conv_output_size,
    conv_transpose_output_size,
    crop_of_pads,
    dilated_kernel_size,
    end_pad_for_output,
)
from jaxconv._src.geometry.problem import ConvProblem, Names

__all__ = [
    "AUTO_PAD_MODES",
    "CONVOLUTION_FILTER_FORMATS",
    "CONV_TRANSPOSE_FILTER_FORMATS",
    "DATA_FORMATS",
    "AutoPadMode",
    "ConvProblem",
    "ConvTransposeFilterFormat",
    "ConvolutionFilterFormat",
    "DataFormat",
    "DataLayout",
    "FilterLayout",
    "Names",
    "PadRule",
    "SizeRule",
    "TransposePadRule",
    "auto_pads",
    "canonical_auto_pad",
    "check_array",
    "check_groups",
    "check_same_dtype",
    "conv_output_size",
    "conv_transpose_output_size",
    "crop_of_pads",
    "conv_transpose_problem",
    "convolution_problem",
    "data_layout",
    "dilated_kernel_size",
    "end_pad_for_output",
    "filter_layout",
    "full_input_shape",
    "int_tuple",
    "spatial_rank",
    "static_shape",
]
