"""The compiled programs: the override is an argument of the jitted function, ``"vjp"`` is
JAX's own program, ``"auto"`` reaches each platform's program, products carry no size-one batch
dimension and are fenced in GPU programs only."""

from __future__ import annotations

# ---- the override is an argument; "vjp" is JAX's program; "auto" per platform ----------
import functools  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp
import numpy as np
import pytest
from jax import (
    export,  # noqa: E402
    lax,
)

import jaxconv
from tests.support import helpers as h
from tests.support.lowering_matrix import (
    HIGHEST,
    _dot_generals,
    _size_one_batch_dims,
)

_HLO_NOISE = re.compile(r"(, )?metadata=\{[^}]*\}|\.\d+\b")


def _compiled(jitted, *args, **kwargs) -> list[str]:
    """Optimized HLO instructions without names' numeric suffixes or metadata."""
    lines = jitted.lower(*args, **kwargs).compile().as_text().splitlines()
    return [_HLO_NOISE.sub("", ln.strip()) for ln in lines
            if ln.strip().startswith(("%", "ROOT", "ENTRY", "}"))]


def test_forced_lowering_after_jit_changes_the_compiled_program():
    """A function jitted and run once, then called with another lowering, gets a new program."""
    x, dy = jnp.ones((2, 9, 9, 8)), jnp.ones((2, 7, 7, 8))
    op = jax.jit(jaxconv.convolution_backprop_filters,
                 static_argnames=("filter_shape", "groups", "lowering"))
    ref = op(x, dy, (3, 3, 4, 8), groups=2)  # traced and compiled with "auto"
    programs = {}
    for method in ("auto", "conv", "feature_group", "dot", "vjp", "per_group"):
        got = op(x, dy, (3, 3, 4, 8), groups=2, lowering=method)
        h.assert_close(got, ref, jnp.float32)
        programs[method] = "\n".join(_compiled(op, x, dy, (3, 3, 4, 8), groups=2,
                                                lowering=method))
    # "conv" and "vjp" differ only in how padding beyond the windows is kept: none here
    assert programs["vjp"] == programs["conv"]
    assert len(set(programs.values())) == 4
    if jax.default_backend() != "cpu":  # the rest is XLA:CPU's compiled text
        assert programs["auto"] == programs["vjp"]  # the GPU (and TPU) rule for grouped 2D
        return
    assert programs["auto"] == programs["per_group"]  # the CPU rule for grouped 2D
    assert "feature_group_count=2" in programs["feature_group"]
    assert programs["per_group"].count("convolution(") == 2  # one dense one per group
    assert "group_count" not in programs["per_group"]
    # batch_group_count=2, which XLA:CPU expands into a base-dilated convolution
    assert "convolution-base-dilated" in programs["conv"]
    assert "feature_group_count" not in programs["conv"]
    assert "dot(" in programs["dot"] and "convolution(" not in programs["dot"]


VJP_CASES = [  # (data_format, filter_format, groups, strides, dilations, pads_begin, pads_end)
    ("NXC", "XIO", 1, (1, 1), (1, 1), (1, 1), (1, 1)),
    ("NXC", "XIO", 2, (2, 2), (1, 1), (1, 0), (0, 1)),
    ("NCX", "OIX", 2, (2, 1), (1, 1), (1, 0), (0, 1)),
    ("NCX", "OIX", 1, (1, 1), (2, 1), (2, 0), (0, 1)),
    ("NXC", "OIX", 4, (3, 2), (1, 1), (0, 2), (1, 0)),  # depthwise, strided remainder
]


