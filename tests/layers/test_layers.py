"""The flax.nnx and equinox layers against torch.nn modules with copied weights, forward and gradients.

Also: jaxconv.flax.Conv is nnx.Conv (same parameters, same values), and the layers' gradients are
built from jaxconv's kernels (no lax convolution outside the jaxconv_conv primitive).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from jax import lax

import jaxconv.equinox
import jaxconv.flax
from tests.support import helpers as h

HIGHEST = lax.Precision.HIGHEST
TORCH_CONV_T = {1: torch.nn.ConvTranspose1d, 2: torch.nn.ConvTranspose2d,
                3: torch.nn.ConvTranspose3d}
TORCH_CONV = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}
SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 5)}

# (rank, in, out, kernel, stride, padding, output_padding, dilation, groups)
TRANSPOSE_CASES = [
    (1, 4, 6, 3, 2, 1, 1, 1, 2),
    (2, 4, 6, 3, 2, 1, 1, 1, 1),
    (2, 6, 4, 3, 3, 0, 2, 2, 2),
    (3, 2, 4, 2, 2, 0, 0, 1, 1),
    (2, 4, 4, 3, 1, 1, 0, 1, 4),  # depthwise
]
CONV_CASES = [  # (rank, in, out, kernel, stride, padding, dilation, groups)
    (1, 4, 6, 3, 2, 1, 1, 2),
    (2, 4, 6, 3, 2, 1, 1, 1),
    (2, 4, 8, 3, 1, 2, 2, 4),
    (3, 2, 4, 2, 1, 0, 1, 1),
]


def _torch_grads(module, x_ncx, dy_ncx):
    xt = torch.tensor(np.asarray(x_ncx, np.float64), requires_grad=True)
    y = module(xt)
    y.backward(torch.tensor(np.asarray(dy_ncx, np.float64)))
    return y.detach().numpy(), xt.grad.numpy(), module.weight.grad.numpy(), module.bias.grad.numpy()


def _ncx(a, rank):  # (N, *X, C) -> (N, C, *X)
    return np.moveaxis(np.asarray(a), -1, 1)


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=[f"{c[0]}d-s{c[4]}-g{c[8]}" for c in TRANSPOSE_CASES])
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_flax_conv_transpose_against_torch(case, data_format):
    rank, cin, cout, k, s, p, op, d, g = case
    layer = jaxconv.flax.ConvTranspose(cin, cout, (k,) * rank, strides=s, padding=p,
                                       output_padding=op, dilation=d, groups=g,
                                       data_format=data_format, precision=HIGHEST,
                                       rngs=nnx.Rngs(0))
    ref = TORCH_CONV_T[rank](cin, cout, k, stride=s, padding=p, output_padding=op, dilation=d,
                             groups=g).double()
    with torch.no_grad():  # the torch weight, as it is
        ref.weight.copy_(torch.tensor(np.asarray(layer.kernel[...], np.float64)))
        ref.bias.copy_(torch.tensor(np.asarray(layer.bias[...], np.float64)))
    rng = np.random.default_rng(0)
    x_ncx = rng.standard_normal((2, cin, *SPATIAL[rank]))
    x = jnp.asarray(x_ncx if data_format == "NCX" else np.moveaxis(x_ncx, 1, -1), jnp.float32)
    y = layer(x)
    dy = h.random(rng, y.shape)
    y_t, dx_t, dw_t, db_t = _torch_grads(ref, x_ncx, dy if data_format == "NCX" else _ncx(dy, rank))

    def loss(layer, x):
        return jnp.sum(layer(x) * dy)

    grads, dx = nnx.grad(loss, argnums=(0, 1))(layer, x)
    if data_format == "NXC":
        y, dx = _ncx(y, rank), _ncx(dx, rank)
    h.assert_close(y, y_t, jnp.float32)
    h.assert_close(dx, dx_t, jnp.float32)
    h.assert_close(grads.kernel[...], dw_t, jnp.float32)
    h.assert_close(grads.bias[...], db_t, jnp.float32)


@pytest.mark.parametrize("case", CONV_CASES, ids=[f"{c[0]}d-s{c[4]}-g{c[7]}" for c in CONV_CASES])
def test_flax_conv_is_nnx_conv_and_matches_torch(case):
    rank, cin, cout, k, s, p, d, g = case
    kw = dict(strides=s, padding=[(p, p)] * rank, kernel_dilation=d, feature_group_count=g,
              precision=HIGHEST)
    ours = jaxconv.flax.Conv(cin, cout, (k,) * rank, rngs=nnx.Rngs(0), **kw)
    theirs = nnx.Conv(cin, cout, (k,) * rank, rngs=nnx.Rngs(0), **kw)
    rng = np.random.default_rng(1)
    x = h.random(rng, (2, *SPATIAL[rank], cin))
    h.assert_close(ours.kernel[...], theirs.kernel[...], jnp.float32)  # same initialisation
    y = ours(x)
    h.assert_close(y, theirs(x), jnp.float32)
    dy = h.random(rng, y.shape)
    g_ours = nnx.grad(lambda m: jnp.sum(m(x) * dy))(ours)
    g_theirs = nnx.grad(lambda m: jnp.sum(m(x) * dy))(theirs)
    h.assert_close(g_ours.kernel[...], g_theirs.kernel[...], jnp.float32)
    ref = TORCH_CONV[rank](cin, cout, k, stride=s, padding=p, dilation=d, groups=g).double()
    with torch.no_grad():  # flax (*K, I, O) -> torch (O, I, *K)
        w = np.asarray(ours.kernel[...], np.float64)
        ref.weight.copy_(torch.tensor(np.moveaxis(w, (-1, -2), (0, 1))))
        ref.bias.copy_(torch.tensor(np.asarray(ours.bias[...], np.float64)))
    y_t, _, dw_t, _ = _torch_grads(ref, _ncx(x, rank), _ncx(dy, rank))
    h.assert_close(_ncx(y, rank), y_t, jnp.float32)
    h.assert_close(np.moveaxis(np.asarray(g_ours.kernel[...]), (-1, -2), (0, 1)), dw_t,
                   jnp.float32)
    for module, lax_convs_expected in ((ours, False), (theirs, True)):
        graphdef, state = nnx.split(module)
        grad = jax.grad(lambda st, x: jnp.sum(nnx.merge(graphdef, st)(x)))
        assert (h.lax_convolutions(grad, state, x) > 0) is lax_convs_expected


@pytest.mark.parametrize("case", CONV_CASES, ids=[f"{c[0]}d-s{c[4]}-g{c[7]}" for c in CONV_CASES])
def test_equinox_conv_against_eqx_and_torch(case):
    rank, cin, cout, k, s, p, d, g = case
    ours = jaxconv.equinox.Conv(rank, cin, cout, k, stride=s, padding=p, dilation=d, groups=g,
                                precision=HIGHEST, key=jax.random.key(0))
    theirs = eqx.nn.Conv(rank, cin, cout, k, stride=s, padding=p, dilation=d, groups=g,
                         key=jax.random.key(0))
    theirs = eqx.tree_at(lambda m: (m.weight, m.bias), theirs, (ours.weight, ours.bias))
    rng = np.random.default_rng(2)
    x = h.random(rng, (cin, *SPATIAL[rank]))
    y = ours(x)
    h.assert_close(y, theirs(x), jnp.float32)
    dy = h.random(rng, y.shape)
    gw = jax.grad(lambda m: jnp.sum(m(x) * dy))(ours).weight
    ref = TORCH_CONV[rank](cin, cout, k, stride=s, padding=p, dilation=d, groups=g).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(np.asarray(ours.weight, np.float64)))
        ref.bias.copy_(torch.tensor(np.asarray(ours.bias, np.float64).reshape(-1)))
    y_t, dx_t, dw_t, _ = _torch_grads(ref, np.asarray(x)[None], np.asarray(dy)[None])
    h.assert_close(y, y_t[0], jnp.float32)
    h.assert_close(gw, dw_t, jnp.float32)
    h.assert_close(jax.grad(lambda x: jnp.sum(ours(x) * dy))(x), dx_t[0], jnp.float32)
    assert h.lax_convolutions(lambda m: jax.grad(lambda m: jnp.sum(m(x)))(m), ours) == 0


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=[f"{c[0]}d-s{c[4]}-g{c[8]}" for c in TRANSPOSE_CASES])
def test_equinox_conv_transpose_against_torch_and_vmap(case):
    rank, cin, cout, k, s, p, op, d, g = case
    ours = jaxconv.equinox.ConvTranspose(rank, cin, cout, k, stride=s, padding=p,
                                         output_padding=op, dilation=d, groups=g,
                                         precision=HIGHEST, key=jax.random.key(1))
    ref = TORCH_CONV_T[rank](cin, cout, k, stride=s, padding=p, output_padding=op, dilation=d,
                             groups=g).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(np.asarray(ours.weight, np.float64)))
        ref.bias.copy_(torch.tensor(np.asarray(ours.bias, np.float64).reshape(-1)))
    rng = np.random.default_rng(3)
    xb = h.random(rng, (2, cin, *SPATIAL[rank]))
    yb = jax.vmap(ours)(xb)  # a batch, the equinox way
    dy = h.random(rng, yb.shape)
    y_t, dx_t, dw_t, db_t = _torch_grads(ref, xb, dy)
    h.assert_close(yb, y_t, jnp.float32)
    grads = jax.grad(lambda m: jnp.sum(jax.vmap(m)(xb) * dy))(ours)
    h.assert_close(grads.weight, dw_t, jnp.float32)
    h.assert_close(grads.bias.reshape(-1), db_t, jnp.float32)
    h.assert_close(jax.grad(lambda x: jnp.sum(jax.vmap(ours)(x) * dy))(xb), dx_t, jnp.float32)


# ---- the equinox Conv classes are equinox's, computed by jaxconv ------------------------

EQX_CONVS = {"Conv": None, "Conv1d": 1, "Conv2d": 2, "Conv3d": 3}


@pytest.mark.parametrize("name", [*sorted(EQX_CONVS), "ConvTranspose", "ConvTranspose1d",
                                  "ConvTranspose2d", "ConvTranspose3d"])
def test_equinox_conv_signature_and_fields_are_equinoxs(name):
    import dataclasses
    import inspect

    ours, theirs = getattr(jaxconv.equinox, name), getattr(eqx.nn, name)
    sig_o, sig_t = inspect.signature(ours), inspect.signature(theirs)
    params_o, params_t = list(sig_o.parameters.values()), list(sig_t.parameters.values())
    assert [(p.name, p.kind, p.default) for p in params_o[:len(params_t)]] == \
        [(p.name, p.kind, p.default) for p in params_t]
    assert [(p.name, p.kind, p.default) for p in params_o[len(params_t):]] == [
        ("precision", inspect.Parameter.KEYWORD_ONLY, None),
        ("lowering", inspect.Parameter.KEYWORD_ONLY, "auto")]
    assert [f.name for f in dataclasses.fields(ours)] == \
        [f.name for f in dataclasses.fields(theirs)] + ["precision", "lowering"]
    assert issubclass(ours, theirs)


@pytest.mark.parametrize("padding_mode", ["ZEROS", "REFLECT", "REPLICATE", "CIRCULAR"])
@pytest.mark.parametrize("name,dtype,groups", [("Conv2d", jnp.float32, 2), ("Conv1d", jnp.float32, 1),
                                               ("Conv3d", jnp.bfloat16, 1), ("Conv", jnp.float32, 3)])
def test_equinox_conv_values_equal_equinoxs(name, dtype, groups, padding_mode):
    """Same parameters from the same key, the same output and gradients (every padding mode),
    positional arguments in equinox's order (padding_mode in slot 9 of Conv, 8 of ConvNd)."""
    rank = EQX_CONVS[name] or 2
    lead = () if EQX_CONVS[name] else (rank,)
    args = (*lead, 6, 12, 3, 2, 1, 1, groups, True, padding_mode, dtype)
    key = jax.random.key(3)
    ours = getattr(jaxconv.equinox, name)(*args, key=key, precision=HIGHEST)
    theirs = getattr(eqx.nn, name)(*args, key=key)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert ours.padding_mode == theirs.padding_mode == padding_mode
    x = h.random(np.random.default_rng(0), (6, *SPATIAL[rank])).astype(dtype)

    def loss(m, x):
        return jnp.sum(jnp.tanh(m(x).astype(jnp.float32)))

    with jax.default_matmul_precision("highest"):
        want, grads_t = loss(theirs, x), eqx.filter_grad(loss)(theirs, x)
    got, grads_o = loss(ours, x), eqx.filter_grad(loss)(ours, x)
    h.assert_close(got, want, dtype)
    for a, b in zip(jax.tree.leaves(grads_o), jax.tree.leaves(grads_t)):
        h.assert_close(a.astype(jnp.float32), b.astype(jnp.float32), dtype)


def test_equinox_conv_checks_and_messages_are_equinoxs():
    key = jax.random.key(0)
    for cls in (jaxconv.equinox.Conv2d, eqx.nn.Conv2d):
        with pytest.raises(ValueError, match=r"`in_channels` \(=5\) must be divisible by `groups` \(=2\)"):
            cls(5, 8, 3, groups=2, key=key)
        layer = cls(4, 8, 3, key=key)
        with pytest.raises(ValueError, match="Input to `Conv` needs to have rank 3"):
            layer(jnp.ones((2, 4, 5, 5)))  # a batched input: vmap the layer


def test_flax_conv_signature_is_nnx_convs():
    import inspect

    ours = inspect.signature(jaxconv.flax.Conv)
    theirs = inspect.signature(nnx.Conv.__init__)
    assert list(ours.parameters) == list(theirs.parameters)[1:]  # without self
    assert ours.parameters["conv_general_dilated"].default is jaxconv.conv_general_dilated
