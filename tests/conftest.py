"""Strict JAX for every test: rank promotion raises, warnings are errors (pyproject)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


import pytest  # noqa: E402
from jax import lax  # noqa: E402


@pytest.fixture
def no_compute(monkeypatch):
    """Booby-traps the convolution and pad primitives: validation must finish first."""

    def boom(*args, **kwargs):
        raise AssertionError("computation started before validation finished")

    monkeypatch.setattr(lax, "conv_general_dilated", boom)
    monkeypatch.setattr(lax, "pad", boom)
