"""The PyTorch contender: the same gradient as jaxconv's op, alone (``run.py``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxconv._src.bench.timing import _time, _time_n
from jaxconv._src.lowering.measured import usable_cpus


class _CudaResult:
    """What a torch GPU callable returns: the gradient (NCX/OIX) and a way to wait for it."""

    def __init__(self, torch, value):
        self._torch, self.value = torch, value

    def block_until_ready(self):
        self._torch.cuda.synchronize()
        return self


def _torch_impl(prob, kind, x, dy, w, gpu=False):
    """torch doing the same work as jaxconv: the one computation, and nothing else.

    A gradient is ``torch.ops.aten.convolution_backward`` with the output mask of
    that gradient (weight: ``[False, True, False]``, data: ``[True, False, False]``;
    what ``torch.nn.grad.conv2d_weight`` calls), under ``no_grad``: no forward
    convolution, no autograd graph. The forward (``kind="fwd"``) is
    ``torch.ops.aten.convolution`` under ``no_grad``. Equal pads go to the library as they are;
    unequal ones are applied to ``x`` once, outside the timed call (the row then
    says ``torch_explicit_pad``; the data gradient is then of the padded input, a
    little more work). CPU: oneDNN with as many threads as XLA (every core). GPU:
    cuDNN in exact float32 (TF32 off). The faster of NCHW and channels-last
    (measured once each, best of 3 after a warm-up) is the one timed; the callable
    carries ``.layout`` and ``.explicit_pad``.
    """
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if gpu:
        if not torch.cuda.is_available():
            return None
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dev = torch.device("cuda")
    else:
        # torch's CPU convolution may unfold the input (im2col); a kernel as large as the
        # input (3d_conv_large_shape:2) asks it for 14.5 GB and the OOM killer ends the run.
        unfold = (prob.batch * prob.in_channels * math.prod(prob.kernel)
                  * math.prod(prob.output_size))
        if 4 * unfold > 1e9:
            return None
        torch.set_num_threads(usable_cpus())
        dev = torch.device("cpu")
    perm_in = (0, prob.rank + 1, *range(1, prob.rank + 1))
    # the operands' dtype (numpy has no bfloat16 of torch's: through float32, exactly)
    dtype = getattr(torch, np.dtype(x.dtype).name)

    def tensor(a: np.ndarray) -> Any:
        if a.dtype.name == "bfloat16":
            a = a.astype(np.float32)
        return torch.from_numpy(np.array(a, order="C")).to(dev, dtype)
    xt = tensor(x.transpose(perm_in))
    dyt = tensor(dy.transpose(perm_in))
    wt = tensor(w.transpose(prob.rank + 1, prob.rank, *range(prob.rank)))
    symmetric = tuple(prob.pads_begin) == tuple(prob.pads_end)
    padding = list(prob.pads_begin) if symmetric else [0] * prob.rank
    if not symmetric:
        pad = []
        for b, e in zip(reversed(prob.pads_begin), reversed(prob.pads_end)):
            pad += [b, e]
        xt = F.pad(xt, pad)
    mask = [False, True, False] if kind == "wgrad" else [True, False, False]
    formats = {"NCX": torch.contiguous_format}
    if prob.rank in (2, 3):
        formats["channels_last"] = torch.channels_last if prob.rank == 2 else \
            torch.channels_last_3d

    def make(fmt):
        xx, dd, ww = (t.contiguous(memory_format=fmt) for t in (xt, dyt, wt))

        def run():
            with torch.no_grad():
                if kind == "fwd":
                    y = torch.ops.aten.convolution(xx, ww, None, list(prob.strides), padding,
                                                   list(prob.dilations), False, [0] * prob.rank,
                                                   prob.groups)
                    return _CudaResult(torch, y) if gpu else y
                dx, dw, _ = torch.ops.aten.convolution_backward(
                    dd, xx, ww, None, list(prob.strides), padding, list(prob.dilations), False,
                    [0] * prob.rank, prob.groups, mask)
            out = dw if kind == "wgrad" else dx
            return _CudaResult(torch, out) if gpu else out
        return run

    best: Any = None
    best_t = math.inf
    for name, fmt in formats.items():
        fn = make(fmt)
        _time(fn)
        t = min(_time_n(fn, 3) for _ in range(3))
        if t < best_t:
            best, best_t = fn, t
            best.layout = name
    best.explicit_pad = not symmetric
    return best
