"""The fused forward (``lowering/fused.py``): a convolution and its element-wise chain as one
oneDNN primitive with post-ops, against lax's convolution (``Precision.HIGHEST``) followed by
the chain in NumPy's float64.

The matrix crosses the chains a CNN writes after a convolution (a bias, BatchNorm in inference
mode, a residual, ReLU, ReLU6, tanh, logistic, max and min) with the data layouts, groups,
strides and pads, at batch 1 (one call) and 3 (chunks of the batch on XLA's pool, each with its
rows of the residual).
"""

from __future__ import annotations

import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxconv._src import geometry
from jaxconv._src.geometry import Names
from jaxconv._src.kernel import Kernel
from jaxconv._src.lowering import fused
from jaxconv._src.lowering.fused import PostOp
from jaxconv._src.native import library
from tests.support import helpers as h
from tests.support.onednn_matrix import each_layout_kept, needs_onednn

HIGHEST = lax.Precision.HIGHEST
_NAMES = Names(x="x", y="y", w_shape="w", w_format="filter_format", layout_arguments=False)

#: chains, as post-ops (each binary one's operand drawn: "c" a channel vector, "t" a tensor)
CHAINS = {
    "bn relu": [PostOp("channel", "sub"), PostOp("channel", "mul"), PostOp("channel", "add"),
                PostOp("eltwise", "relu")],
    "bias residual relu": [PostOp("channel", "add"), PostOp("tensor", "add"),
                           PostOp("eltwise", "relu")],
    "bn relu6": [PostOp("channel", "mul"), PostOp("channel", "add"),
                 PostOp("eltwise", "clip", 0.0, 6.0)],
    # flax's BatchNorm as the accelerate rewrite passes it: the variance and epsilon
    "flax bn relu6": [PostOp("channel", "sub"), PostOp("channel", "mul_rsqrt", 1e-3),
                      PostOp("channel", "mul"), PostOp("channel", "add"),
                      PostOp("eltwise", "clip", 0.0, 6.0)],
    "div max min tanh": [PostOp("channel", "div"), PostOp("channel", "max"),
                         PostOp("tensor", "min"), PostOp("eltwise", "tanh")],
    "logistic mul residual": [PostOp("eltwise", "logistic"), PostOp("tensor", "mul"),
                              PostOp("tensor", "sub")],
    "bn swish": [PostOp("channel", "mul"), PostOp("channel", "add"), PostOp("eltwise", "swish")],
}

#: a chain without kinks, for finite differences: every binary kind, tanh, logistic and swish
SMOOTH = [PostOp("channel", "sub"), PostOp("channel", "div"), PostOp("tensor", "mul"),
          PostOp("eltwise", "tanh"), PostOp("tensor", "add"), PostOp("eltwise", "logistic"),
          PostOp("eltwise", "swish")]

# (data format, filter format, groups, in, out, spatial, kernel, strides, pads begin, pads end)
PROBLEMS = [
    ("NXC", "XIO", 1, 8, 16, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1)),
    ("NXC", "XIO", 1, 16, 24, (7, 7), (1, 1), (1, 1), (0, 0), (0, 0)),
    ("NXC", "XIO", 12, 12, 12, (8, 9), (3, 3), (2, 2), (1, 1), (0, 1)),
    ("NCX", "OIX", 2, 6, 8, (7, 6), (3, 2), (2, 1), (0, 1), (2, 0)),
]


