"""The policy: each kernel call planned once (``jaxconv/_src/lowering/policy.py``), the plan
executed without going back through the dispatch, oneDNN's applicability asked of one
function, and the partitioner workaround gated by jaxlib's version."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxconv._src import geometry
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import execute, onednn, policy, registry
from jaxconv._src.onednn import library
from tests import helpers as h

ONEDNN = library.status().available
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="the oneDNN handler is not built/loaded")


def _problem(groups=1, channels=32, size=28, batch=8, strides=1):
    return geometry.convolution_problem(
        "t", geometry.Names(), x_shape=(batch, size, size, channels), y_shape=None,
        w_shape=(3, 3, channels // groups, channels), strides=strides, pads_begin=1,
        pads_end=1, dilations=1, auto_pad="explicit", groups=groups, data_format="NXC",
        filter_format="XIO")


@needs_onednn
def test_plan_resolves_auto_per_backend_and_program():
    p = _problem(channels=16)  # below Winograd's channels (tests/test_winograd.py plans those)
    f32 = np.dtype("float32")
    assert policy.plan(Kernel.WEIGHT, p, method="auto", backend="cpu", dtype=f32).method == "onednn"
    # an export holds no custom call; a partitioned program runs oneDNN per device's blocks
    assert policy.plan(Kernel.WEIGHT, p, method="auto", backend="cpu", dtype=f32,
                       portable=True).method == policy.choose(Kernel.WEIGHT, p, "cpu",
                                                              onednn_ok=False)
    sharded = policy.plan(Kernel.WEIGHT, p, method="auto", backend="cpu", dtype=f32,
                          partitioned=True)
    assert (sharded.method, sharded.per_shard) == ("onednn", True)
    assert policy.plan(Kernel.WEIGHT, p, method="auto", backend="gpu", dtype=f32).method == "vjp"


@needs_onednn
def test_onednn_applies_is_the_one_test_the_plan_and_tables_ask():
    p = _problem()
    assert onednn.applies(Kernel.FORWARD, p, np.float32) is None
    why = onednn.applies(Kernel.FORWARD, p, np.float64)
    assert why is not None and "float64" in why
    assert "preferred_element_type" in onednn.applies(Kernel.FORWARD, p, np.float32, np.float64)
    # forced onednn on operands it does not take: the default leaf, planned, not declined
    forced = policy.plan(Kernel.FORWARD, p, method="onednn", backend="cpu", dtype=np.float64)
    assert forced.method == "conv"
    # the auto table does not offer oneDNN for them: the XLA:CPU rules decide
    auto = policy.plan(Kernel.FORWARD, p, method="auto", backend="cpu", dtype=np.float64)
    assert auto.method == policy.choose(Kernel.FORWARD, p, "cpu", onednn_ok=False)


def test_forced_methods_are_checked_and_unknown_names_refused():
    p = _problem()
    with pytest.raises(ValueError, match=r"lowering: method must be 'auto' or one of .*got 'nope'"):
        policy.plan(Kernel.DATA, p, method="nope", backend="cpu", dtype=np.float32)
    with pytest.raises(ValueError, match="needs a backend"):
        policy.plan(Kernel.DATA, p, method="auto", backend=None, dtype=np.float32)
    # a custom call lowered for another platform: that platform's own choice
    assert policy.plan(Kernel.DATA, p, method="onednn", backend="gpu",
                       dtype=np.float32).method == "vjp"


def test_a_combinator_plans_each_sub_problem_once_and_run_is_entered_once(monkeypatch):
    """per_group's sub-problems get leaf plans from the same backend's table; the dispatch
    (registry.run) is entered once for the whole call, never again for its pieces."""
    entered, plans = [], []
    real_run, real_plan = registry.run, policy.plan

    def counting_run(*args, **kwargs):
        entered.append(args[0])
        return real_run(*args, **kwargs)

    def counting_plan(*args, **kwargs):
        made = real_plan(*args, **kwargs)
        plans.append(made.method)
        return made

    monkeypatch.setattr(registry, "run", counting_run)
    monkeypatch.setattr(policy, "plan", counting_plan)
    x, dy = jnp.ones((2, 9, 9, 8)), jnp.ones((2, 7, 7, 8))
    p = geometry.convolution_problem(
        "t", geometry.Names(), x_shape=x.shape, y_shape=dy.shape, w_shape=(3, 3, 4, 8),
        strides=None, pads_begin=None, pads_end=None, dilations=None, auto_pad="none",
        groups=2, data_format="NXC", filter_format="XIO")
    jax.jit(lambda x, dy: registry.run(Kernel.WEIGHT, x, dy, p, method="per_group",
                                       backend="cpu")).lower(x, dy)
    assert entered == [Kernel.WEIGHT]
    assert plans[0] == "per_group" and len(plans) == 3  # the call, then one per group
    assert not any(registry.METHODS[m].combinator for m in plans[1:])


def test_execute_runs_a_plan_without_deciding():
    """A plan built by hand runs as it says, whatever the table would pick."""
    p = _problem(channels=8, size=9, batch=2)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(p.x_shape), jnp.float32)
    w = jnp.asarray(rng.standard_normal(p.filter_shape), jnp.float32)
    plan = execute.Plan(Kernel.FORWARD, "dot", "cpu", precision=jax.lax.Precision.HIGHEST)
    got = execute.execute(plan, x, w, p)
    want = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        precision=jax.lax.Precision.HIGHEST)
    h.assert_close(got, want, jnp.float32)


@pytest.mark.parametrize("version,applies", [("0.10.1", False), ("0.10.2", True),
                                             ("0.11.2", True)])
def test_partitioner_workaround_is_gated_by_jaxlib(version, applies, monkeypatch):
    assert policy.partitioner_workaround(version) is applies
    monkeypatch.setattr(policy, "PARTITIONER_FIXED_IN", ("0.11.2",))
    assert policy.partitioner_workaround("0.11.2") is False