@pytest.mark.parametrize("df,ff,g,s,d,pb,pe", VJP_CASES)
def test_vjp_lowering_compiles_to_the_program_of_jax_vjp(df, ff, g, s, d, pb, pe):
    """What the backends without measurements get: jax.vjp's program (float32), exactly where
    it has no negative pad; where it has one (a strided weight gradient whose end pad is below
    the unread remainder), the same with the crop done by a slice (docs/semantics.md,
    "Negative pads")."""
    rng = np.random.default_rng(0)
    x = h.random(rng, h.data_shape(df, 2, 4, (9, 8)))
    w = h.random(rng, h.conv_filter_shape(ff, 8, 4 // g, (3, 3)))
    dn = (df.replace("X", "HW"), ff.replace("X", "HW"), df.replace("X", "HW"))

    def plain(x, w):
        return lax.conv_general_dilated(x, w, s, list(zip(pb, pe)), rhs_dilation=d,
                                        dimension_numbers=dn, feature_group_count=g)

    dy = h.random(rng, plain(x, w).shape)
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=g, data_format=df,
                 filter_format=ff, lowering="vjp")
    ours_w = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **attrs))
    base_w = jax.jit(lambda x, dy: jax.vjp(lambda w_: plain(x, w_), w)[1](dy)[0])
    ours_d = jax.jit(lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **attrs))
    base_d = jax.jit(lambda dy, w: jax.vjp(lambda x_: plain(x_, w), x)[1](dy)[0])
    for ours, base, args in ((ours_w, base_w, (x, dy)), (ours_d, base_d, (dy, w))):
        assert h.negative_widths(ours, *args) == []
        if h.negative_widths(base, *args) == []:
            assert _compiled(ours, *args) == _compiled(base, *args)
    h.assert_close(ours_w(x, dy), base_w(x, dy), jnp.float32)
    h.assert_close(ours_d(dy, w), base_d(dy, w), jnp.float32)


def _exported(fn, platform, *args) -> str:
    """The StableHLO of ``fn`` lowered for ``platform`` (no device of that kind needed),
    without source locations."""
    text = export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()
    return "\n".join(re.sub(r" loc\(.*\)$", "", ln) for ln in text.splitlines()
                     if not ln.startswith("#loc"))


def _convs(text: str) -> list[str]:
    return re.findall(r"stablehlo\.convolution.*", text)


def test_auto_lowering_reaches_the_program_of_each_platform(xla_cpu_rules):
    """One traced op, lowered for CPU, CUDA, ROCm and TPU, carries each backend's rule (on
    CPU the XLA:CPU rules: an exported program holds no oneDNN call)."""
    # Grouped 2D weight gradient: CPU one dense convolution per group ("per_group"); GPU and
    # TPU jax.vjp's batch_group conv.
    x, dy = jnp.ones((2, 9, 9, 8)), jnp.ones((2, 7, 7, 8))
    fn = functools.partial(jaxconv.convolution_backprop_filters, filter_shape=(3, 3, 4, 8),
                           groups=2)
    text = {plat: _exported(fn, plat, x, dy) for plat in ("cpu", "cuda", "rocm", "tpu")}
    assert len(_convs(text["cpu"])) == 2 and "group_count = 2" not in text["cpu"]
    for plat in ("cuda", "rocm", "tpu"):
        assert "batch_group_count = 2" in text[plat], plat
        assert "dot_general" not in text[plat] and len(_convs(text[plat])) == 1, plat
    # Dense 3D weight gradient (past the smallest, 8.8e5 multiply-adds): per-tap products on
    # CPU and GPU, jax.vjp's convolution on TPU.
    x3, dy3 = jnp.ones((2, 10, 10, 10, 4)), jnp.ones((2, 8, 8, 8, 8))
    fn3 = functools.partial(jaxconv.convolution_backprop_filters, filter_shape=(3, 3, 3, 4, 8))
    for plat, products in (("cpu", True), ("cuda", True), ("tpu", False)):
        t = _exported(fn3, plat, x3, dy3)
        assert ("dot_general" in t) is products and (not _convs(t)) is products, plat
    # Strided 2D data gradient: CPU stride phases (no input dilation), TPU jax.vjp's program
    # (the grid inside the convolution: lhs_dilate).
    dyd, w = jnp.ones((1, 4, 4, 8)), jnp.ones((3, 3, 8, 8))
    fnd = functools.partial(jaxconv.convolution_backward_data, input_shape=(9, 9), strides=2)
    cpu, tpu = _exported(fnd, "cpu", dyd, w), _exported(fnd, "tpu", dyd, w)
    assert len(_convs(cpu)) == 4 and not any("lhs_dilate" in c
                                             for c in _convs(cpu))
    assert len(_convs(tpu)) == 1 and "lhs_dilate = [2, 2]" in _convs(tpu)[0]


