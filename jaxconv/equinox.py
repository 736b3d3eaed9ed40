"""Equinox layers with jaxconv's gradients (``pip install jaxconv[equinox]``)."""

from jaxconv._src.equinox_layers import Conv, Conv1d, Conv2d, Conv3d, ConvTranspose

__all__ = ["Conv", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose"]
