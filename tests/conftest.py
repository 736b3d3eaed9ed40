"""Strict JAX for every test: rank and dtype promotion raise, warnings are errors (pyproject)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


import pytest  # noqa: E402
from jax import lax  # noqa: E402

# @pytest.mark.isolated tests run in a child process off CPU (tests/isolation.py).
pytest_plugins = ["tests.isolation"]


@pytest.fixture
def no_compute(monkeypatch):
    """Booby-traps the convolution and pad primitives: validation must finish first."""

    def boom(*args, **kwargs):
        raise AssertionError("computation started before validation finished")

    monkeypatch.setattr(lax, "conv_general_dilated", boom)
    monkeypatch.setattr(lax, "pad", boom)


# Hypothesis profiles (tests/test_properties.py): "ci" by default, "long" for a deep run:
#   HYPOTHESIS_PROFILE=long python -m pytest tests/test_properties.py
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
