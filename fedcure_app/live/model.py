"""What the live view shows: immutable snapshots of a running federation.

A driver (the deployed cloud, or the simulation engine) builds a :class:`StrategyView` after
every transition of its :class:`~fedcure_app.strategy.FedCureStrategy` (holding whatever lock
guards it: the cloud's, or none on the engine's own thread) and a :class:`LiveState` on demand
from it; the page, its event stream and the Prometheus scrape (:mod:`fedcure_app.live.server`,
:mod:`fedcure_app.live.metrics`) read only these frozen objects, so none of them holds the
driver's lock while writing to a socket.

What it carries is what ``Monitor.Status`` already reveals plus the method's figures, by
client and coalition id, and each client's name as it registered (its data folder's, or
``--name``; the names ``result.json`` lists): the page shows a client as ``NAME (#ID)``. The
names reach only a viewer of the run: the page, its stream and ``/api/state`` answer under the
live view's own access rule (loopback with a loopback ``Host`` by default, else the token;
:mod:`fedcure_app.live.server`); ``Monitor.Status``, which answers without a token, and
``/metrics`` (series keyed by id) carry no names. Never model weights, tokens or addresses.
Units: seconds (``*_s``), GHz (``*_ghz``); accuracy is a fraction in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedcure_app.trained.names import by_name

#: what ``phase`` may be
PHASES = ("registering", "training", "done")
#: what ``mode`` may be: the simulator, a deployment (``fedcure-cloud``, ``fedcure launch``),
#: or ``fedcure testbed`` (a deployment with emulated devices and links)
MODES = ("simulation", "deployment", "testbed")


def _num(x: Any) -> float | None:
    """A finite float, or None (JSON has no NaN/inf)."""
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def _count(x: Any) -> int | None:
    return None if x is None else int(x)


@dataclass(frozen=True)
class RoundPoint:
    """One global round: the arrival of coalition ``coalition``'s edge model.

    ``time_s``: seconds since round 0 was dispatched (wall clock in deployment, the simulated
    clock in simulation); ``latency_s``: the task's measured latency, ``estimate_s`` the T̂_m it
    was dispatched with; ``queues``: every virtual queue Λ_m after the round; ``accuracy``:
    the global model's test accuracy when it was evaluated after this round (else None);
    ``late``: answered after its deadline (a stale update); ``dropped``: clients the edge
    dropped from its rounds; ``evaluation_clients``/``evaluation_samples``: with federated
    evaluation, the clients and held-out samples the accuracy covers (None otherwise; not in
    the page's compact rows).
    """

    round: int
    time_s: float
    coalition: int
    version: int
    staleness: int
    xi: float
    latency_s: float
    estimate_s: float
    queues: tuple[float, ...]
    accuracy: float | None = None
    late: bool = False
    dropped: int = 0
    evaluation_clients: int | None = None
    evaluation_samples: int | None = None
    #: the evaluation's accuracy per class in label order (None: not evaluated; a class
    #: without samples None); not in the compact rows
    class_accuracy: tuple[float | None, ...] | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> "RoundPoint":
        """The point of one per-round record (the engine's or the cloud's keys)."""
        return cls(round=int(row["round"]), time_s=float(row["time_s"]),
                   coalition=int(row["coalition"]), version=int(row["version"]),
                   staleness=int(row["staleness"]), xi=float(row["xi"]),
                   latency_s=float(row["latency_s"]), estimate_s=float(row["estimate_s"]),
                   queues=tuple(float(q) for q in row["queues"]),
                   accuracy=_num(row.get("accuracy")), late=bool(row.get("late", False)),
                   dropped=len(row.get("dropped") or ()),
                   evaluation_clients=_count(row.get("evaluation_clients")),
                   evaluation_samples=_count(row.get("evaluation_samples")),
                   class_accuracy=None if not row.get("class_accuracy") else tuple(
                       _num(v) for v in row["class_accuracy"]))

    def to_json(self) -> list[Any]:
        """Compact row: see :data:`ROUND_FIELDS`."""
        return [self.round, round(self.time_s, 3), self.coalition, self.version, self.staleness,
                round(self.xi, 5), _num(self.latency_s), _num(self.estimate_s),
                [_num(q) for q in self.queues], self.accuracy, self.late, self.dropped]


#: the order of :meth:`RoundPoint.to_json`'s items (the page reads rows by these names)
ROUND_FIELDS = ("round", "time_s", "coalition", "version", "staleness", "xi", "latency_s",
                "estimate_s", "queues", "accuracy", "late", "dropped")


@dataclass(frozen=True)
class StrategyView:
    """The strategy's figures after its last transition (build with :meth:`of`, holding the
    lock that guards the strategy; read without it).

    Per coalition m: ``members`` (client ids), ``delta`` (target share δ_m), ``queues`` (Λ_m),
    ``t_hat_s`` (T̂_m, the whole task, seconds), ``rounds`` (global rounds it contributed),
    ``unavailable``; ``in_flight``: coalition → (global round it was sent in, client ids);
    per client id: ``directive_ghz`` (latest frequency directive) and ``applied_ghz`` (latest
    frequency it reported applying; absent when none reported); ``devices``: each client id's
    device type (its profile's name; empty when the driver does not know them); ``names``:
    each client id's name as it registered (empty when the driver has none).
    """

    version: int = 0
    round: int = 0
    tau_e: int = 1
    max_concurrent: int = 1
    members: tuple[tuple[int, ...], ...] = ()
    delta: tuple[float, ...] = ()
    queues: tuple[float, ...] = ()
    t_hat_s: tuple[float, ...] = ()
    rounds: tuple[int, ...] = ()
    unavailable: frozenset[int] = frozenset()
    in_flight: Mapping[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    directive_ghz: Mapping[int, float] = field(default_factory=dict)
    applied_ghz: Mapping[int, float] = field(default_factory=dict)
    history: tuple[RoundPoint, ...] = ()
    initial_accuracy: float | None = None
    devices: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, strategy: Any, records: Sequence[Mapping[str, Any]], tau_e: int,
           prev: "StrategyView | None" = None, initial_accuracy: float | None = None,
           devices: Sequence[str] | None = None,
           names: Sequence[str] | None = None) -> "StrategyView":
        """The view of ``strategy`` (a :class:`~fedcure_app.strategy.FedCureStrategy`) and its
        per-round ``records`` now. ``prev``: the last view, whose history is extended rather
        than rebuilt (its last point is rebuilt: an evaluation may have filled its accuracy);
        ``devices``: each client id's device type, ``names`` its name (default: ``prev``'s)."""
        n = len(records)
        keep = 0
        if prev is not None and 0 < len(prev.history) <= n:
            keep = len(prev.history) - 1
            if prev.history[keep].round != int(records[keep]["round"]):
                keep = 0  # rolled back and redone: rebuild
        history = (prev.history[:keep] if prev is not None and keep else ()) + tuple(
            RoundPoint.of(r) for r in records[keep:])
        directive = dict(prev.directive_ghz) if prev is not None and keep else {}
        applied = dict(prev.applied_ghz) if prev is not None and keep else {}
        for r in records[keep:]:
            directive.update({int(c): float(f) for c, f in r["frequencies_ghz"].items()})
            applied.update({int(c): float(f) for c, f in (r.get("applied_ghz") or {}).items()})
        in_flight = {}
        for m, d in sorted(strategy.in_flight.items()):
            in_flight[int(m)] = (int(d.round), tuple(int(c) for c in d.clients))
            directive.update({int(c): float(f) for c, f in d.frequencies_ghz.items()})
        return cls(
            version=int(strategy.version), round=int(strategy.round), tau_e=int(tau_e),
            max_concurrent=int(strategy.max_concurrent),
            members=tuple(tuple(int(c) for c in co) for co in strategy.coalitions),
            delta=tuple(float(x) for x in strategy.delta),
            queues=tuple(float(x) for x in np.asarray(strategy.scheduler.queues.values)),
            t_hat_s=tuple(float(x) for x in strategy.estimator.mean()),
            rounds=tuple(int(x) for x in _arrivals(history, len(strategy.coalitions))),
            unavailable=frozenset(int(m) for m in strategy.unavailable),
            in_flight=in_flight, directive_ghz=directive, applied_ghz=applied,
            history=history, initial_accuracy=_num(initial_accuracy),
            devices=tuple(str(d) for d in devices) if devices is not None
            else (prev.devices if prev is not None else ()),
            names=tuple(str(n) for n in names) if names is not None
            else (prev.names if prev is not None else ()))


def _arrivals(history: Sequence[RoundPoint], m: int) -> list[int]:
    out = [0] * m
    for p in history:
        if 0 <= p.coalition < m:
            out[p.coalition] += 1
    return out


@dataclass(frozen=True)
class Progress:
    """Where one coalition's task stands (an edge server's latest report): the edge round it
    trains (0-based) of ``tau_e``, the client ids still training, seconds since it was sent
    and the ETA against T̂_m."""

    coalition: int
    edge_round: int
    tau_e: int
    waiting: tuple[int, ...]
    elapsed_s: float
    eta_s: float


@dataclass(frozen=True)
class Counts:
    """Answers so far: edge models aggregated (``accepted``), answers after their deadline
    (``late``), clients an edge dropped from an edge round (``dropped``), tasks that expired
    unanswered (``expired``), and refused updates by reason."""

    accepted: int = 0
    late: int = 0
    dropped: int = 0
    expired: int = 0
    refused: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LiveState:
    """Everything the page and ``/metrics`` show, as of one moment (see the module docstring).

    ``source``: ``"cloud"`` or ``"simulation"``; ``clock``: ``"wall"`` or ``"simulated"``
    (what ``elapsed_s`` and the rounds' ``time_s`` count); ``mode``: one of :data:`MODES`
    (what the page's title calls the run); ``evaluation``: ``central`` (a test set) or
    ``federated`` (the clients' held-out parts, sample-weighted).
    """

    source: str = "cloud"
    clock: str = "wall"
    mode: str = "deployment"
    phase: str = "registering"
    global_rounds: int = 0
    clients_registered: int = 0
    expected_clients: int = 0
    edges_connected: int = 0
    num_edges: int = 0
    elapsed_s: float = 0.0
    view: StrategyView = field(default_factory=StrategyView)
    progress: tuple[Progress, ...] = ()
    counts: Counts = field(default_factory=Counts)
    evaluation: str = "central"
    #: the run's class names in label order (the per-class accuracy by name; empty: unknown)
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.evaluation not in ("central", "federated"):
            raise ValueError(f"evaluation must be central or federated, got "
                             f"{self.evaluation!r}")
        if self.mode not in MODES:
            raise ValueError(f"live view mode must be one of {', '.join(MODES)}, "
                             f"got {self.mode!r}")

    @property
    def version(self) -> int:
        return self.view.version

    @property
    def round(self) -> int:
        return self.view.round

    def coalition_rows(self) -> list[dict[str, Any]]:
        """The coalition table: members, edge (= coalition index), state, the edge round it
        trains and the clients it waits for, elapsed and ETA against T̂_m, δ_m, Λ_m and the
        share of rounds so far."""
        v = self.view
        by = {p.coalition: p for p in self.progress}
        total = max(1, sum(v.rounds))
        rows = []
        for m, members in enumerate(v.members):
            p = by.get(m)
            if m in v.unavailable:
                state = "unavailable"
            elif m in v.in_flight:
                state = "training"
            else:
                state = "idle"
            rows.append({
                "coalition": m, "edge": m, "members": list(members), "state": state,
                "sent_round": v.in_flight[m][0] if m in v.in_flight else None,
                "edge_round": p.edge_round if p else None, "tau_e": v.tau_e,
                "waiting": list(p.waiting) if p else [],
                "elapsed_s": _num(p.elapsed_s) if p else None,
                "eta_s": _num(p.eta_s) if p else None,
                "t_hat_s": _num(v.t_hat_s[m]) if m < len(v.t_hat_s) else None,
                "delta": v.delta[m] if m < len(v.delta) else None,
                "queue": v.queues[m] if m < len(v.queues) else None,
                "rounds": v.rounds[m] if m < len(v.rounds) else 0,
                "share": (v.rounds[m] / total) if m < len(v.rounds) else 0.0,
            })
        return rows

    def client_rows(self) -> list[dict[str, Any]]:
        """Per client id: its name (None when unknown), coalition, device type (None when
        unknown), latest frequency directive and applied frequency."""
        v = self.view
        where = {c: m for m, members in enumerate(v.members) for c in members}
        ids = sorted(set(where) | set(v.directive_ghz))
        return [{"client": c, "name": v.names[c] if 0 <= c < len(v.names) else None,
                 "coalition": where.get(c),
                 "device": v.devices[c] if 0 <= c < len(v.devices) else None,
                 "directive_ghz": _num(v.directive_ghz.get(c)),
                 "applied_ghz": _num(v.applied_ghz.get(c))} for c in ids]

    def to_json(self, since: int = 0) -> dict[str, Any]:
        """The page's event: everything but the rounds before index ``since`` (the page keeps
        those); ``history_from`` says where ``history`` starts."""
        v, c = self.view, self.counts
        since = max(0, min(int(since), len(v.history)))
        evaluated = [p for p in v.history if p.accuracy is not None]
        last = evaluated[-1] if evaluated else None
        return {
            "source": self.source, "clock": self.clock, "mode": self.mode,
            "phase": self.phase,
            "version": v.version, "round": v.round, "global_rounds": self.global_rounds,
            "clients_registered": self.clients_registered,
            "expected_clients": self.expected_clients,
            "edges_connected": self.edges_connected, "num_edges": self.num_edges,
            "elapsed_s": round(self.elapsed_s, 3), "tau_e": v.tau_e,
            "max_concurrent": v.max_concurrent,
            "initial_accuracy": v.initial_accuracy,
            "accuracy": last.accuracy if last else None,
            # federated: the clients and held-out samples the last accuracy covers
            "evaluation": self.evaluation,
            "evaluation_clients": last.evaluation_clients if last else None,
            "evaluation_samples": last.evaluation_samples if last else None,
            # the last evaluation's accuracy per class, by name
            "class_accuracy": by_name(last.class_accuracy, self.classes) if last else None,
            "coalitions": self.coalition_rows(), "clients": self.client_rows(),
            "counts": {"accepted": c.accepted, "late": c.late, "dropped": c.dropped,
                       "expired": c.expired, "refused": dict(c.refused)},
            "round_fields": list(ROUND_FIELDS), "history_from": since,
            "history": [p.to_json() for p in v.history[since:]],
        }

    def with_(self, **changes: Any) -> "LiveState":
        """A copy with ``changes``."""
        return replace(self, **changes)


__all__ = ["Counts", "LiveState", "MODES", "PHASES", "Progress", "ROUND_FIELDS", "RoundPoint",
           "StrategyView"]
