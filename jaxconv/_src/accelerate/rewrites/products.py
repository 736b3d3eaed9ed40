"""The product rewrites: bfloat16 and float32 ones on the handler's products, and those whose
result a ``transpose`` reads computed in the transposed layout.

A 2D ``dot_general`` of bfloat16 matrices (a dense layer's forward, its data gradient and its
kernel gradient in a mixed-precision step) binds ``jaxconv_matmul`` (``jaxconv/_src/matmul.py``),
which runs on oneDNN's bfloat16 matmul where oneDNN computes bfloat16 natively; XLA:CPU
computes it in float32. One of float32 matrices binds it where the handler's product (oneDNN's
sgemm in parts on XLA's pool) timed faster than XLA's on this machine (the chooser's
``product_why_not``): a served model's dense layer, which XLA:CPU runs on one thread
(:class:`Product`).

Autodiff writes the gradient of a dense layer's kernel (``y = x W``, ``x``: batch x in) as
``transpose(dot_general(dy, x))``: the product ``dy^T x`` (out x in), then a transpose into the
kernel's layout (in x out). ``(dy^T x)^T = x^T dy``, so the pair is one ``dot_general(x, dy)``
with the operands (and their contracting dims) swapped. XLA:CPU folds such a transpose into the
product only where nothing stands between them; in a mixed-precision step the bfloat16
rounding of the product does, and the transpose ran as a strided loop fused into the optimizer's
update: 11.4 ms a step for ResNet-50's 2048 x 1000 classifier, against 1.0 ms for the swapped
product and the update alone (CHANGELOG.md, "Earlier measurements").

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
from jaxconv._src.accelerate.rewrites.base import Match, Rewrite, Scope


def product_before_transpose(eqn: Any, products: dict[Any, Any]) -> Any | None:
    """The ``dot_general`` equation (of ``Analysis.products``) whose result ``eqn`` transposes,
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


def why_not(eqn: Any) -> str | None:
    """Why the ``dot_general`` equation ``eqn`` is no product oneDNN's matmul computes here (the
    chooser's ``product_why_not``), or None."""
    lhs, rhs = (v.aval for v in eqn.invars)
    return lowering.product_why_not(lhs, rhs, eqn.params["dimension_numbers"],
                                    eqn.params.get("preferred_element_type"))


class Product(Rewrite):
    """A ``dot_general`` of two bfloat16 matrices on oneDNN's bfloat16 matmul, where oneDNN
    computes bfloat16 natively, or of two float32 ones on the handler's product where it timed
    faster (:func:`onednn_product`)."""

    name = "product"
    primitives = frozenset({"dot_general"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        if why_not(eqn) is not None:
            return "product"
        return Match(self, eqn, tuple(eqn.invars), label="oneDNN's matmul")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        out = onednn_product(match.eqn.params, *values)
        assert not isinstance(out, str), out  # match asked the chooser the same
        return [out]


class TransposedProduct(Rewrite):
    """A ``transpose`` of a 2D product's result as the product with its operands swapped
    (:func:`swapped`)."""

    name = "transposed product"
    primitives = frozenset({"transpose"})

    def match(self, eqn: Any, scope: Scope) -> Match | str:
        product = product_before_transpose(eqn, scope.analysis.products)
        if product is None:
            return "no product"
        return Match(self, eqn, tuple(product.invars), product, "one product, operands swapped")

    def emit(self, match: Match, values: Sequence[Any], scope: Scope) -> list[Any]:
        return [swapped(match.detail, *values)]
