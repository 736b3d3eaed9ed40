"""jaxconv.equinox.ConvTranspose{,1d,2d,3d}: equinox's arguments, fields and checks, PyTorch's weight.

The classes derive from ``eqx.nn.ConvTranspose*``: the same signature (plus keyword-only
``precision`` and ``lowering``) and fields (tests/layers/test_layers.py checks both for every equinox
class), padding rules and messages. Their weight is PyTorch's
``(in, out // groups, *K)``; equinox's is the flipped forward weight ``(out, in // groups, *K)``,
so the values are compared with equinox's layer holding the converted weight (and with torch
in tests/layers/test_layers.py).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv.equinox
from tests.support import helpers as h

HIGHEST = lax.Precision.HIGHEST
RANKS = {"ConvTranspose": None, "ConvTranspose1d": 1, "ConvTranspose2d": 2, "ConvTranspose3d": 3}
SPATIAL = {1: (7,), 2: (5, 4), 3: (4, 3, 4)}


def _to_equinox_weight(w: jax.Array, groups: int) -> jax.Array:
    """PyTorch's (in, out/g, *K) -> equinox's (out, in/g, *K), spatially flipped (per group)."""
    cin, ocg, *k = w.shape
    wg = w.reshape(groups, cin // groups, ocg, *k).swapaxes(1, 2)
    return jnp.flip(wg.reshape(groups * ocg, cin // groups, *k), tuple(range(2, 2 + len(k))))


# Each padding form equinox reads (ints, pairs, 'VALID', 'SAME', 'SAME_LOWER'; modes ZEROS and
# CIRCULAR) once, the classes, dtypes and groups spread over them (every class twice):
# (class, dtype, groups, padding, padding_mode, output_padding, stride, kernel)
CASES = [
    ("ConvTranspose2d", jnp.float32, 2, 1, "ZEROS", 1, 2, 3),
    ("ConvTranspose1d", jnp.float32, 1, 0, "ZEROS", 2, 3, 2),
    ("ConvTranspose", jnp.float32, 3, "VALID", "ZEROS", 0, 2, 3),
    ("ConvTranspose3d", jnp.bfloat16, 1, "SAME", "ZEROS", 1, 2, 3),
    ("ConvTranspose2d", jnp.float32, 1, "SAME_LOWER", "ZEROS", 0, 3, 2),
    ("ConvTranspose1d", jnp.bfloat16, 2, "SAME", "CIRCULAR", 0, 2, 3),
    ("ConvTranspose", jnp.float32, 1, "SAME_LOWER", "CIRCULAR", 0, 1, 4),
    ("ConvTranspose3d", jnp.float32, 3, "pairs", "ZEROS", 1, 2, 2),
]


@pytest.mark.parametrize("name,dtype,groups,padding,mode,out_pad,stride,k", CASES,
                         ids=[f"{c[0]}-{c[3]}-{c[4]}-g{c[2]}" for c in CASES])
def test_values_and_gradients_equal_equinoxs(name, dtype, groups, padding, mode, out_pad, stride,
                                             k):
    """Positional arguments in each class's own order (ConvTranspose: padding, output_padding;
    ConvTranspose{1,2,3}d: output_padding, padding)."""
    rank = RANKS[name] or 2
    if padding == "pairs":
        padding = ((2, 0),) + ((0, 1),) * (rank - 1)
    pads = (out_pad, padding) if RANKS[name] else (padding, out_pad)
    lead = () if RANKS[name] else (rank,)
    args = (*lead, 6, 12, k, stride, *pads, 1, groups, True, mode, dtype)
    key = jax.random.key(3)
    ours = getattr(jaxconv.equinox, name)(*args, key=key, precision=HIGHEST)
    theirs = getattr(eqx.nn, name)(*args, key=key)
    assert ours.weight.shape == (6, 12 // groups, *(k,) * rank) and ours.weight.dtype == dtype
    for field in ("padding", "output_padding", "stride", "padding_mode", "use_bias"):
        assert getattr(ours, field) == getattr(theirs, field)
    theirs = eqx.tree_at(lambda m: m.weight, theirs, _to_equinox_weight(ours.weight, groups))
    theirs = eqx.tree_at(lambda m: m.bias, theirs, ours.bias)
    x = h.random(np.random.default_rng(0), (6, *SPATIAL[rank])).astype(dtype)

    @eqx.filter_jit
    def loss(m, x):
        return jnp.sum(jnp.tanh(m(x).astype(jnp.float32)))

    with jax.default_matmul_precision("highest"):
        want = loss(theirs, x)
        gm_t = eqx.filter_grad(loss)(theirs, x)
        gx_t = jax.grad(lambda x: loss(theirs, x))(x)
    assert ours(x).shape == theirs(x).shape
    h.assert_close(loss(ours, x), want, dtype)
    gm_o = eqx.filter_grad(loss)(ours, x)
    h.assert_close(_to_equinox_weight(gm_o.weight, groups).astype(jnp.float32),
                   gm_t.weight.astype(jnp.float32), dtype)
    h.assert_close(gm_o.bias.astype(jnp.float32), gm_t.bias.astype(jnp.float32), dtype)
    h.assert_close(jax.grad(lambda x: loss(ours, x))(x).astype(jnp.float32),
                   gx_t.astype(jnp.float32), dtype)
    assert h.lax_convolutions(lambda m: eqx.filter_grad(loss)(m, x), ours) == 0


def test_pytorch_initialisation_from_the_key():
    """Uniform in +-1/sqrt(out/groups * prod(K)) in PyTorch's layout, as torch initialises."""
    layer = jaxconv.equinox.ConvTranspose2d(4, 6, 3, groups=2, key=jax.random.key(0))
    lim = 1 / np.sqrt(6 // 2 * 9)
    assert layer.weight.shape == (4, 3, 3, 3) and layer.bias.shape == (6, 1, 1)
    assert float(jnp.max(jnp.abs(layer.weight))) <= lim
    assert float(jnp.max(jnp.abs(layer.weight))) > 0.8 * lim  # spread over the whole range


def test_checks_and_messages_are_equinoxs():
    key = jax.random.key(0)
    for cls in (jaxconv.equinox.ConvTranspose2d, eqx.nn.ConvTranspose2d):
        with pytest.raises(ValueError, match=r"Must have `output_padding < stride`"):
            cls(4, 8, 3, stride=2, output_padding=2, key=key)
        with pytest.raises(NotImplementedError, match="'REFLECT' or 'REPLICATE'"):
            cls(4, 8, 3, padding_mode="REFLECT", key=key)
        with pytest.raises(NotImplementedError, match="only implemented for 'SAME'"):
            cls(4, 8, 3, padding=1, padding_mode="CIRCULAR", key=key)
        layer = cls(4, 8, 3, key=key)
        with pytest.raises(ValueError, match="Input to `ConvTranspose` needs to have rank 3"):
            layer(jnp.ones((2, 4, 5, 5)))  # a batched input: vmap the layer


@pytest.mark.parametrize("spatial,padding", [((0, 5), 0), ((2, 5), ((3, 2), (0, 0))),
                                            ((2, 5), ((3, 3), (0, 0)))],
                         ids=["input-axis-0", "output-0", "negative-output"])
def test_empty_problems_are_equinoxs(spatial, padding):
    """Zero-size inputs and outputs give equinox's (lax's) shape and zeros, plus the bias."""
    key = jax.random.key(1)
    ours = jaxconv.equinox.ConvTranspose2d(4, 6, 3, 2, 0, padding, key=key)
    theirs = eqx.nn.ConvTranspose2d(4, 6, 3, 2, 0, padding, key=key)
    theirs = eqx.tree_at(lambda m: (m.weight, m.bias), theirs,
                         (_to_equinox_weight(ours.weight, 1), ours.bias))
    x = jnp.ones((4, *spatial))
    h.assert_close(ours(x), theirs(x), jnp.float32)
    grad = jax.grad(lambda m: jnp.sum(m(x)))(ours)
    h.assert_close(grad.weight, jnp.zeros_like(ours.weight), jnp.float32)