def _problem(case, batch, seed=0, dilations=None):
    df, ff, g, ic, oc, spatial, k, s, pb, pe = case
    rng = np.random.default_rng(zlib.crc32(repr((case, batch, seed)).encode()))  # per process
    x = h.random(rng, h.data_shape(df, batch, ic, spatial))
    w = h.random(rng, h.conv_filter_shape(ff, oc, ic // g, k))
    p = geometry.convolution_problem(
        "fused", _NAMES, x_shape=x.shape, y_shape=None, w_shape=w.shape, strides=s,
        pads_begin=pb, pads_end=pe, dilations=dilations or (1,) * len(s), auto_pad="explicit",
        groups=g,
        data_format=df, filter_format=ff)
    return rng, x, w, p


def _operands(rng, post, p):
    y_shape = Kernel.FORWARD.out_shape(p)
    channels = y_shape[p.data.channel_axis]
    out = []
    for op in post:
        if op.alg == "mul_rsqrt":  # a variance: >= 0, with 0 among its values
            out.append(jnp.asarray(rng.uniform(0.0, 2.0, channels) * (rng.random(channels) > 0.1),
                                   jnp.float32))
        elif op.kind == "channel":  # away from 0: a divisor
            out.append(jnp.asarray(rng.uniform(0.5, 1.5, channels)
                                   * rng.choice([-1, 1], channels), jnp.float32))
        elif op.kind == "tensor":
            out.append(h.random(rng, y_shape))
    return out


def _oracle(x, w, operands, p, post):
    """lax's convolution at HIGHEST precision, then the chain in float64."""
    df = p.data
    dn = {"NXC": ("NHWC", "HWIO", "NHWC"), "NCX": ("NCHW", "OIHW", "NCHW")}[df.format]
    y = np.asarray(lax.conv_general_dilated(
        x, w, p.strides, list(zip(p.pads_begin, p.pads_end)), rhs_dilation=p.dilations,
        dimension_numbers=dn, feature_group_count=p.groups, precision=HIGHEST), np.float64)
    it = iter(operands)
    shape = [1] * y.ndim
    shape[df.channel_axis] = y.shape[df.channel_axis]
    for op in post:
        if op.kind == "convert":  # the chain in float64 throughout
            continue
        if op.kind == "eltwise":
            y = {"relu": lambda v: np.maximum(v, 0), "clip": lambda v: np.clip(v, op.alpha, op.beta),
                 "tanh": np.tanh, "logistic": lambda v: 1 / (1 + np.exp(-v)),
                 "swish": lambda v: v / (1 + np.exp(-v))}[op.alg](y)
            continue
        side = np.asarray(next(it), np.float64)
        side = side.reshape(shape) if op.kind == "channel" else side
        if op.alg == "mul_rsqrt":
            side = 1 / np.sqrt(side + np.float64(np.float32(op.alpha)))
        y = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
             "max": np.maximum, "min": np.minimum, "mul_rsqrt": np.multiply}[op.alg](y, side)
    return y


def _fused_is_the_chain(rng, x, w, p, post):
    """The fused call on oneDNN of ``post`` (its operands drawn) against :func:`_oracle`."""
    operands = _operands(rng, post, p)
    got = jax.jit(lambda x, w, *o: fused.forward(x, w, o, p=p, post=post, method="onednn"))(
        x, w, *operands)
    h.assert_close(got, _oracle(x, w, operands, p, post), jnp.float32)


@needs_onednn
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", PROBLEMS, ids=lambda c: f"{c[0]}-g{c[2]}-k{c[6][0]}s{c[7][0]}")
@pytest.mark.parametrize("chain", CHAINS)
def test_the_fused_call_computes_the_chain_after_the_convolution(chain, case, batch):
    rng, x, w, p = _problem(case, batch)
    post = CHAINS[chain]
    operands = _operands(rng, post, p)
    fn = jax.jit(lambda x, w, *o: fused.forward(x, w, o, p=p, post=post, method="onednn"))
    program = fn.lower(x, w, *operands).as_text()
    assert library.TARGETS["fused"] in program and library.TARGETS["forward"] not in program
    got = fn(x, w, *operands)
    h.assert_close(got, _oracle(x, w, operands, p, post), jnp.float32)


# one example, NHWC, each with at least two work units (native/onednn/decisions.h): the handler
# splits y's rows into chunks on XLA's pool, each reading its rows of x (and of the residual)
# with its own pads; (case, dilations)
ROW_PROBLEMS = [
    (("NXC", "XIO", 1, 16, 32, (64, 40), (3, 3), (1, 1), (1, 1), (1, 1)), (1, 1)),
    (("NXC", "XIO", 1, 16, 32, (97, 40), (3, 3), (2, 2), (1, 1), (0, 1)), (1, 1)),
    (("NXC", "XIO", 1, 16, 32, (61, 40), (3, 3), (1, 1), (4, 1), (2, 3)), (2, 1)),
    (("NXC", "XIO", 4, 32, 32, (150, 120), (5, 3), (3, 1), (0, 1), (4, 1)), (1, 1)),
    (("NXC", "XIO", 1, 32, 128, (131, 30), (1, 1), (2, 1), (0, 0), (0, 0)), (1, 1)),
]


def _mixed(dtype: str) -> list[PostOp]:
    """A mixed-precision chain as flax writes it after a convolution of ``dtype``: BatchNorm in
    float32, a residual, rounded back, ReLU6."""
    return [PostOp("convert", "float32"), PostOp("channel", "sub"),
            PostOp("channel", "mul_rsqrt", 1e-5), PostOp("channel", "mul"),
            PostOp("channel", "add"), PostOp("tensor", "add"), PostOp("convert", dtype),
            PostOp("eltwise", "clip", 0.0, 6.0)]


@needs_onednn
@pytest.mark.parametrize("residual", ["16-bit", "float32"])
@pytest.mark.parametrize("case, batch", [(PROBLEMS[0], 1), (PROBLEMS[0], 3), (ROW_PROBLEMS[0][0], 1)],
                         ids=["small-1", "small-3", "rows-1"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("method", ["onednn", "onednn_f32"])
def test_a_16_bit_chain_is_one_call_computed_in_float32_and_rounded_once(
        method, dtype, case, batch, residual):
    """A chain after a bfloat16 or float16 convolution, converts and all, is one call, on
    oneDNN's 16-bit kernel or on its float32 one widened: the post-ops run in float32 on the
    float32 sums and the result is rounded once, so it is the chain in float64 on the same
    operands within the dtype's tolerance, and no less accurate than the program as written
    (``fused.reference``: XLA rounds the convolution's result and the chain's, mean errors
    compared). The residual, added where the chain is float32, is read in the convolution's
    dtype or in float32 (the handler's wide tensor), one call whole, in chunks of the batch or
    of one example's rows, each reading its part of it."""
    if method == "onednn" and dtype not in library.status().dtypes:
        pytest.skip(f"oneDNN does not compute {dtype} on this CPU")
    rng, x, w, p = _problem(case, batch)
    post = _mixed(dtype)
    x, w = x.astype(dtype), w.astype(dtype)
    operands = [o.astype(dtype if residual == "16-bit" else jnp.float32) if o.ndim > 1 else o
                for o in _operands(rng, post, p)]
    fn = jax.jit(lambda x, w, *o: fused.forward(x, w, o, p=p, post=post, method=method))
    program = fn.lower(x, w, *operands).as_text()
    assert library.TARGETS["fused"] in program and library.TARGETS["forward"] not in program
    got = fn(x, w, *operands)
    assert got.dtype == np.dtype(dtype)
    want = _oracle(*(np.asarray(v, np.float32) for v in (x, w)),
                   [np.asarray(o, np.float32) for o in operands], p, post)
    h.assert_close(got, want, getattr(jnp, dtype))
    written = jax.jit(lambda x, w, *o: fused.reference(
        x, w, *o, p=p, post=tuple(post), precision=None, preferred_element_type=None,
        method="conv"))(x, w, *operands)
    error = lambda v: np.mean(np.abs(np.asarray(v, np.float64) - want))  # noqa: E731
    assert error(got) <= error(written), (error(got), error(written))


# a chain reading tensors (a residual), the convolution's dtype and the tensors' ("wide": a
# bfloat16 convolution's float32 residual, the handler's kWideTensor)
TENSOR_CHAINS = [("bias residual relu", "float32", "float32"),
                 ("logistic mul residual", "float32", "float32"),
                 ("bias residual relu", "bfloat16", "bfloat16"),
                 ("logistic mul residual", "bfloat16", "bfloat16"),
                 ("mixed", "bfloat16", "float32")]


@needs_onednn
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("chain, dtype, tensors", TENSOR_CHAINS,
                         ids=[f"{c.replace(' ', '-')}-{d}-{t}" for c, d, t in TENSOR_CHAINS])
def test_each_layout_the_trial_races_reads_the_tensors_in_its_outputs_layout(
        chain, dtype, tensors, batch, layout_trial):
    """oneDNN 3.2 creates a primitive whose tensor post-op operand is in the caller's layout
    and whose output is in another (its blocked one; the plain channels-first one its gemm
    kernel picks for "any" in bfloat16), and reads the operand as if in the output's layout:
    the residual added to other outputs (ResNet-18's served bfloat16 output 0.59 of its
    magnitude off, where the layout trial kept such a primitive). The handler creates such a
    primitive with the operand in its output's layout, which each call reorders it into
    (native/onednn/primitives.cc). Each candidate the trial races, kept by an earlier process's
    verdict, computes the chain, the whole call and its chunks of the batch; one at least
    computes in a layout other than the caller's."""
    if dtype not in library.status().dtypes:
        pytest.skip(f"oneDNN does not compute {dtype} on this CPU")
    case = ("NXC", "XIO", 1, 32, 32, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1))
    rng, x, w, p = _problem(case, batch)
    post = _mixed(dtype) if chain == "mixed" else CHAINS[chain]
    x, w = x.astype(dtype), w.astype(dtype)
    operands = [o.astype(tensors) if o.ndim > 1 else o for o in _operands(rng, post, p)]
    want = _oracle(*(np.asarray(v, np.float32) for v in (x, w)),
                   [np.asarray(o, np.float32) for o in operands], p, post)

    def run():
        return jax.jit(lambda x, w, *o: fused.forward(x, w, o, p=p, post=post,
                                                      method="onednn"))(x, w, *operands)
    layouts = each_layout_kept("forward", run,
                               lambda got: h.assert_close(got, want, getattr(jnp, dtype)))
    assert layouts - {"caller", "caller_filter"}, layouts


def test_a_chain_must_end_in_the_convolutions_dtype():
    rng, x, w, p = _problem(PROBLEMS[0], 1)
    x, w = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match="^fused: post must end in y's dtype bfloat16, got a "
                                         "chain that ends in float32"):
        fused.forward(x, w, [], p=p, post=[PostOp("convert", "float32"), PostOp("eltwise", "relu")])
    with pytest.raises(ValueError, match="^fused: a post-op must be one of"):
        PostOp("convert", "int8")


def test_without_onednn_the_chain_runs_after_the_chosen_convolution():
    """Where the forward is not oneDNN's (XLA's own convolution here), the program is the
    convolution and the chain as written: no fused call, the same values."""
    rng, x, w, p = _problem(PROBLEMS[0], 2)
    post = CHAINS["bias residual relu"]
    operands = _operands(rng, post, p)
    fn = jax.jit(lambda x, w, *o: fused.forward(x, w, o, p=p, post=post, method="conv"))
    assert library.TARGETS["fused"] not in fn.lower(x, w, *operands).as_text()
    h.assert_close(fn(x, w, *operands), _oracle(x, w, operands, p, post), jnp.float32)


@pytest.mark.parametrize("method", ["onednn", "conv"])
def test_derivatives_and_batching_are_the_unfused_chains(method):
    """``grad``, ``jvp`` (to order 2) and ``vmap`` of the fused forward are those of the
    convolution and the chain (``fused.reference``), for the call and for its operands. The
    chain is smooth: finite differences across ReLU's, max's or min's kink (the other chains)
    are no derivative to check against."""
    if method == "onednn" and not library.status().available:
        pytest.skip("the oneDNN handler is not loaded")
    rng, x, w, p = _problem(PROBLEMS[0], 2)
    post = SMOOTH
    operands = _operands(rng, post, p)

    def f(x, w, *o):
        return fused.forward(x, w, o, p=p, post=post, method=method)

    def g(x, w, *o):
        return fused.reference(x, w, *o, p=p, post=tuple(post), precision=None,
                               preferred_element_type=None, method=method)
    h.check_grads(f, (x, w, *operands), order=2)  # the per-dtype bounds
    loss = lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    ref = lambda *a: jnp.sum(jnp.sin(g(*a)))  # noqa: E731
    for a, b in zip(jax.grad(loss, (0, 1, 2, 4))(x, w, *operands),
                    jax.grad(ref, (0, 1, 2, 4))(x, w, *operands)):
        h.assert_close(a, b, jnp.float32)
    xs = jnp.stack([x, 2 * x])
    axes = (0, *[None] * (1 + len(operands)))
    got = jax.jit(jax.vmap(f, axes))(xs, w, *operands)
    h.assert_close(got, jax.vmap(g, axes)(xs, w, *operands), jnp.float32)


def test_operands_that_do_not_match_the_chain_are_value_errors():
    rng, x, w, p = _problem(PROBLEMS[0], 1)
    post = CHAINS["bias residual relu"]
    c, t = _operands(rng, post, p)
    with pytest.raises(ValueError, match="^fused: operands must be one per binary post-op"):
        fused.forward(x, w, [c], p=p, post=post)
    with pytest.raises(ValueError, match=r"^fused: a channel operand must be float32\[16\]"):
        fused.forward(x, w, [c[:3], t], p=p, post=post)
    with pytest.raises(ValueError, match="^fused: a tensor operand must be float32"):
        fused.forward(x, w, [c, t[:, :2]], p=p, post=post)
    with pytest.raises(ValueError, match="^fused: a post-op must be one of"):
        PostOp("eltwise", "gelu")
    with pytest.raises(ValueError, match="^fused: mul_rsqrt must be a channel post-op"):
        PostOp("tensor", "mul_rsqrt")


@needs_onednn
def test_chunks_of_the_batch_read_their_rows_of_the_residual():
    """A call the handler splits into chunks of the batch on XLA's pool (each chunk a
    single-threaded primitive of its examples) reads each chunk's rows of a tensor operand."""
    case = ("NXC", "XIO", 1, 32, 32, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1))
    rng, x, w, p = _problem(case, 4)
    post = CHAINS["logistic mul residual"]
    _fused_is_the_chain(rng, x, w, p, post)
    mine = [c for c in library.choices() if c["kernel"] == "forward" and c["x"][1:] == (28, 28, 32)]
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: XLA's pool has one thread, the call runs whole")
    assert mine and all(c["x"][0] < 4 and c["threading"] == "single" for c in mine), mine


