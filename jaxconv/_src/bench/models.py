"""Whole networks in flax linen, written as users write them: ResNet-18, ResNet-50, MobileNetV2
and flax's MNIST example CNN.

The style is flax's own ImageNet example: each model takes its convolution and its norm as
module attributes (``conv: ModuleDef = nn.Conv``), so the jaxconv contender is the same model
with ``conv=functools.partial(nn.Conv, conv_general_dilated=jaxconv.conv_general_dilated)``,
and a ResNet's stem pool ``jaxconv.max_pool`` in place of ``nn.max_pool`` (``pool``: the same
arguments; XLA:CPU's gradient of flax's is slow, docs/training.md); the accelerate contender
is the model as written, its training step under ``jaxconv.accelerate``. The architectures are
torchvision's (``resnet18``, ``resnet50`` v1.5 with the stride on the 3x3, ``mobilenet_v2``
without its dropout) and flax's MNIST example (``mnist_cnn``), with PyTorch's explicit padding
(``(k - 1) // 2`` each side) so that ``torch_models`` holds the same network; every submodule
is named as its torch twin's attribute (``layer1_0.conv1``).

``record_convolutions`` lists the convolutions one forward pass runs (traced, nothing
computed), for the per-layer table of ``model_run``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src import lax_refs

ModuleDef = Any


class Identity(nn.Module):
    """The norm of ``--no-batchnorm``: BatchNorm replaced by nothing (``torch.nn.Identity``)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return x


def _pad(k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    return ((k - 1) // 2, (k - 1) // 2), ((k - 1) // 2, (k - 1) // 2)


class BasicBlock(nn.Module):
    """ResNet-18/34's block: two 3x3 convolutions, a 1x1 projection where the shape changes."""

    planes: int
    stride: int
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = (self.stride, self.stride)
        y = self.conv(self.planes, (3, 3), s, padding=_pad(3), use_bias=False, name="conv1")(x)
        y = nn.relu(self.norm(name="bn1")(y))
        y = self.conv(self.planes, (3, 3), padding=_pad(3), use_bias=False, name="conv2")(y)
        y = self.norm(name="bn2")(y)
        if self.stride != 1 or x.shape[-1] != self.planes:
            x = self.conv(self.planes, (1, 1), s, padding="VALID", use_bias=False,
                          name="downsample_conv")(x)
            x = self.norm(name="downsample_bn")(x)
        return nn.relu(x + y)


class Bottleneck(nn.Module):
    """ResNet-50's block (v1.5: the stride on the 3x3): 1x1, 3x3, 1x1 with 4x expansion."""

    planes: int
    stride: int
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s, out = (self.stride, self.stride), 4 * self.planes
        y = self.conv(self.planes, (1, 1), use_bias=False, name="conv1")(x)
        y = nn.relu(self.norm(name="bn1")(y))
        y = self.conv(self.planes, (3, 3), s, padding=_pad(3), use_bias=False, name="conv2")(y)
        y = nn.relu(self.norm(name="bn2")(y))
        y = self.conv(out, (1, 1), use_bias=False, name="conv3")(y)
        y = self.norm(name="bn3")(y)
        if self.stride != 1 or x.shape[-1] != out:
            x = self.conv(out, (1, 1), s, padding="VALID", use_bias=False,
                          name="downsample_conv")(x)
            x = self.norm(name="downsample_bn")(x)
        return nn.relu(x + y)


def max_pool(x: jax.Array) -> jax.Array:
    """torchvision's ``MaxPool2d(3, 2, 1)``: flax's max pool, as users write it (``model_run``
    times it alone on both sides: XLA:CPU's gradient of it is a large part of a ResNet-18 step)."""
    return nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))


def jaxconv_max_pool(x: jax.Array) -> jax.Array:
    """The same pool by ``jaxconv.max_pool`` (the jaxconv contender's)."""
    from jaxconv._src.pooling import max_pool as pool
    return pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))


