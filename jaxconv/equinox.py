"""Equinox layers with jaxconv's gradients (``pip install jaxconv[equinox]``)."""

from jaxconv._src.equinox_layers import Conv, ConvTranspose

__all__ = ["Conv", "ConvTranspose"]
