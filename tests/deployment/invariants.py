"""The invariants of a cloud's history of accepted updates, checked after a run under faults
(``bench/soak.py`` and ``tests/testbed/test_partitions.py``).

``records`` are ``result.json``'s (or the checkpoint's) records, one per accepted update in the
order the cloud applied them (keys ``version``, ``task_id``, ``staleness``, ``xi``, ...).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np


def version_problems(records: Sequence[dict[str, Any]]) -> list[str]:
    """What breaks "global versions 1..N, one aggregation per task" (empty when nothing)."""
    problems = []
    versions = [r["version"] for r in records]
    if versions != list(range(1, len(records) + 1)):
        problems.append(f"versions are not 1..{len(records)}: {versions[:20]}")
    twice = sorted(t for t, n in Counter(r["task_id"] for r in records).items() if n > 1)
    if twice:
        problems.append(f"tasks aggregated more than once: {twice[:10]}")
    return problems


def lost_updates(records: Sequence[dict[str, Any]], told: Iterable[tuple[str, int]],
                 key: str = "version") -> list[tuple[str, int]]:
    """The (task id, value) pairs an edge was told were accepted whose record is missing or has
    another ``key`` (``version``, or ``round`` where the reply named the round)."""
    by_task = {r["task_id"]: r for r in records}
    return [(t, int(v)) for t, v in told if by_task.get(t, {}).get(key) != int(v)]


def replay(initial: list[np.ndarray], records: Sequence[dict[str, Any]],
           edge_model: Callable[[list[np.ndarray], str], list[np.ndarray]]
           ) -> list[np.ndarray]:
    """The global model rebuilt from ``initial`` by applying every record's update in order:
    ``ω ← (1 − ξ)·ω + ξ·ω_m`` with ω_m = ``edge_model(base model, task id)`` and the base the
    version the task trained from (``version − 1 − staleness``)."""
    from fedcure_app.core.aggregation import cloud_update

    models = {0: initial}
    glob = initial
    for r in records:
        base = r["version"] - 1 - r["staleness"]
        glob = cloud_update(glob, edge_model(models[base], r["task_id"]), r["xi"])
        models[r["version"]] = glob
    return glob


def same_model(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """Bit-for-bit equal tensors, in order."""
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


__all__ = ["lost_updates", "replay", "same_model", "version_problems"]