class ResNet(nn.Module):
    """torchvision's ResNet: a 7x7 stride-2 stem, a 3x3 stride-2 max pool, four stages."""

    stage_sizes: Sequence[int]
    block: ModuleDef
    num_classes: int = 1000
    conv: ModuleDef = nn.Conv
    #: the computation dtype of the classifier (flax's ``dtype``; the convolutions and norms
    #: take theirs from ``conv`` and ``norm``): None keeps the parameters' float32
    dtype: Any = None
    norm: ModuleDef = nn.BatchNorm
    pool: Callable[[jax.Array], jax.Array] = max_pool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv(64, (7, 7), (2, 2), padding=_pad(7), use_bias=False, name="conv1")(x)
        x = nn.relu(self.norm(name="bn1")(x))
        x = self.pool(x)
        for i, n in enumerate(self.stage_sizes):
            for j in range(n):
                x = self.block(64 * 2 ** i, 2 if i > 0 and j == 0 else 1, self.conv, self.norm,
                               name=f"layer{i + 1}_{j}")(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="fc")(x)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion (unless t = 1), depthwise 3x3, 1x1 projection."""

    out: int
    stride: int
    expand: int
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = x.shape[-1]
        hidden = c * self.expand
        y = x
        if self.expand != 1:
            y = self.conv(hidden, (1, 1), use_bias=False, name="expand_conv")(y)
            y = nn.relu6(self.norm(name="expand_bn")(y))
        y = self.conv(hidden, (3, 3), (self.stride, self.stride), padding=_pad(3),
                      feature_group_count=hidden, use_bias=False, name="dw_conv")(y)
        y = nn.relu6(self.norm(name="dw_bn")(y))
        y = self.conv(self.out, (1, 1), use_bias=False, name="project_conv")(y)
        y = self.norm(name="project_bn")(y)
        return x + y if self.stride == 1 and c == self.out else y


#: torchvision's MobileNetV2 settings: expansion t, channels c, repeats n, first stride s
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0), without the classifier's dropout."""

    num_classes: int = 1000
    conv: ModuleDef = nn.Conv
    #: the computation dtype of the classifier (flax's ``dtype``; the convolutions and norms
    #: take theirs from ``conv`` and ``norm``): None keeps the parameters' float32
    dtype: Any = None
    norm: ModuleDef = nn.BatchNorm

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv(32, (3, 3), (2, 2), padding=_pad(3), use_bias=False, name="stem_conv")(x)
        x = nn.relu6(self.norm(name="stem_bn")(x))
        b = 0
        for t, c, n, s in MOBILENET_V2_SETTINGS:
            for j in range(n):
                x = InvertedResidual(c, s if j == 0 else 1, t, self.conv, self.norm,
                                     name=f"block{b}")(x)
                b += 1
        x = self.conv(1280, (1, 1), use_bias=False, name="last_conv")(x)
        x = nn.relu6(self.norm(name="last_bn")(x))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="fc")(x)


