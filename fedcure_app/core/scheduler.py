"""Coalition schedulers: which available coalition trains next (the scheduling rule).

All schedulers share one interface and all keep virtual queues (so every method can report
them):

- ``fedcure``: π(t) = argmax_{m available} Λ_m(t) + β·(1 − T̂_m(t)/I), I = mean of T̂ over all M
  coalitions (the average maximum training latency);
- ``greedy``: the fastest available coalition, argmin T̂_m;
- ``fair``: the longest queue, argmax Λ_m;
- ``random``: uniform over the available coalitions (own seeded generator).

Ties go to the lowest coalition index. Per DESIGN.md a global round is one arrival; the caller
runs :meth:`Scheduler.select` for every free slot and then :meth:`Scheduler.end_round` once with
the coalitions dispatched in that round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedcure_app.core._checks import choice, finite_array, finite_float, positive_int
from fedcure_app.core.queues import VirtualQueues, queue_deltas, scheduled_indicator

__all__ = [
    "SCHEDULERS",
    "Scheduler",
    "FedCureScheduler",
    "GreedyScheduler",
    "FairScheduler",
    "RandomScheduler",
    "VirtualQueues",
    "make_scheduler",
    "queue_deltas",
    "scheduled_indicator",
]

SCHEDULERS = ("fedcure", "greedy", "fair", "random")


class Scheduler:
    """Base class: queues, input checks, checkpointing. Subclasses implement :meth:`_pick`."""

    name = "base"

    def __init__(self, delta, beta: float = 0.5, seed: int = 0) -> None:
        self.queues = VirtualQueues(delta)
        self.beta = finite_float(beta, "beta", low=0.0)
        self.seed = positive_int(seed, "seed", minimum=0)

    @property
    def num_coalitions(self) -> int:
        return self.queues.num_coalitions

    def _inputs(self, available: Sequence[int], estimates) -> tuple[np.ndarray, np.ndarray]:
        m = self.num_coalitions
        avail = np.asarray(available)
        if avail.ndim != 1 or avail.size == 0:
            raise ValueError("no coalition is available to schedule")
        if not np.issubdtype(avail.dtype, np.integer):
            raise ValueError(f"available coalition ids must be integers, got {avail.dtype}")
        avail = np.sort(avail.astype(np.int64))
        if avail[0] < 0 or avail[-1] >= m:
            raise ValueError(f"available coalition ids must be in [0, {m}), got "
                             f"{avail[0] if avail[0] < 0 else avail[-1]}")
        if avail.size > 1 and np.any(avail[1:] == avail[:-1]):
            raise ValueError("available coalition ids contain duplicates")
        est = np.asarray(estimates, dtype=np.float64)
        if est.shape != (m,):
            raise ValueError(f"estimates must have shape ({m},), got {est.shape}")
        if not (est.min() > 0.0 and est.max() < np.inf):  # also false for NaN
            raise ValueError("latency estimates must be positive finite seconds")
        return avail, est

    def select(self, available: Sequence[int], estimates) -> int:
        """Pick one coalition among ``available`` given the latency estimates T̂ (M,) seconds."""
        avail, est = self._inputs(available, estimates)
        return int(avail[self._pick(avail, est)])

    def _pick(self, avail: np.ndarray, est: np.ndarray) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def end_round(self, scheduled: Sequence[int]) -> np.ndarray:
        """Close a global round: update every queue once with χ_m = 1 for ``scheduled``."""
        return self.queues._step(scheduled_indicator(scheduled, self.num_coalitions))

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "beta": self.beta, "seed": self.seed,
                "queues": self.queues.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"scheduler state is for {state.get('name')!r}, not {self.name!r}")
        self.beta = finite_float(state["beta"], "beta", low=0.0)
        self.queues.load_state_dict(state["queues"])


class FedCureScheduler(Scheduler):
    """argmax Λ_m + β(1 − T̂_m/I) over the available coalitions."""

    name = "fedcure"

    def _pick(self, avail: np.ndarray, est: np.ndarray) -> int:
        scale = est.mean()
        score = self.queues._values[avail] + self.beta * (1.0 - est[avail] / scale)
        return int(np.argmax(score))


class GreedyScheduler(Scheduler):
    """The fastest available coalition."""

    name = "greedy"

    def _pick(self, avail: np.ndarray, est: np.ndarray) -> int:
        return int(np.argmin(est[avail]))


class FairScheduler(Scheduler):
    """The available coalition with the longest virtual queue."""

    name = "fair"

    def _pick(self, avail: np.ndarray, est: np.ndarray) -> int:
        return int(np.argmax(self.queues._values[avail]))


class RandomScheduler(Scheduler):
    """Uniform over the available coalitions, with its own seeded generator."""

    name = "random"

    def __init__(self, delta, beta: float = 0.5, seed: int = 0) -> None:
        super().__init__(delta, beta, seed)
        self.rng = np.random.default_rng(self.seed)

    def _pick(self, avail: np.ndarray, est: np.ndarray) -> int:
        return int(self.rng.integers(avail.size))

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["rng"] = self.rng.bit_generator.state
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]


_CLASSES: dict[str, type[Scheduler]] = {
    "fedcure": FedCureScheduler,
    "greedy": GreedyScheduler,
    "fair": FairScheduler,
    "random": RandomScheduler,
}


def make_scheduler(name: str, delta, beta: float = 0.5, seed: int = 0) -> Scheduler:
    """A scheduler by name (``fedcure``, ``greedy``, ``fair``, ``random``) with queues for δ."""
    key = choice(name, "scheduler", SCHEDULERS)
    return _CLASSES[key](finite_array(delta, "delta", ndim=1), beta=beta, seed=seed)
