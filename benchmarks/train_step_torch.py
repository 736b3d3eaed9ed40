"""The PyTorch contender of ``benchmarks.train_step``: each block as ``torch.nn`` modules.

The same block (layers, activations, residual), the same parameters (converted from the JAX
contenders' XIO weights), the same batch, target and loss (mean squared error), and the same
step: forward, backward, and a plain SGD update (``torch.optim.SGD``, ``foreach``), with
``zero_grad(set_to_none=True)`` as a training loop does. PyTorch runs oneDNN on CPU with as
many threads as XLA, in the faster of its contiguous and channels-last memory formats
(measured once each, best of three after a warm-up; the row says which).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxconv._src.bench.timing import _time, _time_n
from jaxconv._src.lowering.measured import usable_cpus


def _modules(torch: Any, name: str, p: dict[str, np.ndarray]) -> tuple[Any, Callable]:
    """The block's layers (weights from ``p``, XIO / XOI) and its forward function."""
    nn, F = torch.nn, torch.nn.functional

    def conv(w: np.ndarray, groups: int = 1) -> Any:
        k, rank = w.shape[0], w.ndim - 2
        cls = nn.Conv2d if rank == 2 else nn.Conv3d
        layer = cls(w.shape[-2] * groups, w.shape[-1], k, padding=(k - 1) // 2, groups=groups,
                    bias=False)
        with torch.no_grad():  # XIO -> OIX
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(
                w.transpose(rank + 1, rank, *range(rank)))))
        return layer

    def conv_t(w_xoi: np.ndarray) -> Any:
        # (K, K, O, I) of the stride-2 convolution the transposed one is the gradient of:
        # torch's ConvTranspose2d(I -> O) holds it as (I, O, K, K), unflipped.
        layer = nn.ConvTranspose2d(w_xoi.shape[3], w_xoi.shape[2], w_xoi.shape[0], stride=2,
                                   bias=False)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(w_xoi.transpose(3, 2, 0, 1))))
        return layer

    if name == "mobilenet_v2":
        m = nn.ModuleDict({"expand": conv(p["expand"]),
                           "dw": conv(p["dw"], groups=p["dw"].shape[-1]),
                           "project": conv(p["project"])})

        def fwd(x: Any) -> Any:
            h = F.relu6(m["expand"](x))
            return x + m["project"](F.relu6(m["dw"](h)))
    elif name in ("resnext", "resnet50"):
        g = 32 if name == "resnext" else 1
        m = nn.ModuleDict({"a": conv(p["a"]), "b": conv(p["b"], groups=g), "c": conv(p["c"])})

        def fwd(x: Any) -> Any:
            h = F.relu(m["b"](F.relu(m["a"](x))))
            return F.relu(x + m["c"](h))
    elif name == "unet3d":
        m = nn.ModuleDict({"a": conv(p["a"]), "b": conv(p["b"])})

        def fwd(x: Any) -> Any:
            return F.relu(m["b"](F.relu(m["a"](x))))
    elif name == "decoder":
        m = nn.ModuleDict({"up": conv_t(p["up"]), "conv": conv(p["conv"])})

        def fwd(x: Any) -> Any:
            return F.relu(m["conv"](F.relu(m["up"](x))))
    else:
        raise ValueError(f"train_step_torch: no torch.nn version of block {name!r}")
    return m, fwd


def torch_step(name: str, params: dict[str, np.ndarray], x: np.ndarray, target: np.ndarray,
               lr: float) -> tuple[Callable, dict[str, Any]] | None:
    """A zero-argument training step of block ``name`` in torch (None without torch), and
    what one step from ``params`` gives: its loss, the updated parameters (back in the JAX
    layouts) and the memory format chosen."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(usable_cpus())
    rank = x.ndim - 2
    to_ncx = (0, rank + 1, *range(1, rank + 1))
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(to_ncx)))
    tt = torch.from_numpy(np.ascontiguousarray(target.transpose(to_ncx)))
    formats = {"contiguous": torch.contiguous_format,
               "channels_last": torch.channels_last if rank == 2 else torch.channels_last_3d}

    def make(fmt: Any) -> tuple[Callable, Any]:
        m, fwd = _modules(torch, name, params)
        m = m.to(memory_format=fmt)
        xx, tx = xt.contiguous(memory_format=fmt), tt.contiguous(memory_format=fmt)
        opt = torch.optim.SGD(m.parameters(), lr=lr, foreach=True)

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(fwd(xx), tx)
            loss.backward()
            opt.step()
            return loss.detach()
        return step, m

    first, m = make(torch.contiguous_format)  # one step from the shared parameters
    loss = float(first())
    updated = {k: _from_torch(name, k, v.detach().numpy()) for k, v in _named(m).items()}
    best: Any = None
    best_t, best_name = math.inf, ""
    for fmt_name, fmt in formats.items():
        fn, _ = make(fmt)
        _time(fn)
        t = min(_time_n(fn, 3) for _ in range(3))
        if t < best_t:
            best, best_t, best_name = fn, t, fmt_name
    return best, {"loss": loss, "params": updated, "layout": best_name}


def _named(m: Any) -> dict[str, Any]:
    return {k.removesuffix(".weight"): v for k, v in m.named_parameters()}


def _from_torch(block: str, key: str, w: np.ndarray) -> np.ndarray:
    """A torch weight back in the JAX contenders' layout (OIX -> XIO; ConvTranspose IOX -> XOI)."""
    rank = w.ndim - 2
    if block == "decoder" and key == "up":
        return w.transpose(2, 3, 1, 0)
    return w.transpose(*range(2, rank + 2), 1, 0)
