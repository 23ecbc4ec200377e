"""Reachability (which ESs a client may join) and per-ES capacity for coalition formation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Constraints:
    """``allowed`` (N, M) bool: client n may belong to ES m; ``capacity`` (M,) int64: at most
    that many clients per ES."""

    allowed: np.ndarray
    capacity: np.ndarray

    @classmethod
    def build(cls, num_clients: int, num_edges: int, allowed: Any = None,
              capacity: Any = None) -> "Constraints":
        return cls(_allowed_matrix(allowed, num_clients, num_edges),
                   _capacity_vector(capacity, num_clients, num_edges))

    def check(self, assignment: np.ndarray, what: str = "initial") -> None:
        """Raise ValueError unless ``assignment`` respects reachability and capacity."""
        n_idx = np.arange(assignment.size)
        bad = np.flatnonzero(~self.allowed[n_idx, assignment])
        if bad.size:
            n = int(bad[0])
            raise ValueError(
                f"{what} assignment puts client {n} on ES {int(assignment[n])}, "
                f"which it is not allowed to join"
            )
        sizes = np.bincount(assignment, minlength=self.capacity.size)
        over = np.flatnonzero(sizes > self.capacity)
        if over.size:
            m = int(over[0])
            raise ValueError(
                f"{what} assignment puts {int(sizes[m])} clients on ES {m}, "
                f"above its capacity {int(self.capacity[m])}"
            )


def _allowed_matrix(allowed: Any, n: int, m: int) -> np.ndarray:
    if allowed is None:
        return np.ones((n, m), dtype=bool)
    if isinstance(allowed, np.ndarray) and allowed.ndim == 2:
        if allowed.shape != (n, m):
            raise ValueError(f"allowed must have shape ({n}, {m}), got {allowed.shape}")
        if allowed.dtype != bool and not np.all(np.isin(allowed, (0, 1))):
            raise ValueError("allowed matrix must be boolean (or 0/1)")
        return allowed.astype(bool)
    if not isinstance(allowed, Sequence) or len(allowed) != n:
        raise ValueError(
            f"allowed must be an ({n}, {m}) bool matrix or a list of {n} lists of ES ids"
        )
    out = np.zeros((n, m), dtype=bool)
    for client, ess in enumerate(allowed):
        ids = np.asarray(list(ess))
        if ids.size == 0:
            raise ValueError(f"allowed lists no ES for client {client}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"allowed ES ids for client {client} must be integers")
        if ids.min() < 0 or ids.max() >= m:
            raise ValueError(
                f"allowed ES id out of range [0, {m}) for client {client}: {ids.tolist()}"
            )
        out[client, ids] = True
    return out


def _capacity_vector(capacity: Any, n: int, m: int) -> np.ndarray:
    if capacity is None:
        return np.full(m, n, dtype=np.int64)
    cap = np.asarray(capacity)
    if cap.ndim == 0:
        cap = np.full(m, cap)
    if cap.shape != (m,):
        raise ValueError(f"capacity must be an int or have shape ({m},), got {cap.shape}")
    if not (np.issubdtype(cap.dtype, np.integer)
            or (np.issubdtype(cap.dtype, np.floating) and np.all(np.isfinite(cap))
                and np.all(cap == np.round(cap)))):
        raise ValueError("capacity must hold integers")
    cap = cap.astype(np.int64)
    if np.any(cap < 1):
        raise ValueError(f"capacity must be >= 1 per ES, got {cap.min()}")
    return cap
