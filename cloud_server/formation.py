"""Coalition bookkeeping of the cloud that does not depend on the rule: client order, the
initial client→ES association from home ESs, and no coalition left empty.

The rules themselves (``none``, ``kmeans``, ``meanshift``, ``fedcure``, ``selfish``,
``pareto``) are dispatched by :func:`fedcure_app.federation.form`, shared with the simulation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np


def natural_key(name: str) -> list[Any]:
    """Sort key putting ``c2`` before ``c10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def fill_empty_coalitions(assignment: np.ndarray, num_edges: int) -> tuple[np.ndarray, list[str]]:
    """Give every empty coalition one client from the largest one (needs N ≥ M).

    Returns the new assignment and a note per move. Deterministic: the moved client is the
    highest id of the largest coalition (lowest coalition index on ties).
    """
    a = np.asarray(assignment, dtype=np.int64).copy()
    notes: list[str] = []
    if a.size < num_edges:
        raise ValueError(f"{a.size} clients cannot fill {num_edges} coalitions")
    while True:
        sizes = np.bincount(a, minlength=num_edges)
        empty = np.flatnonzero(sizes == 0)
        if empty.size == 0:
            return a, notes
        big = int(np.argmax(sizes))
        moved = int(np.flatnonzero(a == big).max())
        a[moved] = int(empty[0])
        notes.append(f"client {moved} moved from coalition {big} to empty coalition {empty[0]}")


def initial_partition(homes: Sequence[int | None], num_edges: int) -> tuple[np.ndarray, list[str]]:
    """The initial client→ES association from the clients' home ESs.

    Clients without a home ES join the ES with the fewest clients so far (lowest index on ties);
    ESs nobody calls home get one client from the largest (see :func:`fill_empty_coalitions`).
    """
    a = np.full(len(homes), -1, dtype=np.int64)
    for i, h in enumerate(homes):
        if h is not None:
            a[i] = int(h)
    sizes = np.bincount(a[a >= 0], minlength=num_edges)
    for i in np.flatnonzero(a < 0):
        e = int(np.argmin(sizes))
        a[i] = e
        sizes[e] += 1
    return fill_empty_coalitions(a, num_edges)


__all__ = ["fill_empty_coalitions", "initial_partition", "natural_key"]
