"""Bayesian latency estimator: conjugate lognormal model, predictive probabilities, checkpoints."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.core.estimator import LatencyEstimator


def test_prior_predictive_mean_is_the_prior_latency():
    prior = np.array([2.0, 10.0, 0.5])
    est = LatencyEstimator(prior, prior_strength=2.0, prior_cv=0.4)
    assert np.allclose(est.mean(), prior, rtol=1e-12)


def test_posterior_mean_moves_towards_the_data_and_only_for_that_coalition():
    est = LatencyEstimator([5.0, 5.0])
    before = est.mean()
    est.update(0, 20.0)
    after = est.mean()
    assert after[0] > before[0] and after[1] == before[1]
    rng = np.random.default_rng(0)
    for t in rng.lognormal(math.log(20.0), 0.1, size=400):
        est.update(0, float(t))
    # lognormal(ln 20, 0.1) has mean 20·e^{0.005}
    assert est.mean()[0] == pytest.approx(20.0 * math.exp(0.005), rel=0.03)
    lo, hi = est.quantile(0, 0.05), est.quantile(0, 0.95)
    assert lo < 20.0 < hi and hi / lo < 1.6


def test_predictive_matches_monte_carlo_of_the_nig_posterior():
    est = LatencyEstimator([3.0], prior_strength=1.5, prior_cv=0.3)
    for t in (2.0, 4.5, 3.1, 2.7):
        est.update(0, t)
    mun, kn, an, bn = (v[0] for v in est.posterior())
    rng = np.random.default_rng(1)
    sigma2 = bn / rng.gamma(an, 1.0, size=400_000)
    mu = rng.normal(mun, np.sqrt(sigma2 / kn))
    y = rng.normal(mu, np.sqrt(sigma2))
    for deadline in (2.0, 3.0, 5.0):
        assert est.prob_within(0, deadline) == pytest.approx(np.mean(y <= math.log(deadline)),
                                                             abs=0.005)
    # the plug-in mean uses the posterior mean of σ² inside the exact conditional mean
    plug = math.exp(mun + 0.5 * np.mean(sigma2) * (1 + 1 / kn))
    assert est.mean()[0] == pytest.approx(plug, rel=0.01)


def test_incremental_statistics_equal_the_batch_conjugate_update():
    obs = np.array([2.0, 4.5, 3.1, 2.7, 8.0])
    est = LatencyEstimator([3.0], prior_strength=1.5, prior_cv=0.3)
    for t in obs:
        est.update(0, float(t))
    y = np.log(obs)
    n, ybar = y.size, y.mean()
    k0, a0 = 1.5, 1.75
    s2 = math.log1p(0.09)
    b0 = s2 * (a0 - 1)
    mu0 = math.log(3.0) - 0.5 * s2 * (1 + 1 / k0)
    expected = (
        (k0 * mu0 + n * ybar) / (k0 + n),
        k0 + n,
        a0 + n / 2,
        b0 + 0.5 * ((y - ybar) ** 2).sum() + k0 * n * (ybar - mu0) ** 2 / (2 * (k0 + n)),
    )
    for got, want in zip(est.posterior(), expected):
        assert got[0] == pytest.approx(want, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(d1=st.floats(0.01, 100), d2=st.floats(0.01, 100),
       obs=st.lists(st.floats(0.1, 50), max_size=5))
def test_prob_within_is_a_cdf(d1, d2, obs):
    est = LatencyEstimator([4.0, 1.0])
    for t in obs:
        est.update(0, t)
    p1, p2 = est.prob_within(0, d1), est.prob_within(0, d2)
    assert 0.0 <= p1 <= 1.0
    if d1 <= d2:
        assert p1 <= p2
    assert est.prob_within(0, 0.0) == 0.0
    q = est.quantile(0, 0.3)
    assert est.prob_within(0, q) == pytest.approx(0.3, abs=1e-9)


def test_state_round_trip_through_json():
    est = LatencyEstimator([1.0, 2.0, 3.0], prior_strength=3.0, prior_cv=0.2)
    for m, t in [(0, 1.5), (2, 2.0), (0, 0.9), (1, 4.0)]:
        est.update(m, t)
    state = json.loads(json.dumps(est.state_dict()))
    other = LatencyEstimator([9.0, 9.0, 9.0])
    other.load_state_dict(state)
    assert np.array_equal(other.mean(), est.mean())
    assert other.prob_within(1, 3.0) == est.prob_within(1, 3.0)
    other.update(2, 5.0)
    est.update(2, 5.0)
    assert np.array_equal(other.mean(), est.mean())


def test_calibrated_state_round_trip_keeps_the_scale():
    est = LatencyEstimator([1.0, 2.0], calibrate=True)
    est.update(0, 50.0)
    other = LatencyEstimator([1.0, 2.0])
    other.load_state_dict(json.loads(json.dumps(est.state_dict())))
    assert other.calibrate and other.scale == pytest.approx(50.0)
    assert np.array_equal(other.mean(), est.mean())


@settings(max_examples=60, deadline=None)
@given(
    prior=st.lists(st.floats(0.01, 100.0), min_size=2, max_size=6),
    factor=st.floats(1e-3, 1e4),
    observed=st.integers(0, 5),
)
def test_calibration_moves_every_prior_to_the_observed_scale(prior, factor, observed):
    """Latencies exactly ``factor`` × the profile prediction: with calibration every coalition,
    observed or not, is estimated at factor × its prior; without it one far-off arrival sends
    the plug-in mean beyond every observation."""
    m = observed % len(prior)
    cal = LatencyEstimator(prior, calibrate=True)
    raw = LatencyEstimator(prior)
    for _ in range(3):
        cal.update(m, factor * prior[m])
        raw.update(m, factor * prior[m])
    assert cal.scale == pytest.approx(factor, rel=1e-9)
    assert np.allclose(cal.mean(), factor * np.asarray(prior), rtol=0.15)
    assert 0.5 < cal.quantile(m, 0.5) / (factor * prior[m]) < 2.0
    if factor > 100.0:
        assert raw.mean()[m] > 1.5 * factor * prior[m]


def test_calibration_is_off_by_default_and_neutral_without_data():
    prior = np.array([0.2, 3.0])
    assert not LatencyEstimator(prior).calibrate
    cal = LatencyEstimator(prior, calibrate=True)
    assert cal.scale == 1.0 and np.allclose(cal.mean(), prior, rtol=1e-12)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda e: e.update(3, 1.0), "out of range"),
        (lambda e: e.update(-1, 1.0), ">= 0"),
        (lambda e: e.update(0, 0.0), "latency_s"),
        (lambda e: e.update(0, float("nan")), "finite"),
        (lambda e: e.prob_within(0, float("inf")), "finite"),
        (lambda e: e.quantile(0, 1.0), "q"),
        (lambda e: e.load_state_dict({"prior_latency": [1.0]}), "lacks"),
        (lambda e: e.load_state_dict({**e.state_dict(), "count": [1, 2]}), "entries"),
        (lambda e: e.load_state_dict({**e.state_dict(), "count": [-1, 0, 0]}), "negative"),
    ],
)
def test_bad_calls(call, match):
    est = LatencyEstimator([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=match):
        call(est)


@pytest.mark.parametrize(
    "args, match",
    [
        (([1.0, -2.0],), "positive"),
        (([1.0, np.nan],), "NaN"),
        (([],), "at least one"),
        (([[1.0]],), "1-D"),
        (([1.0], 0.0), "prior_strength"),
        (([1.0], 1.0, -0.1), "prior_cv"),
    ],
)
def test_bad_construction(args, match):
    with pytest.raises(ValueError, match=match):
        LatencyEstimator(*args)
