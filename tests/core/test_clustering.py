"""K-Means / Mean-Shift baselines: every ES gets at least one client, deterministically."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.core.coalition import cluster_coalitions
from fedcure_app.core.layout import synthetic_label_counts


@settings(max_examples=12, deadline=None)
@given(n=st.integers(2, 30), m=st.integers(1, 8), seed=st.integers(0, 1000),
       method=st.sampled_from(["kmeans", "meanshift"]),
       partition=st.sampled_from(["edge-noniid", "dirichlet", "iid"]))
def test_every_es_gets_a_client(n, m, seed, method, partition):
    m = min(m, n)
    counts, _ = synthetic_label_counts(n, m, 5, partition, alpha=0.3, seed=seed)
    labels = cluster_coalitions(counts, m, method=method, seed=seed)
    assert labels.shape == (n,) and labels.dtype == np.int64
    assert np.bincount(labels, minlength=m).min() >= 1
    assert labels.max() == m - 1


@pytest.mark.parametrize("method", ["kmeans", "meanshift"])
def test_identical_clients_and_one_client_per_es(method):
    same = np.tile([3, 1, 0], (6, 1))
    labels = cluster_coalitions(same, 4, method=method)
    assert np.bincount(labels, minlength=4).min() >= 1
    labels = cluster_coalitions(np.eye(5) * 9, 5, method=method)
    assert sorted(labels.tolist()) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("method", ["kmeans", "meanshift"])
def test_deterministic_and_groups_look_alikes(method):
    # two clearly separated groups of clients, two ESs: each group lands on one ES
    counts = np.array([[9, 1, 0, 0]] * 5 + [[0, 0, 1, 9]] * 5)
    a = cluster_coalitions(counts, 2, method=method, seed=3)
    b = cluster_coalitions(counts, 2, method=method, seed=3)
    assert np.array_equal(a, b)
    assert len(set(a[:5])) == 1 and len(set(a[5:])) == 1 and a[0] != a[5]


def test_bad_input():
    with pytest.raises(ValueError, match="clustering method"):
        cluster_coalitions(np.ones((4, 2)), 2, method="dbscan")
    with pytest.raises(ValueError, match="every ES needs a client"):
        cluster_coalitions(np.ones((2, 2)), 3)
    with pytest.raises(ValueError, match="NaN"):
        cluster_coalitions(np.full((3, 2), np.nan), 2)
