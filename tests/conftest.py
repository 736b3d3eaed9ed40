"""Strict JAX for every test: rank and dtype promotion raise, warnings are errors (pyproject)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CPU table's method everywhere (jaxconv/_src/lowering/measured.py would time each of the
# suite's thousands of tiny problems against XLA's program); tests/lowering/test_measured.py
# switches it on where it tests it.
os.environ.setdefault("JAXCONV_MEASURE", "0")

# The suite compiles thousands of small programs, and on CPU LLVM's optimisation of each is
# a quarter of its time (tests/core/test_batching.py: 104 s at XLA's default level, 77 s at 0; 2
# cores). No test asserts a time, and oneDNN's calls are compiled code of their own. The level
# can change rounding, though (how LLVM orders a reduction's float32 sums): every bound per
# dtype holds at both levels, but one whole model step with BatchNorm (tests/tools/test_bench_models.py)
# is 18x further from its float64 oracle at level 0, so the tests that bound a whole step's
# rounding run in a child at XLA's own level (helpers.rerun_at_xla_default_level). A level
# the caller sets in XLA_FLAGS wins (JAXCONV_TEST_XLA_OPT=default keeps XLA's own).
_flags = os.environ.get("XLA_FLAGS", "")
if (os.environ["JAX_PLATFORMS"] == "cpu" and "xla_backend_optimization_level" not in _flags
        and os.environ.get("JAXCONV_TEST_XLA_OPT") != "default"):
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()

# OpenVINO (the oracle of tests/support/openvino_oracle.py) is imported before JAX starts, its
# telemetry's fork done (machine.import_openvino): forked later, JAX's at-fork warning is an
# error under the suite's strict warnings, raised at whichever test runs next on that worker.
from jaxconv._src.bench.machine import import_openvino  # noqa: E402

import_openvino()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


import pytest  # noqa: E402
from jax import lax  # noqa: E402

# @pytest.mark.isolated tests run in a child process off CPU (tests/support/isolation.py).
pytest_plugins = ["tests.support.isolation"]


@pytest.fixture
def no_compute(monkeypatch):
    """Booby-traps the convolution and pad primitives: validation must finish first."""

    def boom(*args, **kwargs):
        raise AssertionError("computation started before validation finished")

    monkeypatch.setattr(lax, "conv_general_dilated", boom)
    monkeypatch.setattr(lax, "pad", boom)


# Hypothesis profiles (tests/ops/test_properties.py): "ci" by default, "long" for a deep run:
#   HYPOTHESIS_PROFILE=long python -m pytest tests/ops/test_properties.py
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def xla_cpu_rules(monkeypatch):
    """The CPU table without the onednn extra: the XLA:CPU rules the tests below pin down."""
    from jaxconv._src.lowering import tables
    monkeypatch.setattr(tables, "_onednn_pays", lambda p, kernel=None, xla="": False)


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Timing of the CPU table's choices on (the suite runs with JAXCONV_MEASURE=0:
    ``lowering/measured.py``), with a fresh verdict cache in the process and on disk; yields
    the module; off the CPU, where nothing is timed, the test skips."""
    if jax.default_backend() != "cpu":
        pytest.skip("lowering/measured.py times choices on XLA:CPU only")
    from jaxconv._src.lowering import measured
    monkeypatch.setattr(measured, "enabled", lambda: True)
    monkeypatch.setattr(measured, "_VERDICTS", {})
    monkeypatch.setattr(measured, "_DECISIONS", {})
    monkeypatch.setattr(measured, "_cache_file", lambda: tmp_path / "measured.json")
    # each kernel's choice alone: no whole program timed (tests/lowering/test_measured.py
    # times them where it tests them)
    from jaxconv._src.lowering import chooser
    monkeypatch.setattr(chooser, "PROGRAM_MEASURE_MAX_MACS", -1)
    measured._disk.cache_clear()
    yield measured
    measured._disk.cache_clear()


@pytest.fixture
def layout_trial():
    """The oneDNN handler's layout trial on (the suite runs with JAXCONV_MEASURE=0, which
    keeps the caller's layouts untimed: native/onednn/trial.h), its cached primitives dropped first (each
    problem's next first call chooses again), off again after the test."""
    from jaxconv._src.native import library
    library.forget()
    library.set_trial(True)
    yield
    library.set_trial(False)
