"""The chooser (``jaxconv/_src/lowering/chooser.py``): each kernel call planned once, fully
resolved, the plan executed without going back through the dispatch, oneDNN's applicability
asked of one function, the partitioner workaround gated by jaxlib's version; and nothing else
decides (no other module reads the tables, times a choice or sets the allocator; no import
cycle)."""

from __future__ import annotations

import ast
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src import geometry
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import chooser, execute, onednn, registry
from jaxconv._src.native import library
from tests.support import helpers as h

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
    p = _problem(channels=16)  # below Winograd's channels (tests/lowering/test_winograd.py plans those)
    f32 = np.dtype("float32")
    assert chooser.plan(Kernel.WEIGHT, p, method="auto", backend="cpu", dtype=f32).method == "onednn"
    # an export holds no custom call; a partitioned program runs oneDNN per device's blocks
    assert chooser.plan(Kernel.WEIGHT, p, method="auto", backend="cpu", dtype=f32,
                       portable=True).method == chooser.choose(Kernel.WEIGHT, p, "cpu",
                                                              onednn_ok=False)
    sharded = chooser.plan(Kernel.WEIGHT, p, method="auto", backend="cpu", dtype=f32,
                          partitioned=True)
    assert (sharded.method, sharded.per_shard) == ("onednn", True)
    assert chooser.plan(Kernel.WEIGHT, p, method="auto", backend="gpu", dtype=f32).method == "vjp"


@needs_onednn
def test_onednn_applies_is_the_one_test_the_plan_and_tables_ask():
    p = _problem()
    assert onednn.applies(Kernel.FORWARD, p, np.float32) is None
    why = onednn.applies(Kernel.FORWARD, p, np.float64)
    assert why is not None and "float64" in why
    assert "preferred_element_type" in onednn.applies(Kernel.FORWARD, p, np.float32, np.float64)
    # forced onednn on operands it does not take: the default leaf, planned, not declined
    forced = chooser.plan(Kernel.FORWARD, p, method="onednn", backend="cpu", dtype=np.float64)
    assert forced.method == "conv"
    # the auto table does not offer oneDNN for them: the XLA:CPU rules decide
    auto = chooser.plan(Kernel.FORWARD, p, method="auto", backend="cpu", dtype=np.float64)
    assert auto.method == chooser.choose(Kernel.FORWARD, p, "cpu", onednn_ok=False)


def test_forced_methods_are_checked_and_unknown_names_refused():
    p = _problem()
    with pytest.raises(ValueError, match=r"lowering: method must be 'auto', 'direct' or one of .*got 'nope'"):
        chooser.plan(Kernel.DATA, p, method="nope", backend="cpu", dtype=np.float32)
    with pytest.raises(ValueError, match="needs a backend"):
        chooser.plan(Kernel.DATA, p, method="auto", backend=None, dtype=np.float32)
    # a custom call lowered for another platform: that platform's own choice
    assert chooser.plan(Kernel.DATA, p, method="onednn", backend="gpu",
                       dtype=np.float32).method == "vjp"


def test_a_combinator_plans_each_sub_problem_once_and_run_is_entered_once(monkeypatch):
    """per_group's sub-problems get leaf plans from the same backend's table; the dispatch
    (registry.run) is entered once for the whole call, never again for its pieces."""
    entered, plans = [], []
    real_run, real_plan = registry.run, chooser.plan

    def counting_run(*args, **kwargs):
        entered.append(args[0])
        return real_run(*args, **kwargs)

    def counting_plan(*args, **kwargs):
        made = real_plan(*args, **kwargs)
        plans.append(made.method)
        return made

    monkeypatch.setattr(registry, "run", counting_run)
    monkeypatch.setattr(chooser, "plan", counting_plan)
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
    assert chooser.partitioner_workaround(version) is applies
    monkeypatch.setattr(chooser, "PARTITIONER_FIXED_IN", ("0.11.2",))
    assert chooser.partitioner_workaround("0.11.2") is False


# ------------------------------------------------------------------ nothing else decides

def _modules() -> dict[str, pathlib.Path]:
    root = pathlib.Path(jaxconv.__file__).parent
    found = {}
    for f in root.rglob("*.py"):
        name = ".".join(f.relative_to(root.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = f
    return found


def _imports(name: str, f: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The jaxconv modules ``name`` imports (at its top or in a function), with the packages
    they are in where ``name`` is outside them (importing a module runs its package's
    ``__init__``)."""
    package = name if f.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for a in node.names:
                full = f"{base}.{a.name}"
                found.add(full if full in modules else base)
    for m in list(found):
        parts = m.split(".")
        found |= {p for p in (".".join(parts[:k]) for k in range(1, len(parts)))
                  if p in modules and not (name == p or name.startswith(p + "."))}
    return {m for m in found if m in modules and m != name}


def test_no_import_cycle_lazy_or_not():
    """The module graph has no cycle, counting imports inside functions: the tables, the
    chooser and the timing import downwards only."""
    modules = _modules()
    graph = {n: _imports(n, f, modules) for n, f in modules.items()}
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                pytest.fail(f"import cycle: {' -> '.join([*path[path.index(m):], m])}")
            if m not in state:
                visit(m, [*path, m])
        state[n] = 2
    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def _users(modules: dict[str, pathlib.Path], pattern: str) -> set[str]:
    return {n.removeprefix("jaxconv._src.") for n, f in modules.items()
            if re.search(pattern, f.read_text())}


def test_nothing_but_the_chooser_decides():
    """Only the chooser reads the tables, hands candidates to the timing, resolves Winograd's
    tile, asks oneDNN's applicability, and sets the allocator."""
    modules = _modules()
    chooser_only = {
        "reads the tables": r"lowering import [^\n]*\btables\b|lowering\.tables",
        "times a choice": r"measured\.(pick|Contest)\(",
        "resolves Winograd's tile": r"(?<!def )fewest_products_tile\(",
        "asks whether oneDNN applies": r"onednn\.(applies|product_applies)\(",
        "sets the allocator": r"keep_by_default\(\)",
    }
    for what, pattern in chooser_only.items():
        assert _users(modules, pattern) == {"lowering.chooser"}, what