@pytest.mark.parametrize("rank,df,kernel", [(2, "NXC", (1, 1)), (3, "NCX", (2, 2, 2)),
                                            (1, "NCX", (3,))])
def test_products_have_no_size_one_batch_dimension(rank, df, kernel):
    """The XLA:GPU Triton GEMM abort (docs/lowerings.md, "GPU (CUDA, ROCm)") came from dot_generals with a
    size-1 batch dimension (one group); no "dot" kernel, nor its first and second
    derivatives, may emit one."""
    rng = np.random.default_rng(0)
    spatial = {1: (9,), 2: (9, 7), 3: (5, 4, 5)}[rank]
    x = h.random(rng, h.data_shape(df, 2, 4, spatial))
    w_shape = h.conv_filter_shape("XIO", 3, 4, kernel)
    y = jaxconv.convolution(x, jnp.ones(w_shape), strides=2, data_format=df)
    dy = h.random(rng, y.shape)
    w = h.random(rng, w_shape)
    a = dict(strides=2, data_format=df, precision=HIGHEST, lowering="dot")

    def wgrad(x, dy):
        return jaxconv.convolution_backprop_filters(x, dy, w_shape, **a)

    def dgrad(dy, w):
        return jaxconv.convolution_backward_data(dy, w, x.shape, **a)

    for fn, args in ((wgrad, (x, dy)), (dgrad, (dy, w))):
        def loss(*args):
            return jnp.sum(fn(*args) ** 2)

        def grad_norm(*args):
            return jnp.sum(jnp.stack([jnp.sum(g ** 2) for g in jax.grad(loss, (0, 1))(*args)]))

        for f in (fn, jax.grad(loss, (0, 1)), jax.grad(grad_norm, (0, 1))):
            assert not _size_one_batch_dims(f, *args)
        assert _dot_generals(fn, *args)  # the check saw products


@pytest.mark.parametrize("kind", ["forward", "weight", "data"])
def test_dot_products_are_fenced_in_gpu_programs_only(kind):
    """The programs XLA:GPU's Triton GEMM fusion aborted on (2D 1x1 "dot", strides 3 x 1;
    docs/lowerings.md, "GPU (CUDA, ROCm)") compiled once the product's operands and result passed
    through an optimization barrier: a "dot" kernel of one product lowered for CUDA or ROCm
    is fenced (two barriers), none lowered for CPU is, nor a kernel of several taps (fencing
    those cost 2-4x on an H200, and none aborted)."""
    rng = np.random.default_rng(0)
    x, w = h.random(rng, (2, 4, 9, 7)), h.random(rng, (3, 4, 1, 1))
    a = dict(data_format="NCX", filter_format="OIX", strides=(3, 1), precision=HIGHEST,
             lowering="dot")
    dy = h.random(rng, jaxconv.convolution(x, w, **a).shape)
    fn, args = {
        "forward": (lambda x, w: jaxconv.convolution(x, w, **a), (x, w)),
        "weight": (lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, w.shape, **a),
                   (x, dy)),
        "data": (lambda dy, w: jaxconv.convolution_backward_data(dy, w, x.shape, **a),
                 (dy, w))}[kind]
    for plat, fenced in (("cpu", False), ("cuda", True), ("rocm", True)):
        text = _exported(fn, plat, *args)
        assert text.count("stablehlo.dot_general") == 1, plat
        assert text.count("stablehlo.optimization_barrier") == (2 if fenced else 0), plat
    w3 = h.random(rng, (3, 4, 3, 2))  # six taps: six products, none fenced
    text = _exported(lambda x, w: jaxconv.convolution(x, w, **a), "cuda", x, w3)
    assert text.count("stablehlo.dot_general") == 6
    assert "optimization_barrier" not in text


