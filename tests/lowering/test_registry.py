"""The lowering registry is the one list of methods: the public types, the docstrings, the
backend tables and the ops' validation all agree with it, and a new entry is all a new method
needs to be reachable from every op of its kernel (docs/lowerings.md)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import pathlib
import typing

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv
from jaxconv._src import geometry, lowering, registry
from jaxconv._src.lowering import tables
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import registry as methods_registry
from jaxconv._src.lowering.method import Method
from tests.support import helpers as h


@pytest.mark.parametrize("kernel", list(Kernel))
def test_public_literal_types_list_the_registry(kernel):
    literal = methods_registry.LOWERING_TYPES[kernel]
    assert typing.get_args(literal) == ("auto", "direct", *lowering.methods(kernel))


def test_every_method_has_a_leaf_or_combinator_function_per_kernel():
    for name, m in lowering.METHODS.items():
        assert m.name == name and m.kernels, name
        assert set(m.kernels) <= set(Kernel), name
        for fn in m.kernels.values():
            params = inspect.signature(fn).parameters
            assert ("leaf" in params) == m.combinator, name


def _ops_of(kernel):
    return [name for name, info in registry.ARRAY_OPS.items() if info.kernel is kernel]


@pytest.mark.parametrize("op", sorted(registry.ARRAY_OPS))
def test_each_op_takes_its_kernels_lowering_type_and_documents_its_methods(op):
    fn = getattr(jaxconv, op)
    kernel = registry.ARRAY_OPS[op].kernel
    hints = typing.get_type_hints(fn)
    assert hints["lowering"] == methods_registry.LOWERING_TYPES[kernel]
    doc = fn.__doc__ or ""
    assert methods_registry.PLACEHOLDER not in doc
    start = doc.find(f'lowering: the {kernel.label} formulation: ``"auto"``')
    if start < 0:  # "as in jaxconv.convolution_...": an op of the same kernel with the paragraph
        assert "lowering:" in doc
        referred = [o for o in _ops_of(kernel) if f"jaxconv.{o}`" in doc[doc.index("lowering:"):]]
        assert referred, op
        return
    paragraph = doc[start:doc.index("compiled program", start)]
    named = set(re_quoted(paragraph))
    assert named == {"auto", "direct", *lowering.methods(kernel)}


def re_quoted(text: str) -> list[str]:
    import re
    return re.findall(r'``"(\w+)"``', text)


def _problems():
    """A matrix of small problems: rank, groups (dense, grouped, depthwise x multiplier),
    kernel, stride, dilation, channels (few, many) and batch."""
    for rank, (g, icg, ocg), k, s, d, scale, n in itertools.product(
            (1, 2, 3), ((1, 4, 8), (2, 4, 4), (4, 1, 1), (4, 1, 2), (32, 8, 8)), (1, 3), (1, 2),
            (1, 2), (1, 16), (1, 8)):
        spatial = (9,) * rank
        yield geometry.convolution_problem(
            "t", geometry.Names(), x_shape=(n, *spatial, g * icg * scale), y_shape=None,
            w_shape=(*(k,) * rank, icg * scale, g * ocg * scale), strides=s, pads_begin=1,
            pads_end=0, dilations=d, auto_pad="explicit", groups=g, data_format="NXC",
            filter_format="XIO")


PROBLEMS = list(_problems())


@pytest.mark.parametrize("backend", tables.BACKENDS)
@pytest.mark.parametrize("kernel", list(Kernel))
def test_backend_tables_pick_registered_applicable_methods(kernel, backend):
    """Every name a table returns is a method of the kernel that applies to the problem, and
    no table picks a combinator for a one-group problem (a combinator's sub-problems have one
    group and must get a leaf formulation)."""
    picked = set()
    for p in PROBLEMS:
        m = lowering.choose(kernel, p, backend)
        assert m in lowering.methods(kernel), (m, p)
        assert lowering.why_not(m, kernel, p) is None, (m, p)
        if p.groups == 1:
            assert not lowering.METHODS[m].combinator, (m, p)
        picked.add(m)
    assert picked  # the matrix reached the table


def test_a_new_registry_entry_is_reachable_from_every_op_of_its_kernel(monkeypatch):
    """What docs/lowerings.md promises: one record in the registry, and the ops of its kernel
    accept it (validation, dispatch, the primitive's lowering and its rules under grad)."""
    def forward_by_lax(x, w, p, precision, preferred_element_type):
        return lax.conv_general_dilated(
            x, w, p.strides, list(zip(p.pads_begin, p.pads_end)), rhs_dilation=p.dilations,
            dimension_numbers=p.dimension_numbers(), feature_group_count=p.groups,
            precision=precision)

    toy = Method("lax_reference", "lax's own convolution", {Kernel.FORWARD: forward_by_lax})
    monkeypatch.setitem(methods_registry.METHODS, toy.name, toy)
    assert "lax_reference" in lowering.methods(Kernel.FORWARD)
    rng = np.random.default_rng(0)
    x, w = h.random(rng, (2, 7, 6, 4)), h.random(rng, (3, 2, 2, 6))
    kw = dict(strides=(2, 1), pads_begin=(1, 0), pads_end=(0, 1), groups=2,
              precision=lax.Precision.HIGHEST)
    got = jaxconv.convolution(x, w, **kw, lowering="lax_reference")  # not in the Literal: a str
    h.assert_close(got, jaxconv.convolution(x, w, **kw, lowering="conv"), jnp.float32)
    # a forward method only: the data-gradient ops list their own methods and refuse it
    with pytest.raises(ValueError, match=r"lowering must be one of \['auto', 'direct', 'grid', .*\], got "
                                         r"'lax_reference'"):
        jaxconv.convolution_backward_data(jnp.ones((1, 3, 5, 6)), w, (7, 6), strides=(2, 1),
                                          groups=2, lowering="lax_reference")


def test_combinators_get_the_backends_leaf_for_their_sub_problems():
    """per_group runs each one-group sub-problem by the table of the platform the program is
    lowered for, and stages no platform switch of its own: exported for CPU and CUDA, it has
    the switches of one kernel call (a leaf's), and each platform's branch one dense
    convolution per group (the CPU and GPU tables both pick one for these sub-problems)."""
    import functools

    import jax
    from jax import export

    x, dy = jnp.ones((2, 9, 9, 8)), jnp.ones((2, 7, 7, 8))

    def exported(method):
        fn = functools.partial(jaxconv.convolution_backprop_filters, filter_shape=(3, 3, 4, 8),
                               groups=2, lowering=method)
        return export.export(jax.jit(fn), platforms=["cpu", "cuda"])(x, dy).mlir_module()

    grouped, leaf = exported("per_group"), exported("conv")
    assert grouped.count("stablehlo.case") == leaf.count("stablehlo.case") > 0
    assert grouped.count("stablehlo.convolution") == 2 * 2  # two groups, two platforms
    sub = dataclasses.replace(
        geometry.convolution_problem(
            "t", geometry.Names(), x_shape=x.shape, y_shape=dy.shape, w_shape=(3, 3, 4, 8),
            strides=None, pads_begin=None, pads_end=None, dilations=None, auto_pad="none",
            groups=2, data_format="NXC", filter_format="XIO"),
        groups=1, in_channels=4, out_channels=4)
    assert {lowering.choose(Kernel.WEIGHT, sub, b) for b in ("cpu", "gpu")} == {"conv", "vjp"}


def _package_imports(package: pathlib.Path, name: str) -> dict[str, set[str]]:
    """Each module of ``package`` (dotted ``name``) -> the modules of it that it imports,
    at module level or inside a function."""
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for m in modules:
        found: set[str] = set()
        for node in ast.walk(ast.parse((package / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == name:
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(name + "."):
                found.add(node.module[len(name) + 1:].split(".")[0])
            elif isinstance(node, ast.Import):
                found |= {a.name[len(name) + 1:].split(".")[0] for a in node.names
                          if a.name.startswith(name + ".")}
        graph[m] = found - {m}
    return graph


def test_the_lowering_package_has_no_import_circle():
    """No module of ``jaxconv/_src/lowering`` imports one that imports it back, directly or
    through others (function-level imports count: they are circles deferred, not removed)."""
    package = pathlib.Path(lowering.__file__).parent
    graph = _package_imports(package, "jaxconv._src.lowering")
    assert "onednn" in graph["methods"]  # the walk sees the package's imports
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        if m in path:
            raise AssertionError(f"import circle: {' -> '.join(path[path.index(m):] + (m,))}")
        if m not in done:
            for n in sorted(graph[m]):
                visit(n, path + (m,))
            done.add(m)
    for m in sorted(graph):
        visit(m, ())
