"""The differentially private label histogram (Laplace noise, clipping, rounding, minimum
count) and its error bound P(|noise| > t) = exp(−t·ε)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedcure_app.core.privacy import private_histogram

count_arrays = arrays(np.int64, st.tuples(st.integers(1, 4), st.integers(1, 12)),
                      elements=st.integers(0, 10_000))
epsilons = st.one_of(st.just(math.inf), st.floats(0.01, 100.0))


@settings(max_examples=80, deadline=None)
@given(count_arrays, epsilons, st.integers(0, 50), st.integers(0, 2**32 - 1))
def test_release_is_non_negative_integers_of_the_same_shape(counts, eps, min_count, seed):
    out = private_histogram(counts, eps, min_count, np.random.default_rng(seed))
    assert out.shape == counts.shape and out.dtype == np.int64
    assert (out >= 0).all()
    assert ((out == 0) | (out >= min_count)).all()  # below the minimum: reported as zero


@settings(max_examples=80, deadline=None)
@given(count_arrays, st.integers(0, 50))
def test_infinite_epsilon_is_the_identity_but_for_the_minimum_count(counts, min_count):
    out = private_histogram(counts, math.inf, min_count)
    assert np.array_equal(out, np.where(counts >= min_count, counts, 0))


def test_noise_is_seeded_and_present():
    counts = np.full(200, 50)
    a = private_histogram(counts, 1.0, rng=np.random.default_rng(3))
    b = private_histogram(counts, 1.0, rng=np.random.default_rng(3))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, counts)


def test_small_noisy_counts_clip_at_zero_rather_than_go_negative():
    out = private_histogram(np.zeros(5000, dtype=np.int64), 0.5,
                            rng=np.random.default_rng(0))
    assert out.min() == 0
    assert 0.2 < (out > 0).mean() < 0.5  # P(noise >= 0.5) = exp(-0.25)/2 ≈ 0.39


@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0])
def test_empirical_error_matches_the_laplace_bound(eps):
    """With no clipping (large counts), |release − count| > t (t whole) happens exactly when
    |noise| ≥ t + 1/2: probability exp(−(t + 1/2)·ε) ≤ exp(−t·ε), the documented
    bound."""
    n = 40_000
    counts = np.full(n, 100_000, dtype=np.int64)
    err = np.abs(private_histogram(counts, eps, rng=np.random.default_rng(7)) - counts)
    for t in (0, 1, 2, 5, 20, 50):
        p = math.exp(-(t + 0.5) * eps)
        if p < 1e-3:
            continue
        freq = float((err > t).mean())
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(freq - p) < 5 * sigma + 1e-4, (t, freq, p)
        assert freq <= math.exp(-t * eps) + 5 * sigma


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_epsilon_must_be_positive(bad):
    with pytest.raises(ValueError, match="epsilon"):
        private_histogram(np.ones(3), bad)


def test_negative_counts_and_minimum_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        private_histogram(np.array([1, -1]), 1.0)
    with pytest.raises(ValueError, match="min_count"):
        private_histogram(np.array([1, 1]), 1.0, min_count=-1)
