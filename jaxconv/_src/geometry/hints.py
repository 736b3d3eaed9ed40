"""Suggestions for errors a layout mix-up explains.

A PyTorch ConvTranspose weight passed without ``filter_format``, or NCX data
without ``data_format``, fails a channel or shape check whose numbers come from
the misread layout. When the same shapes validate under other formats, the
error says which, so that the fix is in the message.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from jaxconv._src.geometry.layouts import DATA_FORMATS
from jaxconv._src.geometry.problem import ConvProblem, Names


def with_layout_hint(build: Callable[..., ConvProblem], names: Names,
                     filter_formats: Sequence[str], **kwargs: Any) -> ConvProblem:
    """``build(**kwargs)``; a ValueError it raises names the formats the shapes fit.

    Only for ops whose caller chooses ``data_format`` and the filter format
    (``names.layout_arguments``). The other formats are tried only after an
    error.
    """
    try:
        return build(**kwargs)
    except ValueError as error:
        if not names.layout_arguments:
            raise
        fits = _fitting_formats(build, filter_formats, kwargs)
        if not fits:
            raise
        given = _given(kwargs)
        choices = " or ".join(_changes(names, given, fit) for fit in fits[:3])
        one = len(fits) == 1 and sum(a != b for a, b in zip(fits[0], given)) == 1
        raise ValueError(f"{error}; these shapes match {choices}: pass "
                         f"{'it' if one else 'them'}") from None


def _given(kwargs: dict[str, Any]) -> tuple[str, str]:
    return str(kwargs["data_format"]).upper(), str(kwargs["filter_format"]).upper()


def _changes(names: Names, given: tuple[str, str], fit: tuple[str, str]) -> str:
    """The arguments that differ from the call's, as keyword arguments."""
    return ", ".join(f"{name}={new!r}" for name, old, new in
                     zip(("data_format", names.w_format), given, fit) if old != new)


def _fitting_formats(build: Callable[..., ConvProblem], filter_formats: Sequence[str],
                     kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    given = _given(kwargs)
    fits = []
    for df, ff in itertools.product(DATA_FORMATS, filter_formats):
        if (df, ff) == given:
            continue
        try:
            build(**dict(kwargs, data_format=df, filter_format=ff))
        except (ValueError, TypeError):
            continue
        fits.append((df, ff))
    # the fewest changed arguments first: a data_format alone, or a filter format alone
    return sorted(fits, key=lambda f: (f[0] != given[0]) + (f[1] != given[1]))
