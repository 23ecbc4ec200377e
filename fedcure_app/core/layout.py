"""Initial federation layouts at the label-count level (pure numpy).

The paper's *edge non-IID* setting: each edge server (ES) m starts with ``classes_per_edge`` of the
classes, and each of its clients holds a single one of them. With 50 clients, 5 ESs and 10 classes
the coalitions' label sets are disjoint, so the initial average pairwise JSD is ln 2.

These functions decide *who holds what*; :mod:`fedcure_app.data.partition` turns the same layout
into sample indices of a real dataset, and ``fedcure form`` into synthetic label counts.
"""

from __future__ import annotations

import numpy as np


def _check_sizes(num_clients: int, num_edges: int, num_classes: int) -> None:
    for name, v in (("num_clients", num_clients), ("num_edges", num_edges),
                    ("num_classes", num_classes)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if num_edges > num_clients:
        raise ValueError(
            f"num_edges ({num_edges}) > num_clients ({num_clients}): every ES needs a client"
        )


def block_assignment(num_clients: int, num_edges: int) -> np.ndarray:
    """Initial client→ES association in contiguous, near-equal blocks (client i → ⌊i·M/N⌋)."""
    _check_sizes(num_clients, num_edges, 1)
    return (np.arange(num_clients, dtype=np.int64) * num_edges) // num_clients


def edge_classes(num_edges: int, num_classes: int, classes_per_edge: int = 2) -> np.ndarray:
    """Classes held by each ES in the edge non-IID layout, shape (M, classes_per_edge).

    ES m holds classes ``m·cpe, …, m·cpe + cpe − 1`` (mod C): disjoint while M·cpe ≤ C.
    """
    if not 1 <= classes_per_edge <= num_classes:
        raise ValueError(
            f"classes_per_edge must be in [1, {num_classes}], got {classes_per_edge}"
        )
    base = np.arange(num_edges, dtype=np.int64)[:, None] * classes_per_edge
    return (base + np.arange(classes_per_edge, dtype=np.int64)[None, :]) % num_classes


def edge_noniid_layout(
    num_clients: int, num_edges: int, num_classes: int, classes_per_edge: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's edge non-IID layout.

    Returns ``(client_class, initial)``: the single class each client holds (shape (N,)) and its
    initial ES (shape (N,)). Clients of ES m take the ES's classes in turn.
    """
    _check_sizes(num_clients, num_edges, num_classes)
    initial = block_assignment(num_clients, num_edges)
    classes = edge_classes(num_edges, num_classes, classes_per_edge)
    # rank of each client inside its ES block
    starts = np.searchsorted(initial, np.arange(num_edges))
    rank = np.arange(num_clients) - starts[initial]
    client_class = classes[initial, rank % classes_per_edge]
    return client_class, initial


def synthetic_label_counts(
    num_clients: int,
    num_edges: int,
    num_classes: int,
    partition: str = "edge-noniid",
    *,
    samples_per_client: int = 100,
    alpha: float = 0.5,
    classes_per_edge: int = 2,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic per-client label counts and an initial association, without any dataset.

    ``partition``: ``edge-noniid`` (one class per client, equal counts), ``dirichlet`` (each
    client's class mix drawn from Dir(α·1), multinomial counts) or ``iid`` (uniform mix).
    Returns ``(label_counts (N, C) int64, initial (N,) int64)``.
    """
    _check_sizes(num_clients, num_edges, num_classes)
    if samples_per_client < 1:
        raise ValueError(f"samples_per_client must be >= 1, got {samples_per_client}")
    rng = np.random.default_rng(seed)
    if partition == "edge-noniid":
        client_class, initial = edge_noniid_layout(
            num_clients, num_edges, num_classes, classes_per_edge
        )
        counts = np.zeros((num_clients, num_classes), dtype=np.int64)
        counts[np.arange(num_clients), client_class] = samples_per_client
        return counts, initial
    initial = block_assignment(num_clients, num_edges)
    if partition == "dirichlet":
        if not alpha > 0:
            raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
        probs = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
    elif partition == "iid":
        probs = np.full((num_clients, num_classes), 1.0 / num_classes)
    else:
        raise ValueError(
            f"unknown partition {partition!r}; choose edge-noniid, dirichlet or iid"
        )
    counts = np.stack([rng.multinomial(samples_per_client, p) for p in probs]).astype(np.int64)
    return counts, initial