@needs_onednn
@pytest.mark.parametrize("chain", ["logistic mul residual", "bias residual relu"])
def test_chunks_of_each_examples_rows_read_their_rows_of_the_residual(chain):
    """Planned for 8 pool threads (``library.planned_pool_threads``: a larger machine's split,
    run on this machine's pool), a batch of 3 runs as chunks of each example's rows
    (decisions.h, SplitsExampleRows), each with its own pads, each reading its example's rows
    of the tensor operands."""
    case = ("NXC", "XIO", 1, 24, 40, (26, 26), (3, 3), (1, 1), (1, 1), (1, 1))
    rng, x, w, p = _problem(case, 3)
    with library.planned_pool_threads(8):
        _fused_is_the_chain(rng, x, w, p, CHAINS[chain])
    mine = [c for c in library.choices() if c["kernel"] == "forward"
            and c["x"][2:] == (26, 24) and c["w"] == w.shape]
    assert mine and all(c["x"][0] == 1 and c["x"][1] < 26 and c["threading"] == "single"
                        for c in mine), [(c["x"], c["threading"]) for c in mine]


@needs_onednn
@pytest.mark.parametrize("chain", ["none", "bias residual relu"])
@pytest.mark.parametrize("case, dilations", ROW_PROBLEMS,
                         ids=lambda c: "-".join(map(str, c[5:10])) if len(c) > 2 else str(c))
