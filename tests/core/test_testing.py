"""jaxconv.testing's own checks: the bound each dtype's results are held to."""

import numpy as np
import pytest

import jaxconv.testing


def test_assert_close_holds_within_the_bound_and_fails_beyond_it():
    ref = np.linspace(-2.0, 2.0, 9)
    jaxconv.testing.assert_close(ref + 1e-6, ref, np.float32)
    with pytest.raises(AssertionError, match="relative error"):
        jaxconv.testing.assert_close(ref + 1e-3, ref, np.float32)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["got", "ref"])
def test_assert_close_fails_on_a_nan_or_infinity(bad, where):
    ref = np.linspace(-2.0, 2.0, 9)
    spoiled = ref.copy()
    spoiled[4] = bad
    got, want = (spoiled, ref) if where == "got" else (ref, spoiled)
    with pytest.raises(AssertionError, match="relative error"):
        jaxconv.testing.assert_close(got, want, np.float32)


def test_the_same_infinities_at_the_same_places_agree():
    ref = np.array([1.0, np.inf, -np.inf, 2.0])
    jaxconv.testing.assert_close(ref.copy(), ref, np.float32)
    with pytest.raises(AssertionError, match="relative error"):
        jaxconv.testing.assert_close(-ref, ref, np.float32)
