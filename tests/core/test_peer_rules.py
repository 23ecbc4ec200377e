"""The peers' rules (fedcure_app.core.peers): FedAvg's weights and sampling, FedBuff's staleness
weight and server step, FedAT's tiers and cross-tier weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.core import peers as rules

#: few examples each: the properties are simple and the peers' tests share a 2-minute budget
few = settings(max_examples=30, deadline=None)
counts = st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=12)


def _model(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=4).astype(np.float32)]


@few
@given(st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=12))
def test_sample_weights_are_the_sample_shares(n):
    w = rules.sample_weights(n)
    assert w.sum() == pytest.approx(1.0)
    assert np.allclose(w * sum(n), n)


def test_sample_weights_refuse_no_samples():
    with pytest.raises(ValueError, match="not all 0"):
        rules.sample_weights([0, 0])


@few
@given(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=2**31))
def test_weighted_mean_of_one_model_repeated_is_that_model(k, seed):
    m = _model(np.random.default_rng(seed))
    out = rules.weighted_mean([m] * k, np.full(k, 1.0 / k))
    for a, b in zip(out, m):
        assert a.dtype == b.dtype
        assert np.allclose(a, b, atol=1e-6)


@few
@given(st.integers(min_value=1, max_value=500), st.floats(min_value=0.001, max_value=1.0))
def test_fedavg_samples_max_of_floor_c_k_and_one_distinct_clients(k, c):
    m = rules.clients_per_round(k, c)
    assert m == max(1, int(np.floor(c * k + 1e-9)))
    picked = rules.sample_clients(np.random.default_rng(0), k, c)
    assert len(set(picked.tolist())) == m and picked.min() >= 0 and picked.max() < k


@few
@given(st.floats(min_value=0.0, max_value=1e6), st.floats(min_value=0.0, max_value=1e6))
def test_staleness_weight_is_one_when_fresh_and_falls_with_staleness(a, b):
    assert rules.staleness_weight(0) == 1.0
    lo, hi = sorted((a, b))
    assert 0 < rules.staleness_weight(hi) <= rules.staleness_weight(lo) <= 1.0
    assert rules.staleness_weight(3.0) == pytest.approx(0.5)


@few
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=5),
       st.integers(min_value=0, max_value=2**31))
def test_buffer_without_staleness_weight_and_lr_one_is_the_mean_update(stale, seed):
    rng = np.random.default_rng(seed)
    g = _model(rng)
    deltas = [rules.model_delta(_model(rng), _model(rng)) for _ in stale]
    out = rules.buffered_step(g, deltas, stale, 1.0, weigh_staleness=False)
    for i, layer in enumerate(out):
        mean = np.mean([d[i] for d in deltas], axis=0)
        assert np.allclose(layer, g[i] + mean, atol=1e-5)


def test_buffer_of_one_without_staleness_weight_applies_the_client_update_whole():
    """K = 1, s ≡ 1, η_g = 1: asynchronous SGD, w ← w + (w_client − w_received)."""
    rng = np.random.default_rng(1)
    g, received, trained = _model(rng), _model(rng), _model(rng)
    out = rules.buffered_step(g, [rules.model_delta(trained, received)], [7], 1.0,
                              weigh_staleness=False)
    for o, a, t, r in zip(out, g, trained, received):
        assert np.allclose(o, a + (t - r), atol=1e-6)


def test_buffer_weighs_each_update_by_its_staleness():
    g = [np.zeros(1)]
    out = rules.buffered_step(g, [[np.ones(1)], [np.ones(1)]], [0, 3], 2.0)
    assert out[0][0] == pytest.approx(2.0 * (1.0 + 0.5) / 2)


@few
@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=40),
       st.integers(min_value=1, max_value=8))
def test_latency_tiers_are_balanced_and_ordered_by_latency(lat, m):
    m = min(m, len(lat))
    tier = rules.latency_tiers(lat, m)
    sizes = np.bincount(tier, minlength=m)
    assert sizes.max() - sizes.min() <= 1 and sizes.min() >= 1
    lat = np.asarray(lat)
    for t in range(m - 1):
        assert lat[tier == t].max() <= lat[tier == t + 1].min()


@few
@given(counts.filter(lambda c: sum(c) > 0))
def test_cross_tier_weights_sum_to_one_and_mirror_the_update_counts(c):
    w = rules.cross_tier_weights(c)
    assert w.sum() == pytest.approx(1.0)
    assert np.allclose(w, np.asarray(c[::-1]) / sum(c))


@few
@given(st.lists(st.integers(min_value=1, max_value=1000), min_size=2, max_size=8))
def test_tiers_that_update_less_often_weigh_more(c):
    """Faster tiers (listed first) update more often; their models weigh less."""
    c = sorted(c, reverse=True)
    w = rules.cross_tier_weights(c)
    assert np.all(np.diff(w) >= 0)


def test_cross_tier_weights_are_uniform_before_any_update():
    assert np.allclose(rules.cross_tier_weights([0, 0, 0, 0]), 0.25)
