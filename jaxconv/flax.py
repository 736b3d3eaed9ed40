"""flax.nnx layers with jaxconv's gradients (``pip install jaxconv[flax]``)."""

from jaxconv._src.flax_layers import Conv, ConvTranspose

__all__ = ["Conv", "ConvTranspose"]
