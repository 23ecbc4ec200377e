"""The paper's clustering baselines: K-Means and Mean-Shift on the clients' label distributions.

Clients with similar label mixes end up on the same ES (the opposite of what FedCure wants), so
these partitions have a high average JSD. Mean-Shift chooses its own number of clusters K; it is
mapped onto the M ESs deterministically: while K > M the smallest cluster merges into the one
with the nearest centroid, while K < M the largest cluster is split in two (2-means, or by client
index when its points coincide). Cluster ids are then renumbered by their smallest client id, so
every ES gets at least one client.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedcure_app.core._checks import choice, counts_matrix, positive_int

METHODS = ("kmeans", "meanshift")


def _distributions(label_counts) -> np.ndarray:
    counts = counts_matrix(label_counts)
    totals = counts.sum(axis=1)
    return counts / np.where(totals > 0, totals, 1.0)[:, None]


def _renumber(labels: np.ndarray) -> np.ndarray:
    """Relabel clusters 0..K−1 in order of their smallest member index."""
    uniq, first = np.unique(labels, return_index=True)
    rank = np.empty(uniq.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(uniq.size)
    mapping = np.zeros(int(labels.max()) + 1, dtype=np.int64)
    mapping[uniq] = rank
    return mapping[labels]


def _merge_smallest(X: np.ndarray, labels: np.ndarray) -> np.ndarray:
    ids, sizes = np.unique(labels, return_counts=True)
    small = ids[np.argmin(sizes)]
    centroids = np.stack([X[labels == i].mean(axis=0) for i in ids])
    dist = np.linalg.norm(centroids - centroids[ids == small][0], axis=1)
    dist[ids == small] = np.inf
    target = ids[int(np.argmin(dist))]
    out = labels.copy()
    out[labels == small] = target
    return _renumber(out)


def _split_largest(X: np.ndarray, labels: np.ndarray, seed: int) -> np.ndarray:
    # lazy: scikit-learn takes seconds to import and only the kmeans/meanshift baselines need
    # it; every driver imports coalition formation (which imports this module)
    from sklearn.cluster import KMeans

    ids, sizes = np.unique(labels, return_counts=True)
    big = ids[np.argmax(sizes)]
    members = np.flatnonzero(labels == big)
    halves = None
    if np.unique(X[members], axis=0).shape[0] >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sub = KMeans(n_clusters=2, n_init=10, random_state=seed).fit(X[members]).labels_
        if 0 < sub.sum() < members.size:
            halves = sub.astype(bool)
    if halves is None:
        halves = np.arange(members.size) >= members.size // 2
    out = labels.copy()
    out[members[halves]] = labels.max() + 1
    return _renumber(out)


def _fill_empty(X: np.ndarray, labels: np.ndarray, num_edges: int) -> np.ndarray:
    """Give every ES id in [0, M) a client: move the client farthest from its centroid out of the
    largest cluster into each empty one."""
    labels = labels.copy()
    for m in range(num_edges):
        if np.any(labels == m):
            continue
        sizes = np.bincount(labels, minlength=num_edges)
        big = int(np.argmax(sizes))
        members = np.flatnonzero(labels == big)
        dist = np.linalg.norm(X[members] - X[members].mean(axis=0), axis=1)
        labels[members[int(np.argmax(dist))]] = m
    return labels


def cluster_coalitions(label_counts, num_edges: int, method: str = "kmeans",
                       seed: int = 0) -> np.ndarray:
    """Assign clients to ``num_edges`` ESs by clustering their normalised label distributions.

    Returns an (N,) int64 assignment in which every ES has at least one client.
    """
    # lazy: scikit-learn takes seconds to import and only the kmeans/meanshift baselines need
    # it; every driver imports coalition formation (which imports this module)
    from sklearn.cluster import KMeans, MeanShift, estimate_bandwidth

    method = choice(method, "clustering method", METHODS)
    X = _distributions(label_counts)
    m = positive_int(num_edges, "num_edges")
    n = X.shape[0]
    if m > n:
        raise ValueError(f"num_edges ({m}) > number of clients ({n}): every ES needs a client")
    seed = positive_int(seed, "seed", minimum=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "kmeans":
            labels = KMeans(n_clusters=m, n_init=10, random_state=seed).fit(X).labels_
            return _fill_empty(X, labels.astype(np.int64), m)
        bandwidth = estimate_bandwidth(X, quantile=0.3, random_state=seed) if n > 1 else 0.0
        if not bandwidth > 0:
            bandwidth = 1e-3
        labels = MeanShift(bandwidth=bandwidth).fit(X).labels_.astype(np.int64)
    labels = _renumber(labels)
    while labels.max() + 1 > m:
        labels = _merge_smallest(X, labels)
    while labels.max() + 1 < m:
        labels = _split_largest(X, labels, seed)
    return labels
