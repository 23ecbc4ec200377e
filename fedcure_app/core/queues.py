"""Virtual queues of the scheduling rule (Lyapunov drift-plus-penalty).

    Λ_m(−1) = −δ_m,   Λ_m(t) = max(Λ_m(t−1) + δ_m − χ_m(t), 0),   δ_m = κ·|D_m|/|D|,

with χ_m(t) = 1 when coalition m was dispatched in global round t. Λ_m grows while coalition m
gets less than its share δ_m of rounds; keeping every Λ_m(T)/T → 0 (mean-rate stability)
guarantees each coalition a long-run participation rate of at least δ_m.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from fedcure_app.core._checks import finite_array, finite_float


def queue_deltas(sample_counts, kappa: float) -> np.ndarray:
    """δ_m = κ·|D_m|/|D| from per-coalition sample counts |D_m| (≥ 0, not all 0) and κ > 0."""
    counts = finite_array(sample_counts, "sample_counts", ndim=1)
    if counts.size == 0:
        raise ValueError("sample_counts needs at least one coalition")
    if np.any(counts < 0):
        raise ValueError("sample_counts must be non-negative")
    total = counts.sum()
    if total <= 0:
        raise ValueError("sample_counts are all zero")
    k = finite_float(kappa, "kappa", low=0.0, low_open=True)
    return k * counts / total


def scheduled_indicator(scheduled: Iterable[int], num_coalitions: int) -> np.ndarray:
    """χ(t) as a 0/1 float vector from the ids of the coalitions dispatched in the round."""
    ids = [int(i) for i in scheduled]
    if ids and (min(ids) < 0 or max(ids) >= num_coalitions):
        raise ValueError(f"scheduled coalition ids must be in [0, {num_coalitions}), "
                         f"got {sorted(set(ids))}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"a coalition is scheduled twice in one round: {ids}")
    chi = np.zeros(num_coalitions)
    chi[ids] = 1.0
    return chi


class VirtualQueues:
    """Λ_m for M coalitions; starts at Λ(−1) = −δ."""

    def __init__(self, delta) -> None:
        d = finite_array(delta, "delta", ndim=1)
        if d.size == 0:
            raise ValueError("delta needs at least one coalition")
        if np.any(d < 0):
            raise ValueError("delta must be non-negative")
        self._delta = d.copy()
        self._values = -d.copy()
        self.rounds = 0

    @property
    def delta(self) -> np.ndarray:
        return self._delta.copy()

    @property
    def values(self) -> np.ndarray:
        """Current Λ_m(t) (a copy), shape (M,)."""
        return self._values.copy()

    @property
    def num_coalitions(self) -> int:
        return int(self._delta.size)

    def update(self, chi) -> np.ndarray:
        """One global round: Λ ← max(Λ + δ − χ, 0); returns the new values.

        ``chi`` is either a numpy array of shape (M,) holding 0/1 (the indicator χ(t)) or any
        other iterable of the scheduled coalition ids (a list, tuple, set or range; may be
        empty). A Python list is always read as ids.
        """
        m = self.num_coalitions
        if isinstance(chi, np.ndarray):
            if chi.shape != (m,):
                raise ValueError(f"chi indicator must have shape ({m},), got {chi.shape}")
            x = chi.astype(np.float64)
            if not np.all((x == 0.0) | (x == 1.0)):
                raise ValueError("chi indicator must hold only 0 and 1")
        else:
            x = scheduled_indicator(chi, m)
        return self._step(x)

    def _step(self, chi: np.ndarray) -> np.ndarray:
        """Λ ← max(Λ + δ − χ, 0) for an already checked indicator."""
        self._values += self._delta
        self._values -= chi
        np.maximum(self._values, 0.0, out=self._values)
        self.rounds += 1
        return self.values

    def state_dict(self) -> dict[str, Any]:
        return {"delta": self._delta.tolist(), "values": self._values.tolist(),
                "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            d = finite_array(state["delta"], "delta", ndim=1)
            v = finite_array(state["values"], "values", ndim=1)
            rounds = int(state.get("rounds", 0))
        except KeyError as err:
            raise ValueError(f"queue state lacks {err.args[0]!r}") from None
        if d.shape != self._delta.shape or v.shape != self._delta.shape:
            raise ValueError(f"queue state is for {d.size} coalitions, expected "
                             f"{self.num_coalitions}")
        if np.any(d < 0):
            raise ValueError("queue state has negative delta")
        self._delta = d.copy()
        self._values = v.copy()
        self.rounds = rounds
