"""Bounds for comparing jaxconv's results with a reference: one table per dtype."""

from jaxconv._src.testing import (
    CHECK_GRADS_TOLERANCE,
    TOLERANCE,
    assert_close,
    check_grads,
    relative_error,
    tolerance,
)

__all__ = ["CHECK_GRADS_TOLERANCE", "TOLERANCE", "assert_close", "check_grads",
           "relative_error", "tolerance"]
