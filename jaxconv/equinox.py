"""Equinox layers with jaxconv's gradients (``pip install jaxconv[equinox]``)."""

from jaxconv._src.equinox_layers import (
    Conv,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
)

__all__ = ["Conv", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose", "ConvTranspose1d",
           "ConvTranspose2d", "ConvTranspose3d"]