def test_one_example_splits_its_rows_each_with_its_own_pads(case, dilations, chain):
    rng, x, w, p = _problem(case, 1, dilations=dilations)
    post = CHAINS.get(chain, [])
    _fused_is_the_chain(rng, x, w, p, post)
    mine = [c for c in library.choices() if c["kernel"] == "forward"
            and c["x"][2:] == x.shape[2:]]
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: XLA's pool has one thread, the call runs whole")
    assert mine and all(c["x"][1] < x.shape[1] and c["threading"] == "single"
                        for c in mine), [(c["x"], c["threading"], c["source"]) for c in mine]


def _handed(key: str) -> list[tuple[int, int]]:
    """The (kind, algorithm) codes of the post-ops in a cached problem's key (``choices()``'s
    ``key``: problem.cc, MakeKey): what the handler gave oneDNN."""
    words = [int(v) for v in key.split(",")]
    at = 4
    for _ in range(9):  # the shapes, axes, strides, dilations and pads: each after its length
        at += 1 + words[at]
    n, at = words[at], at + 1
    return [(words[at + 4 * i], words[at + 4 * i + 1]) for i in range(n)]


CHANNEL_ADD, CHANNEL_MUL, TENSOR_ADD, RELU = (1, 0), (1, 2), (2, 0), (0, 0)


