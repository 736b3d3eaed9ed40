"""The types of jaxconv's public signatures, in one place.

Arrays and dtypes are JAX's own (``jax.typing``); precisions are
``lax.PrecisionLike``. Layout, auto_pad and lowering values are ``Literal``s of
what the ops accept (layouts and auto_pad in any case, as the specs spell them);
the ops still validate every value at run time, with errors naming the op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

import jax
import numpy as np
from jax import lax
from jax.typing import ArrayLike, DTypeLike

__all__ = [
    "ArrayLike",
    "AutoPad",
    "ConvTransposeFilterFormat",
    "ConvolutionFilterFormat",
    "DTypeLike",
    "DataFormat",
    "DataGradLowering",
    "ForwardLowering",
    "IntOrSeq",
    "PrecisionLike",
    "ShapeLike",
    "WeightGradLowering",
]

PrecisionLike: TypeAlias = lax.PrecisionLike
#: A shape argument: a tuple/list of ints, a 1-D integer numpy array or a concrete jax array.
ShapeLike: TypeAlias = Sequence[int] | np.ndarray | jax.Array
#: One int per spatial axis, one int for all, or None for the default.
IntOrSeq: TypeAlias = int | Sequence[int] | None

AutoPad: TypeAlias = Literal[
    "none", "explicit", "same_upper", "same_lower", "valid", "notset", "same",
    "NONE", "EXPLICIT", "SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET", "SAME",
]
DataFormat: TypeAlias = Literal["NXC", "NCX", "nxc", "ncx"]
ConvolutionFilterFormat: TypeAlias = Literal["XIO", "OIX", "xio", "oix"]
ConvTransposeFilterFormat: TypeAlias = Literal[
    "IOX", "XOI", "OIX", "XIO", "iox", "xoi", "oix", "xio"]
ForwardLowering: TypeAlias = Literal["auto", "direct", "conv", "dot", "shifted", "onednn",
                                     "onednn_f32", "winograd", "winograd_2x2", "winograd_3x3",
                                     "winograd_4x4", "per_group", "block_diagonal"]
WeightGradLowering: TypeAlias = Literal[
    "auto", "direct", "conv", "feature_group", "shifted", "dot", "vjp", "onednn", "onednn_f32",
    "winograd", "winograd_2x2", "winograd_3x3", "winograd_4x4", "per_group", "block_diagonal"]
DataGradLowering: TypeAlias = Literal["auto", "direct", "grid", "phases", "dot", "vjp", "onednn",
                                      "onednn_f32", "winograd", "winograd_2x2", "winograd_3x3",
                                      "winograd_4x4", "per_group", "block_diagonal"]
