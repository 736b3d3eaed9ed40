"""Strict JAX for every test: rank promotion raises, warnings are errors (pyproject)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
