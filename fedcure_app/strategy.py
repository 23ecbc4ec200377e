"""The cloud's asynchronous FedCure strategy: a transport-free state machine.

The same object runs inside the simulation engine (simulated clock) and inside the cloud server
(wall clock, gRPC). It never trains and never talks to the network:

- :meth:`FedCureStrategy.on_arrival` takes one edge model: staleness-weighted aggregation
  ω ← (1 − ξ)·ω + ξ·ω_m with ξ = ℓ·k^φ, latency estimator update, global version bump.
  One arrival is one *global round* (DESIGN.md).
- :meth:`FedCureStrategy.dispatch` fills the free training slots (at most K coalitions at once)
  with scheduler decisions, updates every virtual queue once for the round, and returns per
  coalition the global model version to train from and each client's CPU-frequency directive
  (Theorem 2 with T̂ = the coalition's estimated per-edge-round latency).

Round 0 dispatches every coalition (DESIGN.md); afterwards an arrival frees a slot and the
scheduler refills free slots only while fewer than K coalitions are training.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcure_app.config import MethodConfig
from fedcure_app.core.aggregation import cloud_update, staleness_weight
from fedcure_app.core.allocation import optimal_frequency
from fedcure_app.core.estimator import LatencyEstimator
from fedcure_app.core.scheduler import make_scheduler, queue_deltas

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dispatch:
    """One coalition sent off to train.

    ``frequencies_ghz`` maps client id → CPU-frequency directive (GHz); ``t_hat_round_s`` is the
    estimated per-edge-round latency (seconds) the directive was computed for.
    """

    round: int
    coalition: int
    version: int
    clients: tuple[int, ...]
    frequencies_ghz: dict[int, float]
    t_hat_round_s: float
    t_hat_s: float

    def to_state(self) -> dict[str, Any]:
        """JSON-safe form for a checkpoint (the coalition is the key it is stored under)."""
        return {
            "round": self.round,
            "version": self.version,
            "clients": list(self.clients),
            "frequencies_ghz": {str(k): v for k, v in self.frequencies_ghz.items()},
            "t_hat_round_s": self.t_hat_round_s,
            "t_hat_s": self.t_hat_s,
        }

    @classmethod
    def from_state(cls, coalition: int, d: dict[str, Any]) -> Dispatch:
        """The dispatch :meth:`to_state` saved for ``coalition``."""
        return cls(
            round=int(d["round"]),
            coalition=int(coalition),
            version=int(d["version"]),
            clients=tuple(int(c) for c in d["clients"]),
            frequencies_ghz={int(k): float(v) for k, v in d["frequencies_ghz"].items()},
            t_hat_round_s=float(d["t_hat_round_s"]),
            t_hat_s=float(d["t_hat_s"]),
        )


@dataclass(frozen=True)
class EdgeUpdate:
    """An edge model arriving at the cloud.

    ``base_version``: the global version the coalition trained from; ``latency_s``: the
    coalition's measured (or simulated) latency from dispatch to arrival, seconds.
    """

    coalition: int
    base_version: int
    arrays: list[np.ndarray]
    num_samples: int
    latency_s: float


@dataclass
class RoundRecord:
    """What happened in one global round (one arrival)."""

    round: int
    coalition: int
    staleness: int
    xi: float
    latency_s: float
    estimate_s: float
    version: int
    queues: list[float]
    dispatched: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


class FedCureStrategy:
    """Cloud state: global model, version, scheduler + queues, estimator, in-flight coalitions.

    Parameters
    ----------
    method:
        The method's knobs (ℓ, k, β, κ, α, γ, ς, τ_e, K, scheduler).
    coalitions:
        Client ids per coalition (M lists, none empty).
    client_samples:
        |D_n| per client id (length N).
    client_cycles:
        CPU cycles each client needs for one edge round (τ_c local steps), length N.
    client_f_range_ghz:
        (f_min, f_max) per client, shape (N, 2), GHz.
    prior_latency_s:
        Device-profile prediction of each coalition's latency (seconds, whole global task:
        τ_e edge rounds + edge↔cloud transfer), length M.
    initial_arrays:
        The initial global model.
    max_concurrent:
        K; ``None`` means ⌈M/2⌉.
    calibrate_prior:
        Rescale every coalition's latency prior by the observed/predicted ratio (see
        :mod:`fedcure_app.core.estimator`): on for measured (deployed) latencies.
    warmup_tasks:
        Each coalition's first arrivals that the estimator does not learn from (a deployed
        coalition's first task also pays processes and caches warming up, beyond the start-up
        its edge reports); they are aggregated as any other.
    """

    def __init__(
        self,
        method: MethodConfig,
        coalitions: list[list[int]],
        client_samples: np.ndarray,
        client_cycles: np.ndarray,
        client_f_range_ghz: np.ndarray,
        prior_latency_s: np.ndarray,
        initial_arrays: list[np.ndarray],
        *,
        max_concurrent: int | None = None,
        seed: int = 0,
        calibrate_prior: bool = False,
        warmup_tasks: int = 0,
    ) -> None:
        m = len(coalitions)
        if m == 0 or any(len(c) == 0 for c in coalitions):
            raise ValueError("every coalition needs at least one client")
        self.method = method
        self.coalitions = [tuple(int(c) for c in co) for co in coalitions]
        self.client_samples = np.asarray(client_samples, dtype=np.float64)
        self.client_cycles = np.asarray(client_cycles, dtype=np.float64)
        self.client_f_range = np.asarray(client_f_range_ghz, dtype=np.float64)
        prior = np.asarray(prior_latency_s, dtype=np.float64)
        if prior.shape != (m,) or not np.all(np.isfinite(prior)) or np.any(prior <= 0):
            raise ValueError(f"prior_latency_s must be {m} positive finite seconds")
        k = max_concurrent if max_concurrent is not None else method.max_concurrent
        self.max_concurrent = int(k) if k is not None else max(1, math.ceil(m / 2))
        if not 1 <= self.max_concurrent <= m:
            raise ValueError(f"max_concurrent K={self.max_concurrent} must be in [1, {m}]")

        sizes = np.array([self.client_samples[list(c)].sum() for c in self.coalitions])
        self.delta = queue_deltas(sizes, method.kappa)
        self.scheduler = make_scheduler(method.scheduler, self.delta, beta=method.beta, seed=seed)
        self.estimator = LatencyEstimator(prior, calibrate=calibrate_prior)
        if warmup_tasks < 0:
            raise ValueError(f"warmup_tasks must be >= 0, got {warmup_tasks}")
        self.warmup_tasks = int(warmup_tasks)
        self.global_arrays = [np.array(a, copy=True) for a in initial_arrays]
        self.version = 0
        self.round = 0
        #: coalition -> the Dispatch it is training for
        self.in_flight: dict[int, Dispatch] = {}
        #: coalitions the cloud may schedule (idle and reachable)
        self.unavailable: set[int] = set()
        self.participation = np.zeros(m, dtype=np.int64)
        self._started = False

    # ------------------------------------------------------------------ properties
    @property
    def num_coalitions(self) -> int:
        return len(self.coalitions)

    def available(self) -> list[int]:
        """Idle coalitions that may be scheduled now."""
        return [
            m for m in range(self.num_coalitions)
            if m not in self.in_flight and m not in self.unavailable
        ]

    # ------------------------------------------------------------------ the two transitions
    def on_arrival(self, update: EdgeUpdate) -> RoundRecord:
        """Aggregate one edge model (one global round) and return the round's record.

        The coalition must be in flight and must have trained from the version it was sent.
        """
        m = update.coalition
        sent = self.in_flight.get(m)
        if sent is None:
            raise ValueError(f"coalition {m} is not training; no arrival expected from it")
        if update.base_version != sent.version:
            raise ValueError(
                f"coalition {m} trained from version {update.base_version}, "
                f"but was sent version {sent.version}"
            )
        self._check_model(update)
        record = self._mix(update, self.version - update.base_version)
        del self.in_flight[m]
        return record

    def dispatch(self) -> list[Dispatch]:
        """Fill free slots with scheduler decisions and update the queues once for this round.

        Round 0 (the first call) dispatches every available coalition. Returns the new
        dispatches (possibly none: all slots busy or no coalition available).
        """
        estimates = self.estimator.mean()
        chosen: list[int] = []
        if not self._started:
            chosen = self.available()
            self._started = True
        else:
            free = self.max_concurrent - len(self.in_flight)
            candidates = self.available()
            while free > 0 and candidates:
                pick = int(self.scheduler.select(candidates, estimates))
                chosen.append(pick)
                candidates.remove(pick)
                free -= 1
        self.scheduler.end_round(chosen)
        out = [self._make_dispatch(m, estimates) for m in chosen]
        for d in out:
            self.in_flight[d.coalition] = d
        return out

    def _make_dispatch(self, m: int, estimates: np.ndarray) -> Dispatch:
        """Frequency directives for coalition m (Theorem 2, T̂ per edge round)."""
        clients = self.coalitions[m]
        t_hat = float(estimates[m])
        t_hat_round = t_hat / self.method.tau_e
        idx = np.asarray(clients)
        f = optimal_frequency(
            self.client_cycles[idx],
            t_hat_round,
            alpha=self.method.alpha,
            gamma=self.method.gamma,
            varsigma=self.method.varsigma,
            f_min_ghz=self.client_f_range[idx, 0],
            f_max_ghz=self.client_f_range[idx, 1],
        )
        freqs = {int(c): float(v) for c, v in zip(clients, np.atleast_1d(f))}
        return Dispatch(
            round=self.round,
            coalition=m,
            version=self.version,
            clients=clients,
            frequencies_ghz=freqs,
            t_hat_round_s=t_hat_round,
            t_hat_s=t_hat,
        )

    def refill(self) -> list[Dispatch]:
        """Fill free slots without closing a round (queues unchanged): after a coalition was
        lost mid-task, so that training goes on with the others. Before round 0: no-op."""
        if not self._started:
            return []
        estimates = self.estimator.mean()
        free = self.max_concurrent - len(self.in_flight)
        candidates = self.available()
        out: list[Dispatch] = []
        while free > 0 and candidates:
            pick = int(self.scheduler.select(candidates, estimates))
            candidates.remove(pick)
            free -= 1
            d = self._make_dispatch(pick, estimates)
            self.in_flight[d.coalition] = d
            out.append(d)
        return out

    def on_late_arrival(self, update: EdgeUpdate, max_staleness: int) -> RoundRecord:
        """Aggregate the answer to an expired task as a stale update (one global round).

        The coalition's task was dropped when its deadline passed (:meth:`mark_unavailable`),
        so it is not in flight; its model trained from ``base_version`` is mixed in with
        ξ = ℓ·k^φ, φ = version − base_version, when φ ≤ ``max_staleness`` (else ValueError,
        nothing changed). The estimator learns the (long) measured latency.
        """
        m = update.coalition
        if not 0 <= m < self.num_coalitions:
            raise ValueError(f"coalition {m} outside [0, {self.num_coalitions})")
        if not 0 <= update.base_version <= self.version:
            raise ValueError(f"base version {update.base_version} outside [0, {self.version}]")
        staleness = self.version - update.base_version
        if staleness > max_staleness:
            raise ValueError(f"staleness {staleness} exceeds the late-answer bound "
                             f"{max_staleness}")
        self._check_model(update)
        record = self._mix(update, staleness)
        record.extra["late"] = True
        return record

    def _check_model(self, update: EdgeUpdate) -> None:
        """ValueError unless the edge model has this model's tensor count and its latency is
        positive finite seconds."""
        if len(update.arrays) != len(self.global_arrays):
            raise ValueError(
                f"edge model has {len(update.arrays)} tensors, expected {len(self.global_arrays)}"
            )
        if not math.isfinite(update.latency_s) or update.latency_s <= 0:
            raise ValueError(f"latency must be positive seconds, got {update.latency_s}")

    def _mix(self, update: EdgeUpdate, staleness: int) -> RoundRecord:
        """One global round: ω ← (1 − ξ)·ω + ξ·ω_m with ξ = ℓ·k^φ (φ = ``staleness``), the
        estimator learns the latency, version and round advance."""
        m = update.coalition
        xi = staleness_weight(staleness, self.method.ell, self.method.k)
        self.global_arrays = cloud_update(self.global_arrays, update.arrays, xi)
        estimate = float(self.estimator.mean()[m])
        warmup = bool(self.participation[m] < self.warmup_tasks)
        if not warmup:
            self.estimator.update(m, update.latency_s)
        self.version += 1
        self.round += 1
        self.participation[m] += 1
        record = RoundRecord(round=self.round, coalition=m, staleness=staleness, xi=xi,
                             latency_s=float(update.latency_s), estimate_s=estimate,
                             version=self.version, queues=[], dispatched=[])
        if warmup:
            record.extra["warmup"] = True
        return record

    # ------------------------------------------------------------------ undo
    def undo_point(self) -> dict[str, Any]:
        """Everything a transition may change, to :meth:`rollback` to if what follows it fails
        (the global tensors are kept by reference: transitions replace them, never write)."""
        return {
            "global_arrays": list(self.global_arrays),
            "version": self.version, "round": self.round, "started": self._started,
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "estimator": copy.deepcopy(self.estimator.state_dict()),
            "in_flight": dict(self.in_flight), "unavailable": set(self.unavailable),
            "participation": self.participation.copy(),
        }

    def rollback(self, point: dict[str, Any]) -> None:
        """Return to an :meth:`undo_point` (nothing of what happened since remains)."""
        self.global_arrays = list(point["global_arrays"])
        self.version, self.round, self._started = (point["version"], point["round"],
                                                   point["started"])
        self.scheduler.load_state_dict(copy.deepcopy(point["scheduler"]))
        self.estimator.load_state_dict(copy.deepcopy(point["estimator"]))
        self.in_flight = dict(point["in_flight"])
        self.unavailable = set(point["unavailable"])
        self.participation = point["participation"].copy()

    # ------------------------------------------------------------------ availability
    def mark_unavailable(self, m: int) -> None:
        """Take coalition m out of scheduling (its ES is gone); drops its in-flight task."""
        self.unavailable.add(m)
        self.in_flight.pop(m, None)

    def mark_available(self, m: int) -> None:
        """Let coalition m be scheduled again (its ES is back)."""
        self.unavailable.discard(m)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """All cloud state, JSON-safe except the model arrays (kept as numpy arrays)."""
        return {
            "version": self.version,
            "round": self.round,
            "started": self._started,
            "global_arrays": [np.array(a, copy=True) for a in self.global_arrays],
            "scheduler": self.scheduler.state_dict(),
            "estimator": self.estimator.state_dict(),
            "in_flight": {str(m): d.to_state() for m, d in self.in_flight.items()},
            "unavailable": sorted(self.unavailable),
            "participation": self.participation.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (same coalitions and configuration)."""
        arrays = [np.asarray(a) for a in state["global_arrays"]]
        if len(arrays) != len(self.global_arrays) or any(
            a.shape != b.shape for a, b in zip(arrays, self.global_arrays)
        ):
            raise ValueError("checkpoint model does not match this strategy's model")
        self.global_arrays = [np.array(a, copy=True) for a in arrays]
        self.version = int(state["version"])
        self.round = int(state["round"])
        self._started = bool(state["started"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.estimator.load_state_dict(state["estimator"])
        self.in_flight = {int(m): Dispatch.from_state(int(m), d)
                          for m, d in state["in_flight"].items()}
        self.unavailable = {int(m) for m in state["unavailable"]}
        self.participation = np.asarray(state["participation"], dtype=np.int64)
