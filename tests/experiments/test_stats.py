"""Summary statistics of the experiments: mean ± std, Cohen's d, COV."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.experiments.stats import (
    coefficient_of_variation,
    cohens_d,
    fmt_d,
    fmt_mean_std,
    mean_std,
)

values = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=8)


def test_cohens_d_known_value():
    # means 3 and 1, both sample variances 1 -> pooled std 1 -> d = 2
    assert cohens_d([2, 3, 4], [0, 1, 2]) == pytest.approx(2.0)


def test_cohens_d_zero_spread_gives_signed_infinity_or_zero():
    assert cohens_d([1, 1], [0, 0]) == math.inf
    assert cohens_d([0, 0], [1, 1]) == -math.inf
    assert cohens_d([1, 1], [1, 1]) == 0.0


def test_cohens_d_needs_three_values():
    with pytest.raises(ValueError, match="three"):
        cohens_d([1.0], [2.0])
    with pytest.raises(ValueError, match="finite"):
        cohens_d([1.0, float("nan")], [2.0])


@settings(max_examples=60, deadline=None)
@given(values, values, st.floats(-100, 100), st.floats(0.1, 100))
def test_cohens_d_is_antisymmetric_and_affine_invariant(a, b, shift, scale):
    d = cohens_d(a, b)
    assert cohens_d(b, a) == pytest.approx(-d, rel=1e-9, abs=1e-9) or (
        math.isinf(d) and cohens_d(b, a) == -d)
    if math.isfinite(d) and np.std(a + b) > 1e-3:
        moved = cohens_d([scale * x + shift for x in a], [scale * x + shift for x in b])
        assert moved == pytest.approx(d, rel=1e-6, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=10))
def test_mean_std_matches_numpy(xs):
    mu, sd = mean_std(xs)
    assert mu == pytest.approx(float(np.mean(xs)), abs=1e-9)
    expected = float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0
    assert sd == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_cov_and_formatting():
    assert coefficient_of_variation([1.0, 1.0, 1.0]) == 0.0
    assert coefficient_of_variation([1.0, 3.0]) == pytest.approx(0.5)
    assert coefficient_of_variation([2.0]) == 0.0
    assert fmt_mean_std(0.8312, 0.0105) == "83.12 ± 1.05"
    assert fmt_d(math.inf) == "+inf" and fmt_d(-0.5) == "-0.50"
    with pytest.raises(ValueError):
        mean_std([])
