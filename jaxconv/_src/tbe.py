"""Ascend CANN TBE DSL ``conv2d_backprop_filter``: 5HD in, FRACTAL_Z out.

The op computes the weight gradient of a 2D convolution whose feature map
and output gradient are 5HD tensors, writing it in FRACTAL_Z. Here the 5HD
inputs are unpacked to NCHW with their real channel counts (so padded channel
slots never reach the result), the shared weight-gradient kernel of
``lowering`` runs with float32 accumulation, and the result is packed to
FRACTAL_Z with ``tbe_layouts.to_fractal_z``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import options, primitive, tbe_layouts
from jaxconv._src.geometry import ConvProblem
from jaxconv._src.kernel import Kernel
from jaxconv._src.tbe_geometry import tbe_problem
from jaxconv._src.typing import ArrayLike, ShapeLike, WeightGradLowering

_OP = "conv2d_backprop_filter"
_REQUIRED = ("strides", "padding", "dilations")
_OPTIONAL = {"groups": 1, "res_dtype": "float32", "kernel_name": None}
_RES_DTYPES = {"float32": jnp.float32, "float16": jnp.float16}


def _para(para_dict: Any) -> dict[str, Any]:
    if not isinstance(para_dict, dict):
        raise TypeError(f"{_OP}: para_dict must be a dict, got {type(para_dict).__name__}")
    for key in para_dict:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise ValueError(f"{_OP}: para_dict has an unknown key {key!r}; the keys are "
                             f"{list(_REQUIRED) + list(_OPTIONAL)}")
    missing = [k for k in _REQUIRED if k not in para_dict]
    if missing:
        raise ValueError(f"{_OP}: para_dict is missing the key(s) {missing} "
                         f"(required: {list(_REQUIRED)})")
    out = dict(_OPTIONAL, **para_dict)
    if out["res_dtype"] not in _RES_DTYPES:
        raise ValueError(f"{_OP}: para_dict['res_dtype'] must be 'float32' or 'float16', got "
                         f"{out['res_dtype']!r}")
    if out["kernel_name"] is not None and not isinstance(out["kernel_name"], str):
        raise TypeError(f"{_OP}: para_dict['kernel_name'] must be a string, got "
                        f"{out['kernel_name']!r}")
    return out


def _compute(x5: jax.Array, dy5: jax.Array, p: ConvProblem, res_dtype: Any,
             method: str) -> jax.Array:
    x = tbe_layouts.from_5hd(x5, p.in_channels)
    dy = tbe_layouts.from_5hd(dy5, p.out_channels)
    dw = primitive.weight_grad(x, dy, p=p, precision=lax.Precision.HIGHEST,
                              preferred_element_type=jnp.float32, method=method)
    return tbe_layouts.to_fractal_z(dw, p.groups).astype(res_dtype)


def conv2d_backprop_filter(
    input_x: ArrayLike, out_backprop: ArrayLike, filter_sizes: ShapeLike,
    para_dict: dict[str, Any], *,
    lowering: WeightGradLowering = "auto",
) -> jax.Array:
    r"""Ascend TBE ``conv2d_backprop_filter``: the 2D weight gradient, 5HD in, FRACTAL_Z out.

    .. math::
        dW[co, ci, kh, kw] = \sum_{n, ho, wo} x[n, g \cdot C_{in,g} + ci,\ ho\, s_H + kh\, d_H - p_t,
        \ wo\, s_W + kw\, d_W - p_l] \; dy[n, co, ho, wo]

    (``co`` in group ``g``), accumulated in float32 and packed to FRACTAL_Z
    (see :mod:`jaxconv.tbe`). The CANN page's first sentence ("Computes 2D
    deconvolution") is a translation slip: it is this weight gradient.
    With groups, the DSL's enlarge packing is used and the cross-group blocks
    hold zeros (the DSL's dense multiply would put non-gradient products
    there), so :func:`jaxconv.tbe.from_fractal_z` gives exactly the grouped
    weight gradient.

    Args:
      input_x: the feature map, 5HD ``(N, C1, H, W, 16)``, ``C1 = ceil(groups *
        Cin/groups / 16)``. float16 as the DSL requires; float32 and bfloat16
        are accepted too. Padded channel slots may hold anything.
      out_backprop: the output gradient, 5HD ``(N, ceil(Cout / 16), Ho, Wo, 16)``,
        same dtype; ``Ho = (H + pt + pb - DKH) // sH + 1``, likewise ``Wo``.
      filter_sizes: ``(Cout, Cin/groups, KH, KW)``.
      para_dict: ``strides`` [sH, sW]; ``padding`` [top, bottom, left, right];
        ``dilations`` [1, 1, dH, dW]; optional ``groups`` (default 1),
        ``res_dtype`` ("float32" default or "float16") and ``kernel_name`` (a
        name only; nothing is compiled under it).
      lowering: the weight-gradient formulation, as in
        :func:`jaxconv.convolution_backprop_filters` (not a DSL parameter).

    Returns:
      FRACTAL_Z in ``res_dtype``: ``(1, C1*KH*KW, ceil(Cout/16)*16, 16)`` for
      ``groups=1``; ``(real_g, cin1_g*KH*KW, cout_g, 16)`` otherwise.

    Raises:
      ValueError: C0 != 16, C1 inconsistent with filter_sizes and groups,
        Ho/Wo not the forward output size, dilations not [1, 1, dH, dW], unknown
        res_dtype, missing or unknown para_dict keys; each names the key.
      TypeError: non-array inputs, non-floating or mismatched dtypes, para_dict
        not a dict.

    Example (the CANN page's, with arrays in place of the placeholders):
      >>> import jax.numpy as jnp, jaxconv
      >>> fmap = jnp.ones((1, 1, 7, 7, 16), jnp.float16)
      >>> out_backprop = jnp.ones((1, 1, 7, 7, 16), jnp.float16)
      >>> para_dict = {"strides": [1, 1], "padding": [0, 0, 0, 0], "dilations": [1, 1, 1, 1],
      ...              "groups": 1, "res_dtype": "float32",
      ...              "kernel_name": "conv2d_backprop_filter_dx_1_1_7_7_16_dy_1_1_7_7_16"}
      >>> res = jaxconv.conv2d_backprop_filter(fmap, out_backprop, (16, 16, 1, 1), para_dict)
      >>> res.shape, res.dtype, float(res[0, 0, 0, 0])
      ((1, 1, 16, 16), dtype('float32'), 49.0)
    """
    (x5, dy5), _, _ = options.check_inputs(
        _OP, {"input_x": input_x, "out_backprop": out_backprop}, None, None)
    para = _para(para_dict)
    p = tbe_problem(
        _OP, x5_shape=tuple(x5.shape), dy5_shape=tuple(dy5.shape), filter_sizes=filter_sizes,
        strides=para["strides"], padding=para["padding"], dilations=para["dilations"],
        groups=para["groups"])
    return _compute(x5, dy5, p, np.dtype(_RES_DTYPES[para["res_dtype"]]),
                    options.check_lowering(_OP, Kernel.WEIGHT, lowering, p))
