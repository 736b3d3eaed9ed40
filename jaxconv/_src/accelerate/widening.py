"""16-bit float arithmetic in float32 under :func:`jaxconv.accelerate`: element-wise chains on
bfloat16 or float16 run in float32 and round once, where a value leaves them.

XLA:CPU computes each element-wise operation of a 16-bit float in float32 and rounds its
result back to 16 bits before the next one reads it (every ``convert`` pair stays: on the CPU
XLA does not remove them, ``--xla_allow_excess_precision`` or not). The rounding is most of the
work: ``relu(a * 1.5 + b)`` on two bfloat16 8 x 56 x 56 x 64 arrays took 0.47 ms as written,
0.31 rounded once (this module's rule), 0.11 in float32 throughout (2-core Zen 4,
CHANGELOG.md, "Earlier measurements").

The rule, the excess precision XLA's GPU compiler allows itself: an element-wise equation
whose floating operands are of one 16-bit dtype (:data:`ELEMENTWISE`) computes in float32 and
keeps its float32 result (a :class:`Wide` value) beside the 16-bit one; the next element-wise
equation reads the float32 value, and so does a ``convert_element_type`` to float32 (a
flax BatchNorm's statistics) and a sum (``reduce_sum``, summed in float32). A
``convert_element_type`` from float32 to the 16-bit dtype keeps its operand as the float32
value. Every other reader (a
convolution, a matrix product, a result of the program) reads the 16-bit value: the float32 one
rounded once; where one has, a comparison reads it too (:data:`COMPARISONS`: a ReLU's mask,
where the ReLU's ``custom_jvp`` took the rounded input; reading both widths kept two versions of
the value alive, and the MNIST CNN's bfloat16 step ran 15% slower). Likewise a sum of a value
that a convolution or a matrix product reads (:data:`PRODUCTS`: a layer's bias gradient beside
its weight and data gradients) sums its 16-bit values in float32, as torch.autocast's bias
gradient does: XLA then writes the chain's result once, in 16 bits, where it wrote it in
float32, rounded it in a second pass and summed the float32 copy (the MNIST CNN's bfloat16
step: 14.66 -> 13.81 ms, medians of 30 interleaved, 2-core Zen 4). So the values are at
least as accurate as written, and differ from them by at most the 16-bit rounding of each
chain's result. Max pools and their gradients on 16-bit
operands run on the float32 values too (:func:`pool_dtype`, :func:`run_wide`): a maximum and the values it selects
round back exactly. (ResNet's stem ReLU and max pool on bfloat16, 8 x 112 x 112 x 64, forward
and backward: 57 ms, where XLA:CPU fused the pool's gradient and the ReLU's into one loop that
rounded inside; 12.6 ms on the float32 values, 11.9 in float32.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv._src.geometry.pooling import window_problem

#: the 16-bit floats whose arithmetic runs in float32
NARROW_FLOATS = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))

#: element-wise primitives computed in float32 where their floating operands are 16-bit
ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "abs", "sign", "square",
    "integer_pow", "pow", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "log", "log1p", "expm1",
    "tanh", "logistic", "erf", "erfc", "sin", "cos", "select_n", "clamp", "copy", "copy_p",
    "eq", "ne", "lt", "le", "gt", "ge", "is_finite", "convert_element_type",
})

#: the comparisons among them, which read the 16-bit value where a reader has taken it (a
#: ReLU's mask beside its output: XLA then keeps one width of the value alive, not two)
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})

#: reductions computed in float32 where their operand is 16-bit: XLA:CPU sums a 16-bit float
#: in 16 bits (autodiff writes a ``reduce_sum`` for each broadcast it transposes: a bias's
#: gradient, BatchNorm's scale and offset): a bfloat16 128 x 28 x 28 x 32 summed over all but
#: its channels took 9.3 ms against 0.40 in float32, with an error of 171 against float32's
#: 0.92 (CHANGELOG.md, "Earlier measurements"); a maximum or minimum rounds to the
#: same value either way (rounding is monotonic)
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})

#: primitives that move a float32 value without arithmetic (fused into their readers): they
#: keep it float32 where their operand is already
_MOVES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})


class Wide:
    """A 16-bit value held as the float32 value it rounds from, each converted where first read
    (once)."""

    __slots__ = ("_wide", "dtype", "_narrow", "_widened", "product_reads")

    def __init__(self, wide: Any, dtype: np.dtype, narrow: Any = None) -> None:
        self._wide, self.dtype, self._narrow = wide, dtype, narrow
        self._widened: Any = None
        #: whether a convolution or a matrix product reads the 16-bit value (:func:`run`)
        self.product_reads = False

    @classmethod
    def of(cls, narrow: Any) -> Wide:
        """A 16-bit array as a Wide value."""
        return cls(None, np.dtype(narrow.dtype), narrow)

    @property
    def wide(self) -> Any:
        """The float32 value."""
        return self._wide if self._wide is not None else self.rounded

    @property
    def rounded(self) -> Any:
        """The 16-bit value in float32."""
        if self._widened is None:
            self._widened = lax.convert_element_type(self.narrow, np.float32)
        return self._widened

    @property
    def stored(self) -> bool:
        """Whether the value is a 16-bit array as it is (:meth:`of`): no float32 computation
        produced it."""
        return self._wide is None

    @property
    def taken(self) -> bool:
        """Whether a reader has taken the 16-bit value."""
        return self._narrow is not None

    @property
    def narrow(self) -> Any:
        """The 16-bit value: the float32 one rounded."""
        if self._narrow is None:
            self._narrow = lax.convert_element_type(self._wide, self.dtype)
        return self._narrow


def narrow(value: Any) -> Any:
    """``value`` as the program wrote it (a :class:`Wide` value's 16-bit value)."""
    return value.narrow if isinstance(value, Wide) else value


def widened(value: Any) -> Any:
    """``value`` as a :class:`Wide` value where it is a 16-bit float array, else as it is (the
    caller keeps it, so that each array is converted to float32 once)."""
    if not isinstance(value, Wide) and _dtype(value) in NARROW_FLOATS:
        return Wide.of(value)
    return value


def float32(value: Any) -> Any:
    """``value`` in float32 where it is a 16-bit float (a :class:`Wide` value's float32 one),
    else as it is."""
    value = widened(value)
    return value.wide if isinstance(value, Wide) else value


def _dtype(value: Any) -> np.dtype | None:
    if isinstance(value, Wide):
        return value.dtype
    dtype = getattr(value, "dtype", None)
    return None if dtype is None else np.dtype(dtype)


def narrow_dtype(eqn: Any, invals: Sequence[Any]) -> np.dtype | None:
    """The 16-bit dtype ``eqn`` computes in float32 instead, or None where it runs as written."""
    name = eqn.primitive.name
    if name in _MOVES:
        return invals[0].dtype if isinstance(invals[0], Wide) else None
    if name not in ELEMENTWISE and name not in REDUCTIONS:
        return None
    if name == "convert_element_type":
        src = _dtype(invals[0])
        dst: np.dtype = np.dtype(eqn.params["new_dtype"])
        if src in NARROW_FLOATS and dst in (np.float32, src):  # to float32, or a weak type's
            return src if isinstance(invals[0], Wide) else None
        if src == np.float32 and dst in NARROW_FLOATS:
            return dst
        return None
    floats = {d for d in map(_dtype, invals)
              if d is not None and jnp.issubdtype(d, jnp.floating)}
    if len(floats) != 1 or not floats <= set(NARROW_FLOATS):
        return None
    (dtype,) = floats
    outs = {np.dtype(v.aval.dtype) for v in eqn.outvars}
    return dtype if outs <= {dtype, np.dtype(np.bool_)} else None


def targets(eqn: Any) -> bool:
    """Whether ``eqn`` is arithmetic that may read a 16-bit float (:func:`narrow_dtype` decides
    on the values)."""
    name = eqn.primitive.name
    return ((name in ELEMENTWISE or name in REDUCTIONS)
            and any(getattr(v.aval, "dtype", None) in NARROW_FLOATS for v in eqn.invars))


def run(eqn: Any, invals: Sequence[Any], dtype: np.dtype, bind: Any) -> list[Any]:
    """``eqn`` computed in float32 on ``invals`` (its 16-bit floats read as float32): its
    16-bit results as :class:`Wide` values. ``bind(eqn, values, params)`` binds it."""
    if eqn.primitive.name == "convert_element_type":
        src, dst = invals[0], np.dtype(eqn.params["new_dtype"])
        if isinstance(src, Wide):  # to float32: the value it rounds from; to its own dtype: it
            return [src.wide if dst == np.float32 else src]
        return [Wide(src, dtype)]  # float32 to 16 bits: kept as it is
    if eqn.primitive.name in COMPARISONS:  # read as written where the 16-bit value is taken
        invals = [v.rounded if isinstance(v, Wide) and v.taken else v for v in invals]
    if eqn.primitive.name == "reduce_sum":  # the 16-bit value where a product reads it
        invals = [v.rounded if isinstance(v, Wide) and v.product_reads else v for v in invals]
    outs = bind(eqn, [float32(v) for v in invals])
    outs = outs if eqn.primitive.multiple_results else [outs]
    return [Wide(o, dtype) if np.dtype(v.aval.dtype) == dtype else o
            for o, v in zip(outs, eqn.outvars)]


#: the max pool family: on 16-bit operands, computed on the float32 values where jaxconv's pool
#: computes it (``geometry.pooling.window_problem``)
POOLS = frozenset({"reduce_window_max", "select_and_scatter_add", "select_and_gather_add"})


def run_wide(eqn: Any, invals: Sequence[Any], bind: Any) -> list[Any] | None:
    """``eqn`` in the widening pass: its results where it computes in float32 (16-bit
    arithmetic: :func:`run`; a max pool of 16-bit operands jaxconv's pool takes, on the
    float32 values: :func:`pool_dtype`), else None (it runs as written)."""
    dtype = narrow_dtype(eqn, invals)
    if dtype is not None:
        return run(eqn, invals, dtype, bind)
    if eqn.primitive.name in POOLS:
        pooled = pool_dtype(eqn, invals)
        if pooled is not None and _takes_pool(eqn):
            outs = bind(eqn, [float32(v) for v in invals])
            return [Wide(outs, pooled)]
    return None


def _takes_pool(eqn: Any) -> bool:
    if eqn.primitive.name != "reduce_window_max" and eqn.params["select_prim"] is not lax.ge_p:
        return False
    return not isinstance(window_problem(eqn.params, eqn.invars[-1].aval), str)


def pool_dtype(eqn: Any, invals: Sequence[Any]) -> np.dtype | None:
    """The 16-bit dtype of a max pool's operands, which it computes on in float32 (a maximum
    and the values it selects are exact in either), or None."""
    dtypes = {_dtype(v) for v in invals}
    if len(dtypes) != 1:
        return None
    (dtype,) = dtypes
    return dtype if dtype in NARROW_FLOATS else None
