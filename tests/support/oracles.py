"""PyTorch autograd as the independent oracle (float64, NCX data, OIX filters)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _torch_pad(pads_begin, pads_end):
    # F.pad takes (last axis begin, last axis end, previous axis ...); negative crops.
    out = []
    for b, e in zip(reversed(pads_begin), reversed(pads_end)):
        out += [int(b), int(e)]
    return out


def conv_all(x_ncx, w_oix, dy_ncx, *, strides, dilations, pads_begin, pads_end, groups):
    """(y, dx, dW) of an explicitly padded torch convolution, float64."""
    n = x_ncx.ndim - 2
    x = torch.tensor(np.asarray(x_ncx, np.float64), requires_grad=True)
    w = torch.tensor(np.asarray(w_oix, np.float64), requires_grad=True)
    xp = F.pad(x, _torch_pad(pads_begin, pads_end))
    y = _CONV[n](xp, w, stride=tuple(strides), dilation=tuple(dilations), groups=groups)
    if dy_ncx is None:
        return y.detach().numpy(), None, None
    y.backward(torch.tensor(np.asarray(dy_ncx, np.float64)))
    return y.detach().numpy(), x.grad.numpy(), w.grad.numpy()


def conv_output_shape(x_shape, w_shape, **attrs):
    y, _, _ = conv_all(np.zeros(x_shape), np.zeros(w_shape), None, **attrs)
    return y.shape


_CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def conv_transpose_all(x_ncx, w_iox, dy_ncx, *, strides, dilations, pads_begin, out_size, groups):
    """(y, dx, dW) of a torch ConvTranspose cropped at pads_begin to out_size, float64.

    torch takes only symmetric padding, so the un-padded result ("full") is
    computed, zero-extended past its end where out_size needs it, and cropped.
    """
    n = x_ncx.ndim - 2
    x = torch.tensor(np.asarray(x_ncx, np.float64), requires_grad=True)
    w = torch.tensor(np.asarray(w_iox, np.float64), requires_grad=True)
    full = _CONVT[n](x, w, stride=tuple(strides), dilation=tuple(dilations), groups=groups)
    ext = []
    for ax in reversed(range(n)):
        ext += [0, max(0, int(pads_begin[ax]) + int(out_size[ax]) - full.shape[2 + ax])]
    full = F.pad(full, ext)
    idx = (slice(None), slice(None)) + tuple(
        slice(b, b + o) for b, o in zip(pads_begin, out_size))
    y = full[idx]
    if dy_ncx is None:
        return y.detach().numpy(), None, None
    y.backward(torch.tensor(np.asarray(dy_ncx, np.float64)))
    return y.detach().numpy(), x.grad.numpy(), w.grad.numpy()