class MnistCNN(nn.Module):
    """flax's MNIST example CNN: conv 32 - relu - avg pool - conv 64 - relu - avg pool - dense
    256 - relu - dense 10 (3x3 ``SAME`` convolutions with biases, 2x2 stride-2 average pools)."""

    num_classes: int = 10
    conv: ModuleDef = nn.Conv
    dtype: Any = None
    norm: ModuleDef = nn.BatchNorm  # unused: the example has none

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(self.conv(32, (3, 3), name="conv1")(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(self.conv(64, (3, 3), name="conv2")(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(256, dtype=self.dtype, name="fc1")(x))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="fc2")(x)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model of the benchmark: its flax constructor and default image size."""

    name: str
    make: Callable[..., nn.Module]
    image: int
    #: the stem's 3x3 stride-2 max pool (torchvision's ResNets): its input is the 64-channel
    #: output of the stride-2 stem convolution
    max_pool: bool = False
    #: the model's input channels, classes and batch (the benchmark's default for it)
    channels: int = 3
    classes: int = 1000
    batch: int = 8


MODELS = {
    "resnet18": ModelSpec("ResNet-18", functools.partial(ResNet, (2, 2, 2, 2), BasicBlock), 224,
                          max_pool=True),
    "resnet50": ModelSpec("ResNet-50", functools.partial(ResNet, (3, 4, 6, 3), Bottleneck), 160,
                          max_pool=True),
    "mobilenet_v2": ModelSpec("MobileNetV2", MobileNetV2, 224),
    "mnist_cnn": ModelSpec("MNIST CNN", MnistCNN, 28, channels=1, classes=10, batch=128),
}


def norm_def(batchnorm: bool, train: bool = True) -> ModuleDef:
    """BatchNorm in training mode with torch's momentum (0.1: flax's 0.9), epsilon and
    two-pass variance (``train=False``: in inference mode, the running statistics), or none. flax's default one-pass variance (E[x^2] - E[x]^2) cancels in
    float32: one MobileNetV2 step (64x64, batch 4) then differed from torch's by 4.8e-3 in a
    depthwise kernel, against 2.2e-5 with the two-pass variance."""
    if not batchnorm:
        return Identity
    return functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             epsilon=1e-5, use_fast_variance=False)


def build(name: str, conv: Callable[..., jax.Array], batchnorm: bool = True,
          num_classes: int | None = None,
          pool: Callable[[jax.Array], jax.Array] | None = None, dtype: Any = None,
          train: bool = True) -> nn.Module:
    """Model ``name`` whose convolutions call ``conv`` (``lax.conv_general_dilated``'s
    signature: lax's own, or ``jaxconv.conv_general_dilated``) and whose stem max pool (the
    ResNets') is ``pool`` (None: flax's ``nn.max_pool``). ``dtype``: flax's mixed precision,
    every layer computing in it with float32 parameters (``jnp.bfloat16``: what
    ``torch.autocast`` does to the torch twin's convolutions and linear layers); None: float32.
    ``train=False``: BatchNorm in inference mode (the model's ``apply`` without ``mutable``)."""
    if name not in MODELS:
        raise ValueError(f"models: name must be one of {sorted(MODELS)}, got {name!r}")
    extra = {"pool": pool} if pool is not None and MODELS[name].max_pool else {}
    classes = MODELS[name].classes if num_classes is None else num_classes
    norm = norm_def(batchnorm, train)
    if dtype is not None and batchnorm:
        norm = functools.partial(norm, dtype=dtype)
    return MODELS[name].make(num_classes=classes,
                             conv=functools.partial(nn.Conv, conv_general_dilated=conv,
                                                    dtype=dtype),
                             norm=norm, dtype=dtype, **extra)


def init(name: str, x: jax.Array, batchnorm: bool = True, seed: int = 0) -> Any:
    """The variables of model ``name`` for inputs like ``x``, drawn by NumPy on the shapes
    ``model.init`` would give: kernels normal with variance 1 / fan-in (flax's default is the
    truncated LeCun normal of that variance), biases 0, BatchNorm scale 1, bias 0, mean 0 and
    variance 1. (``model.init`` itself compiled for 13 s for
    MobileNetV2 and took 29 s op by op: its random initialisers are one program each.)"""
    shapes = jax.eval_shape(build(name, lax_refs.conv_general_dilated, batchnorm).init,
                            jax.random.key(seed), x)
    rng = np.random.default_rng(seed)

    def draw(path: tuple[Any, ...], leaf: jax.ShapeDtypeStruct) -> np.ndarray:
        key = path[-1].key
        if key == "kernel":  # (*window, in, out): fan-in = window x in
            fan_in = int(np.prod(leaf.shape[:-1]))
            return (rng.standard_normal(leaf.shape) / np.sqrt(fan_in)).astype(leaf.dtype)
        fill = 1.0 if key in ("scale", "var") else 0.0
        return np.full(leaf.shape, fill, leaf.dtype)
    return jax.tree_util.tree_map_with_path(draw, shapes)


@dataclasses.dataclass(frozen=True)
class Convolution:
    """One distinct convolution of a model (NHWC, HWIO), and how often a forward pass runs it."""

    batch: int
    input_size: tuple[int, ...]
    in_channels: int
    out_channels: int
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    groups: int
    first: bool  # reads the model's input: a training step computes no data gradient for it


def max_pool_input(name: str, batch: int, image: int) -> tuple[int, ...] | None:
    """The NHWC shape the model's max pool reads (its stem convolution's output), or None."""
    if not MODELS[name].max_pool:
        return None
    stem = (image + 2 * 3 - 7) // 2 + 1  # 7x7, stride 2, pads 3
    return (batch, stem, stem, 64)


def record_convolutions(name: str, batch: int, image: int,
                        batchnorm: bool = True) -> list[tuple[Convolution, int]]:
    """The distinct convolutions of one forward pass of model ``name`` (traced, nothing
    computed), in order of first use, each with its count."""
    seen: collections.Counter[Convolution] = collections.Counter()
    x_shape = (batch, image, image, MODELS[name].channels)

    def recording(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int],
                  padding: Any, *args: Any, **kwargs: Any) -> jax.Array:
        g = kwargs.get("feature_group_count", 1)
        pads = padding if not isinstance(padding, str) else lax.padtype_to_pads(
            lhs.shape[1:-1], rhs.shape[:-2], window_strides, padding)
        seen[Convolution(lhs.shape[0], tuple(lhs.shape[1:-1]), lhs.shape[-1], rhs.shape[-1],
                         tuple(rhs.shape[:-2]), tuple(window_strides),
                         tuple((int(a), int(b)) for a, b in pads), g,
                         lhs.shape == x_shape)] += 1
        return lax_refs.conv_general_dilated(lhs, rhs, window_strides, padding, *args, **kwargs)

    model = build(name, recording, batchnorm)
    x = jax.ShapeDtypeStruct(x_shape, jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)
    jax.eval_shape(lambda v, x: model.apply(v, x, mutable=["batch_stats"]), variables, x)
    # init and apply both ran the model: each count is twice a forward pass's
    return [(c, n // 2) for c, n in seen.items()]
