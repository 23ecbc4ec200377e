"""Split a dataset's training labels among clients, and give each client its initial edge server.

Schemes (all seeded and deterministic; every client gets at least one sample or a ValueError):

- ``edge-noniid`` (the paper's): :func:`fedcure_app.core.layout.edge_noniid_layout` gives each
  ES ``classes_per_edge`` classes and each client one class of its ES; each class's samples are
  shuffled and split as evenly as possible among the clients holding it. Classes no client holds
  are left out; every sample of the classes in use is assigned.
- ``dirichlet`` (Hsu et al., 2019): for every class, proportions over clients are drawn from
  Dir(α·1) and the class's shuffled samples cut accordingly; the whole draw is repeated until
  every client has at least ``min_samples`` samples.
- ``iid``: a random permutation cut into near-equal parts.
- ``shards`` (McMahan et al., 2017): samples sorted by label, cut into
  ``num_clients·shards_per_client`` near-equal shards, each client gets ``shards_per_client``
  random shards.

For every scheme but ``edge-noniid`` the initial association is
:func:`fedcure_app.core.layout.block_assignment` (contiguous near-equal blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcure_app.core.layout import block_assignment, edge_noniid_layout

SCHEMES: tuple[str, ...] = ("edge-noniid", "dirichlet", "iid", "shards")

#: Complete draws tried by the Dirichlet scheme before giving up.
DIRICHLET_MAX_DRAWS = 1000


@dataclass(eq=False)
class Partition:
    """Which training samples each client holds, and each client's initial ES."""

    scheme: str
    #: Sorted int64 sample indices of each client (pairwise disjoint).
    client_indices: list[np.ndarray]
    #: (num_clients, num_classes) int64: samples of each class per client.
    label_counts: np.ndarray
    #: (num_clients,) int64: each client's initial ES in [0, num_edges).
    initial_assignment: np.ndarray
    num_edges: int
    seed: int
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def num_classes(self) -> int:
        return int(self.label_counts.shape[1])

    @property
    def client_sizes(self) -> np.ndarray:
        """Samples per client, (num_clients,) int64."""
        return self.label_counts.sum(axis=1)

    def edge_label_counts(self, assignment: np.ndarray | None = None) -> np.ndarray:
        """(num_edges, num_classes) label counts per ES under ``assignment`` (default: initial)."""
        a = self.initial_assignment if assignment is None else assignment
        from fedcure_app.core.divergence import coalition_label_counts  # scipy: not in clients

        return coalition_label_counts(self.label_counts, a, self.num_edges).astype(np.int64)

    @property
    def initial_jsd(self) -> float:
        """Average pairwise JSD (nats) between the initial coalitions' label distributions."""
        from fedcure_app.core.divergence import average_pairwise_jsd

        return float(average_pairwise_jsd(self.edge_label_counts()))

    def to_dict(self, *, include_indices: bool = False) -> dict[str, Any]:
        """JSON-safe summary (lists of ints); sample indices only when asked."""
        out: dict[str, Any] = {
            "scheme": self.scheme,
            "seed": self.seed,
            "num_clients": self.num_clients,
            "num_edges": self.num_edges,
            "num_classes": self.num_classes,
            "params": dict(self.params),
            "client_sizes": self.client_sizes.tolist(),
            "client_label_counts": self.label_counts.tolist(),
            "initial_assignment": self.initial_assignment.tolist(),
            "edge_label_counts": self.edge_label_counts().tolist(),
            "initial_jsd": self.initial_jsd,
        }
        if include_indices:
            out["client_indices"] = [ix.tolist() for ix in self.client_indices]
        return out


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_labels(labels: Any, num_classes: int | None) -> tuple[np.ndarray, int]:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if y.size == 0:
        raise ValueError("labels are empty: nothing to partition")
    if y.dtype.kind not in "iu":
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64, copy=False)
    if y.min() < 0:
        raise ValueError(f"labels must be >= 0, found {y.min()}")
    c = int(y.max()) + 1 if num_classes is None else _positive_int(num_classes, "num_classes")
    if y.max() >= c:
        raise ValueError(f"label {y.max()} is out of range for num_classes={c}")
    return y, c


def _owner_iid(y: np.ndarray, n_clients: int, rng: np.random.Generator) -> np.ndarray:
    owner = np.empty(y.size, dtype=np.int64)
    owner[rng.permutation(y.size)] = np.arange(y.size) * n_clients // y.size
    return owner


def _owner_shards(y: np.ndarray, n_clients: int, per_client: int,
                  rng: np.random.Generator) -> np.ndarray:
    n_shards = n_clients * per_client
    if y.size < n_shards:
        raise ValueError(
            f"shards: {y.size} samples cannot make {n_shards} shards "
            f"({n_clients} clients × {per_client}); use fewer clients or shards_per_client"
        )
    perm = rng.permutation(y.size)
    order = perm[np.argsort(y[perm], kind="stable")]  # by label, shuffled within a label
    shard_of_pos = np.arange(y.size) * n_shards // y.size
    client_of_shard = np.empty(n_shards, dtype=np.int64)
    client_of_shard[rng.permutation(n_shards)] = np.repeat(np.arange(n_clients), per_client)
    owner = np.empty(y.size, dtype=np.int64)
    owner[order] = client_of_shard[shard_of_pos]
    return owner


