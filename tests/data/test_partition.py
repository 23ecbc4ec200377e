"""Partition invariants for every scheme, incl. hypothesis property tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcure_app.core.layout import block_assignment, edge_classes
from fedcure_app.data.partition import SCHEMES, Partition, partition_dataset

COMPLETE = ("iid", "dirichlet", "shards")


def labels_for(n: int, c: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, c, size=n)


def check_invariants(p: Partition, labels: np.ndarray, num_clients: int, num_edges: int):
    """Disjoint, counts consistent with indices, every client non-empty, valid association."""
    assert p.num_clients == num_clients and len(p.client_indices) == num_clients
    allidx = np.concatenate(p.client_indices)
    assert allidx.dtype == np.int64
    assert np.unique(allidx).size == allidx.size, "clients overlap"
    assert allidx.min() >= 0 and allidx.max() < labels.size
    for i, ix in enumerate(p.client_indices):
        assert ix.size >= 1
        assert np.all(np.diff(ix) > 0), "indices sorted"
        np.testing.assert_array_equal(
            p.label_counts[i], np.bincount(labels[ix], minlength=p.num_classes))
    assert p.label_counts.dtype == np.int64 and p.label_counts.shape[0] == num_clients
    a = p.initial_assignment
    assert a.shape == (num_clients,) and a.dtype == np.int64
    assert set(np.unique(a)) == set(range(num_edges)), "every ES has a client"
    if p.scheme in COMPLETE:
        assert allidx.size == labels.size


@pytest.mark.parametrize("scheme", SCHEMES)
def test_invariants_and_determinism(scheme):
    y = labels_for(3000)
    p = partition_dataset(y, 50, 5, scheme, seed=3)
    check_invariants(p, y, 50, 5)
    q = partition_dataset(y, 50, 5, scheme, seed=3)
    for a, b in zip(p.client_indices, q.client_indices):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(p.initial_assignment, q.initial_assignment)
    r = partition_dataset(y, 50, 5, scheme, seed=4)
    assert any(not np.array_equal(a, b) for a, b in zip(p.client_indices, r.client_indices))


def test_edge_noniid_layout_and_ln2():
    y = labels_for(5000)
    p = partition_dataset(y, 50, 5, "edge-noniid", classes_per_edge=2)
    assert p.initial_jsd == pytest.approx(math.log(2), abs=1e-12)
    assert np.all((p.label_counts > 0).sum(axis=1) == 1), "one class per client"
    classes = edge_classes(5, 10, 2)
    for i in range(50):
        (cls,) = np.flatnonzero(p.label_counts[i])
        assert cls in classes[p.initial_assignment[i]]
    np.testing.assert_array_equal(p.initial_assignment, block_assignment(50, 5))
    # every sample of every class is used (all 10 classes are held) and split evenly
    np.testing.assert_array_equal(p.label_counts.sum(axis=0), np.bincount(y, minlength=10))
    for c in range(10):
        held = p.label_counts[:, c][p.label_counts[:, c] > 0]
        assert held.max() - held.min() <= 1


def test_edge_noniid_uses_every_sample_of_classes_in_use_only():
    y = labels_for(2000)
    p = partition_dataset(y, 6, 2, "edge-noniid", classes_per_edge=2)  # classes 0..3
    used = np.concatenate(p.client_indices)
    np.testing.assert_array_equal(np.sort(used), np.flatnonzero(y < 4))
    assert p.to_dict()["client_sizes"] == p.client_sizes.tolist()


def test_iid_sizes_are_balanced_and_mixed():
    y = labels_for(1003)
    p = partition_dataset(y, 10, 2, "iid")
    assert p.client_sizes.max() - p.client_sizes.min() <= 1
    assert p.initial_jsd < 0.05


def test_shards_give_few_classes_each():
    y = np.repeat(np.arange(10), 100)
    p = partition_dataset(y, 20, 4, "shards", shards_per_client=2)
    assert np.all((p.label_counts > 0).sum(axis=1) <= 2)
    assert np.all(p.client_sizes == 50)


def test_dirichlet_alpha_controls_skew():
    y = labels_for(5000)
    skewed = partition_dataset(y, 20, 4, "dirichlet", alpha=0.05, seed=1)
    mixed = partition_dataset(y, 20, 4, "dirichlet", alpha=100.0, seed=1)
    assert skewed.initial_jsd > 3 * mixed.initial_jsd
    assert skewed.client_sizes.min() >= 2
    assert skewed.params == {"alpha": 0.05, "min_samples": 2}


def test_dirichlet_respects_min_samples():
    y = labels_for(2000)
    p = partition_dataset(y, 20, 4, "dirichlet", alpha=0.3, min_samples=32)
    assert p.client_sizes.min() >= 32


def test_dirichlet_gives_up_with_clear_error():
    y = np.repeat(np.arange(3), 10)
    with pytest.raises(ValueError, match="use a larger alpha or fewer clients"):
        partition_dataset(y, 10, 2, "dirichlet", alpha=1e-3)
    with pytest.raises(ValueError, match="cannot give 10 clients 4 samples"):
        partition_dataset(y, 10, 2, "dirichlet", min_samples=4)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_more_clients_than_samples(scheme):
    with pytest.raises(ValueError, match="only 5 samples"):
        partition_dataset(np.arange(5) % 2, 6, 2, scheme)


def test_bad_arguments():
    y = labels_for(100)
    with pytest.raises(ValueError, match="num_edges"):
        partition_dataset(y, 3, 4)
    with pytest.raises(ValueError, match="unknown partition scheme"):
        partition_dataset(y, 4, 2, "random")
    with pytest.raises(ValueError, match="integers"):
        partition_dataset(y.astype(float), 4, 2)
    with pytest.raises(ValueError, match="out of range"):
        partition_dataset(y, 4, 2, num_classes=5)
    with pytest.raises(ValueError, match="1-D"):
        partition_dataset(y.reshape(10, 10), 4, 2)
    with pytest.raises(ValueError, match="class 1 has 1 samples for 2 clients"):
        partition_dataset(np.array([0, 0, 0, 1, 2, 2]), 4, 1, "edge-noniid", num_classes=3)
    with pytest.raises(ValueError, match="cannot make 40 shards"):
        partition_dataset(y[:30], 20, 2, "shards")


def test_to_dict_is_json_safe():
    import json

    p = partition_dataset(labels_for(300), 6, 3, "dirichlet")
    d = json.loads(json.dumps(p.to_dict(include_indices=True)))
    assert d["client_label_counts"] == p.label_counts.tolist()
    assert d["initial_assignment"] == p.initial_assignment.tolist()
    assert d["initial_jsd"] == pytest.approx(p.initial_jsd)
    assert sum(len(ix) for ix in d["client_indices"]) == 300
    assert np.array_equal(np.asarray(d["edge_label_counts"]), p.edge_label_counts())


@st.composite
def problems(draw):
    c = draw(st.integers(2, 6))
    n_clients = draw(st.integers(1, 15))
    n_edges = draw(st.integers(1, n_clients))
    n = draw(st.integers(n_clients, 200))
    labels = np.asarray(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
    return labels, c, n_clients, n_edges, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(SCHEMES), st.integers(1, 3), st.integers(1, 3))
def test_property_invariants(problem, scheme, spc, cpe):
    labels, c, n_clients, n_edges, seed = problem
    cpe = min(cpe, c)
    kwargs = dict(seed=seed, num_classes=c, shards_per_client=spc, classes_per_edge=cpe,
                  alpha=1.0, min_samples=1)
    try:
        p = partition_dataset(labels, n_clients, n_edges, scheme, **kwargs)
    except ValueError as err:
        # only the documented impossibilities may fail
        if scheme == "shards":
            assert labels.size < n_clients * spc
        elif scheme == "edge-noniid":
            from fedcure_app.core.layout import edge_noniid_layout

            held, _ = edge_noniid_layout(n_clients, n_edges, c, cpe)
            holders = np.bincount(held, minlength=c)
            assert np.any(np.bincount(labels, minlength=c) < holders), str(err)
        else:
            assert scheme == "dirichlet" and "draws" in str(err), str(err)
        return
    check_invariants(p, labels, n_clients, n_edges)
    again = partition_dataset(labels, n_clients, n_edges, scheme, **kwargs)
    assert all(np.array_equal(a, b) for a, b in zip(p.client_indices, again.client_indices))
    if scheme in COMPLETE:
        np.testing.assert_array_equal(p.label_counts.sum(axis=0),
                                      np.bincount(labels, minlength=c))
    if scheme == "iid":
        assert p.client_sizes.max() - p.client_sizes.min() <= 1
    if n_edges > 1:
        assert 0.0 <= p.initial_jsd <= math.log(2) + 1e-12
