"""The torch.nn twins of ``models``: the same networks, module for module, the same names.

Each submodule has its flax twin's name (``layer1_0.conv1``), so the flax variables load by
path: a convolution's HWIO kernel as torch's OIHW weight, a Dense kernel transposed, a
BatchNorm's scale and bias as its weight and bias. BatchNorm runs in training mode with the
same momentum and epsilon (``momentum=0.1`` is flax's 0.9); its running variance is
unbiased in torch and biased in flax, which changes the running statistics only, never a
training step's loss or parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxconv._src.bench.models import MOBILENET_V2_SETTINGS


def _modules(torch: Any, name: str, batchnorm: bool, num_classes: int) -> Any:
    nn = torch.nn

    def conv(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> Any:
        return nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)

    def norm(c: int) -> Any:
        return nn.BatchNorm2d(c, eps=1e-5, momentum=0.1) if batchnorm else nn.Identity()

    class BasicBlock(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = conv(cin, planes, 3, stride), norm(planes)
            self.conv2, self.bn2 = conv(planes, planes, 3), norm(planes)
            self.project = stride != 1 or cin != planes
            if self.project:
                self.downsample_conv = conv(cin, planes, 1, stride)
                self.downsample_bn = norm(planes)

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            if self.project:
                x = self.downsample_bn(self.downsample_conv(x))
            return torch.relu(x + y)

    class Bottleneck(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            out = 4 * planes
            self.conv1, self.bn1 = conv(cin, planes, 1), norm(planes)
            self.conv2, self.bn2 = conv(planes, planes, 3, stride), norm(planes)
            self.conv3, self.bn3 = conv(planes, out, 1), norm(out)
            self.project = stride != 1 or cin != out
            if self.project:
                self.downsample_conv = conv(cin, out, 1, stride)
                self.downsample_bn = norm(out)

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            if self.project:
                x = self.downsample_bn(self.downsample_conv(x))
            return torch.relu(x + y)

    class ResNet(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, stages: tuple[int, ...], bottleneck: bool) -> None:
            super().__init__()
            self.conv1, self.bn1 = conv(3, 64, 7, 2), norm(64)
            self.pool = nn.MaxPool2d(3, 2, 1)
            self.names, cin = [], 64
            for i, n in enumerate(stages):
                for j in range(n):
                    planes, stride = 64 * 2 ** i, 2 if i > 0 and j == 0 else 1
                    block = (Bottleneck if bottleneck else BasicBlock)(cin, planes, stride)
                    setattr(self, f"layer{i + 1}_{j}", block)
                    self.names.append(f"layer{i + 1}_{j}")
                    cin = planes * (4 if bottleneck else 1)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.pool(torch.relu(self.bn1(self.conv1(x))))
            for n in self.names:
                x = getattr(self, n)(x)
            return self.fc(x.mean((2, 3)))

    class InvertedResidual(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, cin: int, out: int, stride: int, t: int) -> None:
            super().__init__()
            hidden = cin * t
            self.expand = t != 1
            if self.expand:
                self.expand_conv, self.expand_bn = conv(cin, hidden, 1), norm(hidden)
            self.dw_conv = conv(hidden, hidden, 3, stride, groups=hidden)
            self.dw_bn = norm(hidden)
            self.project_conv, self.project_bn = conv(hidden, out, 1), norm(out)
            self.residual = stride == 1 and cin == out

        def forward(self, x: Any) -> Any:
            y = x
            if self.expand:
                y = torch.nn.functional.relu6(self.expand_bn(self.expand_conv(y)))
            y = torch.nn.functional.relu6(self.dw_bn(self.dw_conv(y)))
            y = self.project_bn(self.project_conv(y))
            return x + y if self.residual else y

    class MobileNetV2(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.stem_conv, self.stem_bn = conv(3, 32, 3, 2), norm(32)
            self.names, cin, b = [], 32, 0
            for t, c, n, s in MOBILENET_V2_SETTINGS:
                for j in range(n):
                    setattr(self, f"block{b}", InvertedResidual(cin, c, s if j == 0 else 1, t))
                    self.names.append(f"block{b}")
                    cin, b = c, b + 1
            self.last_conv, self.last_bn = conv(cin, 1280, 1), norm(1280)
            self.fc = nn.Linear(1280, num_classes)

        def forward(self, x: Any) -> Any:
            x = torch.nn.functional.relu6(self.stem_bn(self.stem_conv(x)))
            for n in self.names:
                x = getattr(self, n)(x)
            x = torch.nn.functional.relu6(self.last_bn(self.last_conv(x)))
            return self.fc(x.mean((2, 3)))

    class MnistCNN(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1, 1)
            self.fc1, self.fc2 = nn.Linear(7 * 7 * 64, 256), nn.Linear(256, num_classes)

        def forward(self, x: Any) -> Any:
            f = torch.nn.functional
            x = f.avg_pool2d(torch.relu(self.conv1(x)), 2)
            x = f.avg_pool2d(torch.relu(self.conv2(x)), 2)
            x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # flax flattens (h, w, c)
            return self.fc2(torch.relu(self.fc1(x)))

    if name == "mnist_cnn":
        return MnistCNN()
    if name == "resnet18":
        return ResNet((2, 2, 2, 2), bottleneck=False)
    if name == "resnet50":
        return ResNet((3, 4, 6, 3), bottleneck=True)
    if name == "mobilenet_v2":
        return MobileNetV2()
    raise ValueError(f"torch_models: no torch.nn twin of model {name!r}")


def _flat(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        out.update(_flat(v, path) if hasattr(v, "items") else {path: np.asarray(v)})
    return out


def to_torch(path: str, value: np.ndarray) -> tuple[str, np.ndarray]:
    """A flax parameter's torch name and value (HWIO -> OIHW; Dense (in, out) -> (out, in))."""
    module, leaf = path.rsplit(".", 1)
    if leaf == "kernel":
        value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T
        return f"{module}.weight", np.ascontiguousarray(value)
    return f"{module}.{ {'scale': 'weight', 'bias': 'bias'}[leaf] }", value