def _owner_dirichlet(y: np.ndarray, n_clients: int, n_classes: int, alpha: float,
                     min_samples: int, rng: np.random.Generator) -> np.ndarray:
    if not alpha > 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    if y.size < n_clients * min_samples:
        raise ValueError(
            f"dirichlet: {y.size} samples cannot give {n_clients} clients "
            f"{min_samples} samples each"
        )
    by_class = [np.flatnonzero(y == c) for c in range(n_classes)]
    owner = np.empty(y.size, dtype=np.int64)
    clients = np.arange(n_clients)
    for _ in range(DIRICHLET_MAX_DRAWS):
        sizes = np.zeros(n_clients, dtype=np.int64)
        for idx in by_class:
            if idx.size == 0:
                continue
            p = rng.dirichlet(np.full(n_clients, float(alpha)))
            cuts = np.minimum((np.cumsum(p) * idx.size).astype(np.int64), idx.size)
            cuts[-1] = idx.size
            counts = np.diff(cuts, prepend=0)
            owner[rng.permutation(idx)] = np.repeat(clients, counts)
            sizes += counts
        if sizes.min() >= min_samples:
            return owner
    raise ValueError(
        f"dirichlet: after {DIRICHLET_MAX_DRAWS} draws some client still had fewer than "
        f"{min_samples} samples ({n_clients} clients, α={alpha}, {y.size} samples); "
        "use a larger alpha or fewer clients"
    )


def _owner_edge_noniid(y: np.ndarray, n_clients: int, n_edges: int, n_classes: int,
                       classes_per_edge: int, rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray]:
    client_class, initial = edge_noniid_layout(n_clients, n_edges, n_classes, classes_per_edge)
    owner = np.full(y.size, -1, dtype=np.int64)
    for c in np.unique(client_class):
        holders = np.flatnonzero(client_class == c)
        idx = np.flatnonzero(y == c)
        if idx.size < holders.size:
            raise ValueError(
                f"edge-noniid: class {c} has {idx.size} samples for {holders.size} clients; "
                "every client needs at least one"
            )
        counts = np.full(holders.size, idx.size // holders.size, dtype=np.int64)
        counts[: idx.size % holders.size] += 1
        owner[rng.permutation(idx)] = np.repeat(holders, counts)
    return owner, initial


def _from_owner(owner: np.ndarray, y: np.ndarray, n_clients: int, n_classes: int
                ) -> tuple[list[np.ndarray], np.ndarray]:
    """Client index lists (sorted) and label counts from a per-sample owner (−1 = unused)."""
    used = np.flatnonzero(owner >= 0)
    own = owner[used]
    sizes = np.bincount(own, minlength=n_clients)
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        raise ValueError(
            f"client {int(empty[0])} received no samples ({empty.size} of {n_clients} clients "
            "empty); use fewer clients or another partition"
        )
    grouped = used[np.argsort(own, kind="stable")]
    indices = np.split(grouped, np.cumsum(sizes)[:-1])
    counts = np.bincount(own * n_classes + y[used], minlength=n_clients * n_classes)
    return indices, counts.reshape(n_clients, n_classes).astype(np.int64)


def partition_dataset(
    labels: Any,
    num_clients: int,
    num_edges: int,
    scheme: str = "edge-noniid",
    *,
    seed: int = 0,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    classes_per_edge: int = 2,
    num_classes: int | None = None,
    min_samples: int = 2,
) -> Partition:
    """Partition sample ``labels`` (N,) among ``num_clients`` clients under ``num_edges`` ESs.

    ``alpha``: Dirichlet concentration; ``min_samples``: the least samples per client the
    Dirichlet scheme accepts (other schemes need ≥ 1); ``num_classes`` defaults to max label + 1.
    """
    y, n_classes = _check_labels(labels, num_classes)
    n = _positive_int(num_clients, "num_clients")
    m = _positive_int(num_edges, "num_edges")
    if m > n:
        raise ValueError(f"num_edges ({m}) > num_clients ({n}): every ES needs a client")
    if y.size < n:
        raise ValueError(f"{n} clients but only {y.size} samples: every client needs one")
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    params: dict[str, Any] = {}
    initial = None
    if scheme == "edge-noniid":
        cpe = _positive_int(classes_per_edge, "classes_per_edge")
        owner, initial = _owner_edge_noniid(y, n, m, n_classes, cpe, rng)
        params["classes_per_edge"] = cpe
    elif scheme == "dirichlet":
        ms = _positive_int(min_samples, "min_samples")
        owner = _owner_dirichlet(y, n, n_classes, float(alpha), ms, rng)
        params.update(alpha=float(alpha), min_samples=ms)
    elif scheme == "iid":
        owner = _owner_iid(y, n, rng)
    elif scheme == "shards":
        spc = _positive_int(shards_per_client, "shards_per_client")
        owner = _owner_shards(y, n, spc, rng)
        params["shards_per_client"] = spc
    else:
        raise ValueError(f"unknown partition scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    indices, counts = _from_owner(owner, y, n, n_classes)
    if initial is None:
        initial = block_assignment(n, m)
    return Partition(scheme, indices, counts, np.asarray(initial, dtype=np.int64), m,
                     int(seed), params)