@needs_onednn
@pytest.mark.parametrize("case, post, handed", [
    # 1x1 16 -> 24 at 7x7, 384 filter elements against y's 1176: BatchNorm (flax's, with its
    # variance) folds into the filter; one channel add is left, then the rest of the chain
    (PROBLEMS[1], (PostOp("channel", "sub"), PostOp("channel", "mul_rsqrt", 1e-5),
                   PostOp("channel", "mul"), PostOp("channel", "add"), PostOp("tensor", "add"),
                   PostOp("channel", "mul"), PostOp("eltwise", "relu")),
     [CHANNEL_ADD, TENSOR_ADD, CHANNEL_MUL, RELU]),
    # 3x3 64 -> 64 at 3x3: the filter outweighs y, so a multiply and an add post-op
    (("NXC", "XIO", 1, 64, 64, (3, 3), (3, 3), (1, 1), (1, 1), (1, 1)),
     tuple(CHAINS["bn relu"]), [CHANNEL_MUL, CHANNEL_ADD, RELU]),
    # no multiplication: the run's adds and subtracts are one add; a mul_rsqrt after a ReLU
    # (past the affine run) a multiply by its computed vector; a division ends the run
    (PROBLEMS[1], (PostOp("channel", "add"), PostOp("channel", "sub"), PostOp("eltwise", "relu"),
                   PostOp("channel", "mul_rsqrt", 0.5)), [CHANNEL_ADD, RELU, CHANNEL_MUL]),
    (PROBLEMS[1], (PostOp("channel", "div"), PostOp("channel", "mul")), [(1, 3), CHANNEL_MUL]),
])
def test_a_leading_affine_run_is_one_multiply_and_add_folded_where_the_filter_is_small(
        case, post, handed):
    """The handler composes the chain's leading channel adds, subtracts, multiplies and
    mul_rsqrts into ``a * y + b`` per channel (``native/onednn/affine.h``) and folds ``a`` into
    the filter where the filter has no more elements than y; the values stay the chain's
    (float32's tolerance against float64), and the cached problem shows what oneDNN got."""
    rng, x, w, p = _problem(case, 1)
    _fused_is_the_chain(rng, x, w, p, post)
    mine = [c for c in library.choices() if c["kernel"] == "forward" and c["w"] == w.shape]
    assert handed in [_handed(c["key"]) for c in mine], mine  # (other chains' entries too)
    assert not any((1, 6) in _handed(c["key"]) for c in mine)  # no mul_rsqrt reaches oneDNN


@needs_onednn
def test_a_pointwise_example_splits_its_pixels_with_their_residual():
    """A 1x1, stride-1, unpadded forward of one NHWC example runs as chunks of its pixels made
    one axis (native/onednn/decisions.h, MergesPixels), each reading its pixels of the residual."""
    case = ("NXC", "XIO", 1, 32, 128, (45, 29), (1, 1), (1, 1), (0, 0), (0, 0))
    rng, x, w, p = _problem(case, 1)
    post = CHAINS["bias residual relu"]
    _fused_is_the_chain(rng, x, w, p, post)
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: XLA's pool has one thread, the call runs whole")
    mine = [c for c in library.choices() if c["kernel"] == "forward" and c["w"] == w.shape
            and c["x"][2:] == (1, 32)]  # (ROW_PROBLEMS' strided 1x1 has this filter too)
    assert sorted(c["x"] for c in mine) == [(1, 652, 1, 32), (1, 653, 1, 32)], mine