def from_torch(path: str, value: np.ndarray) -> np.ndarray:
    """The inverse of ``to_torch``'s value map, for flax parameter ``path``."""
    if path.endswith(".kernel"):
        return value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
    return value


def build(torch: Any, name: str, params: Any, batchnorm: bool = True,
          num_classes: int | None = None) -> Any:
    """The torch twin of model ``name`` holding flax ``params`` (float32, training mode)."""
    from jaxconv._src.bench.models import MODELS
    classes = MODELS[name].classes if num_classes is None else num_classes
    m = _modules(torch, name, batchnorm, classes)
    state = m.state_dict()
    flat = _flat(params)
    loaded = dict(to_torch(p, v) for p, v in flat.items())
    want = {k for k in state if not k.endswith(("running_mean", "running_var",
                                                  "num_batches_tracked"))}
    if set(loaded) != want:
        raise ValueError(f"torch_models: parameter names differ: flax-only "
                         f"{sorted(set(loaded) - want)[:5]}, torch-only {sorted(want - set(loaded))[:5]}")
    with torch.no_grad():
        for k, v in loaded.items():
            if tuple(state[k].shape) != v.shape:
                raise ValueError(f"torch_models: {k}: shape {tuple(state[k].shape)} vs {v.shape}")
            state[k].copy_(torch.from_numpy(np.array(v)))
    return m.train()


def params_back(torch_model: Any, params: Any) -> dict[str, np.ndarray]:
    """The torch model's parameters under the flax paths of ``params`` (flax layouts)."""
    state = dict(torch_model.named_parameters())
    return {p: from_torch(p, state[to_torch(p, v)[0]].detach().numpy().copy())
            for p, v in _flat(params).items()}


def flat_params(params: Any) -> dict[str, np.ndarray]:
    """``params`` flattened to ``{"layer1_0.conv1.kernel": array}``."""
    return _flat(params)
