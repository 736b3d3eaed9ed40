"""jaxconv.max_pool against lax.reduce_window (values and XLA's select_and_scatter gradient)
and PyTorch's max_pool2d backward, under every transform (its argument errors:
``tests/ops/test_pooling_errors.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxconv
from tests.support.helpers import TOLERANCE

# (shape, window, strides, padding, data_format)
CASES = [
    ((2, 9, 10, 3), (3, 3), (2, 2), ((1, 1), (1, 1)), "NXC"),  # ResNet's stem pool
    ((2, 3, 9, 10), (3, 2), (2, 3), "SAME", "NCX"),
    ((2, 7, 3), (2,), (2,), "VALID", "NXC"),
    ((1, 5, 6, 7, 2), (2, 3, 2), (1, 2, 2), ((0, 1), (1, 1), (0, 0)), "NXC"),
    ((2, 8, 8, 4), (1, 1), (2, 2), "VALID", "NXC"),  # a stride past the window: empty phases
    ((2, 8, 8, 4), (3, 3), (1, 1), "SAME", "NXC"),
    ((1, 2, 6, 5), (4, 4), (3, 2), ((2, 3), (3, 0)), "NCX"),  # pads up to a window's length
]
IDS = [f"{fmt}-{len(w)}d-w{'x'.join(map(str, w))}-s{'x'.join(map(str, s))}-"
       f"{pad if isinstance(pad, str) else 'explicit'}" for _, w, s, pad, fmt in CASES]


def _reference(x, window, strides, padding, fmt):
    """lax.reduce_window max, as flax.linen.max_pool calls it."""
    win = (1, *window, 1) if fmt == "NXC" else (1, 1, *window)
    step = (1, *strides, 1) if fmt == "NXC" else (1, 1, *strides)
    if not isinstance(padding, str):
        none = ((0, 0),)
        padding = none + tuple(padding) + none if fmt == "NXC" else none * 2 + tuple(padding)
    return lax.reduce_window(x, -jnp.inf, lax.max, win, step, padding)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,window,strides,padding,fmt", CASES, ids=IDS)
def test_values_and_derivatives_equal_lax_reduce_window(shape, window, strides, padding, fmt,
                                                        dtype):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    ours = jax.jit(lambda x: jaxconv.max_pool(x, window, strides, padding, data_format=fmt))
    ref = jax.jit(lambda x: _reference(x, window, strides, padding, fmt))
    y, vjp = jax.vjp(ours, x)
    y_ref, vjp_ref = jax.vjp(ref, x)
    assert y.dtype == x.dtype and y.shape == y_ref.shape
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
    ct = jnp.asarray(rng.standard_normal(y.shape), dtype)
    tol = TOLERANCE[dtype]
    # the same window's first maximum gets each cotangent; sums of overlapping windows' shares
    # may add in another order
    np.testing.assert_allclose(np.asarray(vjp(ct)[0], np.float32),
                               np.asarray(vjp_ref(ct)[0], np.float32), rtol=tol, atol=tol)
    t = jnp.asarray(rng.standard_normal(shape), dtype)
    np.testing.assert_array_equal(np.asarray(jax.jvp(ours, (x,), (t,))[1], np.float32),
                                  np.asarray(jax.jvp(ref, (x,), (t,))[1], np.float32))


@pytest.mark.parametrize("shape,window,strides,padding,fmt", CASES[:3], ids=IDS[:3])
def test_vmap_second_order_and_check_grads(shape, window, strides, padding, fmt):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    t = jnp.asarray(rng.standard_normal(shape), jnp.float32)

    def cube(pool):
        return lambda x: (pool(x) ** 3).sum()
    ours = cube(lambda x: jaxconv.max_pool(x, window, strides, padding, data_format=fmt))
    ref = cube(lambda x: _reference(x, window, strides, padding, fmt))
    xs = jnp.stack([x, 2 * x, -x])
    tol = TOLERANCE["float32"]
    np.testing.assert_allclose(jax.vmap(jax.grad(ours))(xs), jax.vmap(jax.grad(ref))(xs),
                               rtol=tol, atol=tol)
    # forward over reverse (a Hessian-vector product) and reverse over reverse
    np.testing.assert_allclose(jax.jvp(jax.grad(ours), (x,), (t,))[1],
                               jax.jvp(jax.grad(ref), (x,), (t,))[1], rtol=tol, atol=tol)
    np.testing.assert_allclose(jax.grad(lambda x: (jax.grad(ours)(x) ** 2).sum())(x),
                               jax.grad(lambda x: (jax.grad(ref)(x) ** 2).sum())(x),
                               rtol=tol, atol=tol)
    check_grads(lambda x: jaxconv.max_pool(x, window, strides, padding, data_format=fmt), (x,),
                order=2, modes=("fwd", "rev"), eps=1e-3, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("layout", ["NCX", "NXC"])
def test_gradient_equals_torch_max_pool2d(layout):
    check_against_torch_max_pool2d(layout, seed=2)


def check_against_torch_max_pool2d(layout, seed):
    """ResNet's stem pool (3x3, stride 2, pads 1) and its gradient against torch's
    ``max_pool2d`` (``test_pooling_handler.py`` runs it on the handler too)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 11, 9)).astype(np.float32)  # NCHW
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.max_pool2d(xt, (3, 3), (2, 2), (1, 1))
    ct = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(ct))
    if layout == "NXC":
        x_in, ct_in = x.transpose(0, 2, 3, 1), ct.transpose(0, 2, 3, 1)
    else:
        x_in, ct_in = x, ct
    y, vjp = jax.vjp(lambda x: jaxconv.max_pool(x, 3, 2, ((1, 1), (1, 1)), data_format=layout),
                     jnp.asarray(x_in))
    dx = np.asarray(vjp(jnp.asarray(ct_in))[0])
    y = np.asarray(y)
    if layout == "NXC":
        dx, y = dx.transpose(0, 3, 1, 2), y.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    tol = TOLERANCE["float32"]
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=tol, atol=tol)


