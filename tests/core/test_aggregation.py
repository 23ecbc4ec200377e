"""FedAvg, staleness weights and the cloud's mixing update."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.core.aggregation import cloud_update, fedavg, staleness_weight


def _model(rng, dtype=np.float32):
    return [rng.normal(size=(3, 4)).astype(dtype), rng.normal(size=(5,)).astype(dtype)]


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 5), seed=st.integers(0, 1000))
def test_fedavg_is_the_sample_weighted_mean(k, seed):
    rng = np.random.default_rng(seed)
    models = [_model(rng) for _ in range(k)]
    weights = rng.integers(1, 100, size=k)
    out = fedavg(models, weights)
    for i in range(2):
        expected = sum(w * m[i].astype(np.float64) for w, m in zip(weights, models)) / weights.sum()
        assert out[i].dtype == np.float32 and out[i].shape == models[0][i].shape
        assert np.allclose(out[i], expected, rtol=1e-6, atol=1e-6)


def test_fedavg_special_cases():
    a = [np.array([1.0, 2.0]), np.array([10], dtype=np.int64)]
    b = [np.array([3.0, 6.0]), np.array([13], dtype=np.int64)]
    out = fedavg([a, b], [1, 0])
    assert np.array_equal(out[0], a[0]) and out[1].dtype == np.int64
    out = fedavg([a, b], [1, 1])
    assert np.allclose(out[0], [2.0, 4.0]) and out[1].tolist() == [12]  # rint(11.5) = 12


@pytest.mark.parametrize(
    "models, weights, match",
    [
        ([], [], "at least one"),
        ([[np.ones(2)]], [1, 2], "weights"),
        ([[np.ones(2)], [np.ones(3)]], [1, 1], "shape"),
        ([[np.ones(2)], [np.ones(2), np.ones(2)]], [1, 1], "tensors"),
        ([[np.ones(2)], [np.ones(2)]], [0, 0], "sum to zero"),
        ([[np.ones(2)], [np.ones(2)]], [1, -1], "non-negative"),
        ([[np.ones(2)], [np.array([np.nan, 1])]], [1, 1], "NaN"),
        ([[np.ones(2)]], [np.inf], "NaN or Inf"),
    ],
)
def test_fedavg_rejects_bad_input(models, weights, match):
    with pytest.raises(ValueError, match=match):
        fedavg(models, weights)


def test_staleness_weight():
    assert staleness_weight(0, 0.2, 0.9) == pytest.approx(0.2)
    assert staleness_weight(3, 0.2, 0.9) == pytest.approx(0.2 * 0.9 ** 3)
    ws = [staleness_weight(p, 0.5, 0.95) for p in range(20)]
    assert all(b < a for a, b in zip(ws, ws[1:]))
    for args, match in (((-1, 0.2, 0.9), "staleness"), ((1.5, 0.2, 0.9), "integer"),
                        ((1, 0.0, 0.9), "ell"), ((1, 0.2, 1.5), "k"),
                        ((1, np.nan, 0.9), "finite")):
        with pytest.raises(ValueError, match=match):
            staleness_weight(*args)


def test_cloud_update():
    g = [np.zeros((2, 2), np.float32), np.array([4.0])]
    e = [np.ones((2, 2), np.float32), np.array([8.0])]
    out = cloud_update(g, e, 0.25)
    assert out[0].dtype == np.float32 and np.allclose(out[0], 0.25)
    assert out[1].tolist() == [5.0]
    assert np.array_equal(cloud_update(g, e, 0.0)[1], g[1])
    assert np.array_equal(cloud_update(g, e, 1.0)[1], e[1])
    with pytest.raises(ValueError, match="xi"):
        cloud_update(g, e, 1.5)
    with pytest.raises(ValueError, match="tensors"):
        cloud_update(g, e[:1], 0.5)
    with pytest.raises(ValueError, match="shape"):
        cloud_update(g, [np.ones(3), e[1]], 0.5)
    with pytest.raises(ValueError, match="NaN"):
        cloud_update(g, [e[0], np.array([np.inf])], 0.5)
