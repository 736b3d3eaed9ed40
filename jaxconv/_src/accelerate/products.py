"""Matrix products: bfloat16 ones on oneDNN's matmul, and those whose result a ``transpose``
reads computed in the transposed layout.

A 2D ``dot_general`` of bfloat16 matrices (a dense layer's forward, its data gradient and its
kernel gradient in a mixed-precision step) binds ``jaxconv_matmul`` (``jaxconv/_src/matmul.py``),
which runs on oneDNN's bfloat16 matmul where oneDNN computes bfloat16 natively; XLA:CPU
computes it in float32 (:func:`product`).

Autodiff writes the gradient of a dense layer's kernel (``y = x W``, ``x``: batch x in) as
``transpose(dot_general(dy, x))``: the product ``dy^T x`` (out x in), then a transpose into the
kernel's layout (in x out). ``(dy^T x)^T = x^T dy``, so the pair is one ``dot_general(x, dy)``
with the operands (and their contracting dims) swapped. XLA:CPU folds such a transpose into the
product only where nothing stands between them; in a mixed-precision step the bfloat16
rounding of the product does, and the transpose ran as a strided loop fused into the optimizer's
update: 11.4 ms a step for ResNet-50's 2048 x 1000 classifier, against 1.0 ms for the swapped
product and the update alone (docs/performance.md, "bfloat16 (mixed precision)").

A product qualifies where it has no batch dims and each operand one free dim (a 2D result),
and the transpose swaps the result's two axes. The swapped product takes the same precision
(swapped too where it names one per operand) and the same preferred element type; its
summation order is the library's, so the result may differ from the pair's in the last bit
of each product's rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import Literal

from jaxconv._src import lowering, matmul


def products(eqns: Sequence[Any]) -> dict[Any, Any]:
    """The variables that 2D ``dot_general`` equations among ``eqns`` define (no batch dims,
    one free dim on each side): their equation."""
    out = {}
    for e in eqns:
        if e.primitive.name != "dot_general":
            continue
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        lhs, rhs = (v.aval for v in e.invars)
        if not lb and not rb and lhs.ndim - len(lc) == 1 and rhs.ndim - len(rc) == 1:
            out[e.outvars[0]] = e
    return out


def product_before_transpose(eqn: Any, products: dict[Any, Any]) -> Any | None:
    """The ``dot_general`` equation (of :func:`products`) whose result ``eqn`` transposes,
    where ``eqn`` swaps the two axes of such a result; else None."""
    if eqn.primitive.name != "transpose" or tuple(eqn.params["permutation"]) != (1, 0):
        return None
    operand = eqn.invars[0]
    return None if isinstance(operand, Literal) else products.get(operand)


def swapped(product: Any, lhs: Any, rhs: Any) -> Any:
    """``transpose(dot_general(lhs, rhs))`` of the ``dot_general`` equation ``product``, as
    ``dot_general(rhs, lhs)``."""
    (lc, rc), _ = product.params["dimension_numbers"]
    precision = product.params["precision"]
    if isinstance(precision, tuple):
        precision = precision[::-1]
    params = dict(product.params, dimension_numbers=((tuple(rc), tuple(lc)), ((), ())),
                  precision=precision)
    out = onednn_product(params, rhs, lhs)
    if not isinstance(out, str):
        return out
    return product.primitive.bind(rhs, lhs, **product.primitive.get_bind_params(params))


def onednn_product(params: dict[str, Any], lhs: Any, rhs: Any) -> Any:
    """``dot_general(lhs, rhs, **params)`` on oneDNN's matmul (:func:`matmul.matmul`), or why
    it runs as written (a string: the chooser's ``product_why_not``). The precision is a float32 one's
    concern: bfloat16 products are exact in oneDNN's float32 sums."""
    dims, preferred = params["dimension_numbers"], params.get("preferred_element_type")
    why = lowering.product_why_not(jax.typeof(lhs), jax.typeof(rhs), dims, preferred)
    if why is not None:
        return why
    (lc, rc), _ = dims
    return matmul.matmul(lhs, rhs, (lc[0], rc[0]), preferred)


def takes(eqn: Any) -> bool:
    """Whether ``eqn`` is a ``dot_general`` that :func:`onednn_product` runs on oneDNN."""
    if eqn.primitive.name != "dot_general":
        return False
    lhs, rhs = (v.aval for v in eqn.invars)
    return lowering.product_why_not(lhs, rhs, eqn.params["dimension_numbers"],
                                    eqn.params.get("preferred_element_type")) is None