def test_ties_go_to_the_first_maximum():
    x = jnp.zeros((1, 4, 4, 1))
    dx = jax.grad(lambda x: jaxconv.max_pool(x, 2, 2).sum())(x)
    ref = jax.grad(lambda x: _reference(x, (2, 2), (2, 2), "VALID", "NXC").sum())(x)
    np.testing.assert_array_equal(dx, ref)
    assert float(dx[0, 0, 0, 0]) == 1.0 and float(dx.sum()) == 4.0


@pytest.mark.parametrize("shape,window,strides,padding,fmt", CASES, ids=IDS)
def test_pool_pads_its_taps_not_its_input(shape, window, strides, padding, fmt):
    """Each tap is a slice of x padded where its windows read the padding (XLA fuses those
    small pads into the loop over the taps); a pad of the whole input would be a pass of its
    own. The forward and its tangent (each window's first maximal tap, then its tangent)
    alike."""
    x = jnp.zeros(shape, jnp.float32)
    whole = "tensor<" + "x".join(map(str, shape)) + "xf32>"

    def pool(x):
        return jaxconv.max_pool(x, window, strides, padding, data_format=fmt)
    for fn in (pool, lambda x: jax.jvp(pool, (x,), (x,))[1]):
        text = jax.jit(fn).lower(x).as_text()
        pads = [line for line in text.splitlines() if "stablehlo.pad" in line]
        assert not any(f"({whole}," in line for line in pads), pads


@pytest.mark.parametrize("shape,window,strides,padding,fmt", CASES, ids=IDS)
def test_the_gradient_reads_each_windows_argmax_from_memory(shape, window, strides, padding,
                                                              fmt):
    """The VJP's scatter reads the windows' argmax (int8) through an optimization barrier: a
    value in memory, computed once. Fused into the scatter's loop, XLA computed its chain of
    compares again for every tap that reads it (jax 0.11's XLA:CPU: ResNet's stem pool, forward
    and backward, 9.0 ms against 5.6 held apart; 2-core Xeon)."""
    x = jnp.zeros(shape, jnp.float32)

    def step(x):
        y, vjp = jax.vjp(lambda x: jaxconv.max_pool(x, window, strides, padding,
                                                    data_format=fmt), x)
        return vjp(y)[0]
    text = jax.jit(step).lower(x).as_text()
    barriers = [line for line in text.splitlines() if "stablehlo.optimization_barrier" in line]
    assert len(barriers) == 1 and "xi8>" in barriers[0], barriers
