"""The cloud's state: the types several of its objects read, each passed to them explicitly.

Nothing here knows gRPC or the event loop. :class:`~cloud_server.controller.CloudController`
owns one of each and hands them to the collaborators that need them:

- :class:`Roster` of :class:`ClientEntry`: who takes part (the registered clients, their claimed
  partitions, the edges' addresses and connections), changed by
  :class:`cloud_server.registry.Registry`'s rules;
- :class:`Federation`: the formed federation (clients in id order, assignments, the
  :class:`~fedcure_app.strategy.FedCureStrategy`), made once at formation or resumption;
- :class:`RunLog`: what the run records (rounds, faults, warnings) and its clock;
- :class:`TaskBook`: every dispatched :class:`TaskState` by id, and the encoded global model;
- :class:`RoundView` and :class:`StatusSnapshot`: immutable views for readers that must not take
  the controller's lock (``Monitor.Status``; the live view and ``/metrics`` read
  :class:`fedcure_app.live.model.StrategyView`, published beside them);
- :class:`Tally`: counts of late, expired and refused answers (its own small lock);
- :class:`Phase`, :class:`Arrival`, and the checkpoint forms (``to_state``/``from_state``).
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.devices import DeviceProfile, PopulationArrays
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import WithModel, encode_arrays
from fedcure_app.strategy import Dispatch, FedCureStrategy
from fedcure_app.tasks import derive_seed
from cloud_server.failover import task_deadline_s
from cloud_server.progress import ProgressRow


class Phase(enum.IntEnum):
    """Where the run stands; the values are ``Monitor.Status``'s ``StatusReply.Phase``."""

    REGISTERING = pb.StatusReply.REGISTERING  # waiting for clients (formation may be running)
    TRAINING = pb.StatusReply.TRAINING  # coalitions formed, tasks flowing
    DONE = pb.StatusReply.DONE  # global_rounds reached (results being or already written)


@dataclass
class ClientEntry:
    """One registered client: what it announced and, after formation, its ids."""

    name: str
    label_counts: np.ndarray
    profile: DeviceProfile
    home_edge: int | None
    client_id: int | None = None
    edge_id: int | None = None
    #: the client's SuperNode public key (OpenSSH text) for SuperNode authentication; "" none
    supernode_key: str = ""
    #: where the client trains: ``cpu`` or ``cuda``
    compute_device: str = "cpu"
    #: its measured training rate (samples/s) on the run's model; 0: not measured
    samples_per_s: float = 0.0
    #: the training samples it holds as it reported them (0: the sum of ``label_counts``,
    #: which are exact unless ``histogram_epsilon`` > 0)
    num_samples: int = 0
    #: the ε of the Laplace noise on its ``label_counts`` (0: exact counts)
    histogram_epsilon: float = 0.0

    @property
    def samples(self) -> int:
        """|D_n|: the reported sample count, else the sum of the label counts."""
        return int(self.num_samples) if self.num_samples > 0 else int(self.label_counts.sum())

    def to_state(self) -> dict[str, Any]:
        """JSON-safe form for the checkpoint."""
        return {"name": self.name, "label_counts": self.label_counts.tolist(),
                "profile": self.profile.model_dump(mode="json"), "home_edge": self.home_edge,
                "client_id": self.client_id, "edge_id": self.edge_id,
                "supernode_key": self.supernode_key, "compute_device": self.compute_device,
                "samples_per_s": self.samples_per_s, "num_samples": int(self.num_samples),
                "histogram_epsilon": float(self.histogram_epsilon)}

    @classmethod
    def from_state(cls, c: dict[str, Any]) -> "ClientEntry":
        """Inverse of :meth:`to_state` (a formed client: ids set)."""
        return cls(c["name"], np.asarray(c["label_counts"], dtype=np.int64),
                   DeviceProfile(**c["profile"]), c["home_edge"], int(c["client_id"]),
                   int(c["edge_id"]), supernode_key=str(c.get("supernode_key", "")),
                   compute_device=str(c.get("compute_device", "cpu")),
                   samples_per_s=float(c.get("samples_per_s", 0.0)),
                   num_samples=int(c.get("num_samples", 0)),
                   histogram_epsilon=float(c.get("histogram_epsilon", 0.0)))


@dataclass
class Roster:
    """Who takes part in a run: the registered clients by name, the partition each name
    claimed, the address each edge last connected with ("" never) and the edges whose newest
    stream is open."""

    num_edges: int
    expected_clients: int
    clients: dict[str, ClientEntry] = field(default_factory=dict)
    claims: dict[str, int] = field(default_factory=dict)
    edge_addresses: dict[int, str] = field(default_factory=dict)
    connected: set[int] = field(default_factory=set)
    #: clients that withdrew (or were refused) before formation: name -> reason; formation
    #: no longer waits for them
    withdrawn: dict[str, str] = field(default_factory=dict)

    @property
    def awaited(self) -> int:
        """Clients formation waits for: the expected ones less those that withdrew."""
        return max(0, self.expected_clients - len(self.withdrawn))

    def __post_init__(self) -> None:
        for m in range(self.num_edges):
            self.edge_addresses.setdefault(m, "")

    def by_id(self) -> list[ClientEntry]:
        """The clients sorted by their ids (given at formation)."""
        return sorted(self.clients.values(), key=lambda c: c.client_id or 0)

    def restore(self, clients: list[ClientEntry], claims: dict[str, int],
                edges: dict[int, str]) -> None:
        """The clients, claims and edge addresses of a checkpoint."""
        self.clients = {c.name: c for c in clients}
        self.claims = dict(claims)
        for m, addr in edges.items():
            if m in self.edge_addresses:
                self.edge_addresses[m] = addr


def reply_state(reply: pb.SubmitReply | None) -> dict[str, Any] | None:
    """A Submit answer as JSON (None stays None)."""
    if reply is None:
        return None
    return {"accepted": bool(reply.accepted), "version": int(reply.version),
            "detail": str(reply.detail)}


@dataclass
class TaskState:
    """One dispatched coalition task: the message sent to the edge and what became of it.

    Times are ``time.monotonic()`` seconds.
    """

    task_id: str
    dispatch: Dispatch
    #: the Task message (model beside it: the encoded global model, shared by the version's tasks)
    message: WithModel
    dispatched_at: float
    sent_at: float | None = None
    reply: pb.SubmitReply | None = None
    #: a Submit being applied right now (duplicates wait on it); the run loop's future
    pending: Any = None
    #: why the task stopped being expected (its deadline passed), None while it is
    expired: str | None = None
    #: seconds after ``dispatched_at`` by which the answer must arrive
    deadline_s: float = math.inf

    def release_model(self) -> None:
        """Drop the model the task carried (it is answered: no stream sends it again)."""
        self.message = WithModel(self.message.message, b"")

    def to_state(self, now_mono: float, now_wall: float) -> dict[str, Any]:
        """JSON-safe form for the checkpoint (the send time as wall-clock seconds)."""
        d, sent = self.dispatch, self.sent_at
        return {"coalition": d.coalition, "round": d.round, "version": d.version,
                "reply": reply_state(self.reply), "expired": self.expired,
                "sent_wall": None if sent is None else now_wall - (now_mono - sent)}

    @staticmethod
    def sent_from_state(t: dict[str, Any], now_mono: float, now_wall: float) -> float | None:
        """The monotonic send time of a checkpointed task (None: never sent)."""
        if t["sent_wall"] is None:
            return None
        return now_mono - max(0.0, now_wall - t["sent_wall"])

    @classmethod
    def finished_from_state(cls, task_id: str, t: dict[str, Any]) -> "TaskState":
        """An answered or expired task of a checkpoint (no model, only what its id needs)."""
        d = Dispatch(round=int(t["round"]), coalition=int(t["coalition"]),
                     version=int(t["version"]), clients=(), frequencies_ghz={},
                     t_hat_round_s=0.0, t_hat_s=0.0)
        task = cls(task_id, d, WithModel(pb.Task(task_id=task_id), b""), time.monotonic())
        if t["reply"] is not None:
            task.reply = pb.SubmitReply(**t["reply"])
        task.expired = t["expired"]
        return task


@dataclass
class Arrival:
    """What applying one edge model gives: its round's record, the new tasks, the end."""

    record: dict[str, Any]
    new: list[TaskState]
    finished: bool


@dataclass(frozen=True)
class Federation:
    """The formed federation: who trains in which coalition, and the strategy scheduling them.

    Made once, at formation or resumption; the strategy inside changes only under the
    controller's lock. ``clients`` in id order; ``initial_assignment`` and ``assignment``: the
    ES of each client id before and after formation; ``formation``: the rule's ``moves`` and
    ``stable``; ``jsd``: the average pairwise JSD Φ before and after formation (nats).
    """

    strategy: FedCureStrategy
    clients: tuple[ClientEntry, ...]
    initial_assignment: np.ndarray
    assignment: np.ndarray
    formation: dict[str, Any]
    population: PopulationArrays
    jsd: tuple[float, float] | None

    def finished(self, global_rounds: int) -> bool:
        """All ``global_rounds`` rounds are aggregated."""
        return self.strategy.round >= global_rounds


@dataclass
class RunLog:
    """What a run records, and its clock.

    ``records``: one row per global round (the keys of :mod:`cloud_server.controller`'s
    docstring); ``faults``: lost edge servers, expired tasks, reconnections, resumptions;
    ``warnings``: conditions the user should know about (unreachable target shares); all
    JSON-safe rows. ``t0``: ``time.monotonic()`` when round 0 was dispatched (None before).
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    t0: float | None = None
    initial_accuracy: float | None = None
    #: the initial model's federated evaluation besides its accuracy (loss, clients, samples,
    #: per-class accuracy); None: evaluated centrally, or not yet
    initial_evaluation: dict[str, Any] | None = None

    def elapsed_s(self) -> float:
        """Seconds since round 0 was dispatched (0 before)."""
        return time.monotonic() - self.t0 if self.t0 is not None else 0.0

    def fault(self, kind: str, coalition: int | None, detail: str, round_: int
              ) -> dict[str, Any]:
        """Record a failure event (lost ES, expired task, reconnection, resumption); returns it."""
        row = {"time_s": self.elapsed_s(), "kind": kind, "coalition": coalition,
               "round": round_, "detail": detail}
        self.faults.append(row)
        return row

    def mark(self) -> tuple[int, int]:
        """A point :meth:`rollback` returns to."""
        return len(self.records), len(self.faults)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget the records and faults added since ``mark``."""
        del self.records[mark[0]:]
        del self.faults[mark[1]:]


class TaskBook(Mapping[str, TaskState]):
    """Every dispatched task by id (answered and expired ones too: a duplicate Submit gets the
    same reply), and the encoded global model the new tasks of a version share."""

    def __init__(self, cfg: FedCureConfig) -> None:
        self.cfg = cfg
        self._tasks: dict[str, TaskState] = {}
        self._model: tuple[int, bytes] | None = None

    def __getitem__(self, task_id: str) -> TaskState:
        return self._tasks[task_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def model_bytes(self, strategy: FedCureStrategy) -> bytes:
        """The encoded global model of the strategy's version (cached; call with the lock)."""
        v = strategy.version
        if self._model is None or self._model[0] != v:
            self._model = (v, encode_arrays(strategy.global_arrays, {"version": str(v)}))
        return self._model[1]

    def make(self, d: Dispatch, strategy: FedCureStrategy, *, task_id: str | None = None,
             model: bytes | None = None) -> TaskState:
        """The task for a dispatch, kept here (call with the lock held).

        ``model``: the encoded model of ``d.version`` (default: the current global model).
        The deadline is ``deadline-slack`` × the estimator's ``deadline-quantile`` of the
        coalition's latency, at least ``deadline-min-s`` (``cloud_server.failover``).
        """
        cfg = self.cfg
        if task_id is None:
            task_id = base = f"r{d.round}-c{d.coalition}-v{d.version}"
            n = 1
            while task_id in self._tasks:  # the coalition was lost and sent the same round again
                n += 1
                task_id = f"{base}-{n}"
        msg = pb.Task(
            task_id=task_id, coalition=d.coalition, version=d.version, tau_e=cfg.method.tau_e,
            tau_c=cfg.method.tau_c, lr=cfg.method.lr, batch_size=cfg.method.batch_size,
            client_ids=list(d.clients), frequencies_ghz=d.frequencies_ghz,
            seed=derive_seed(cfg.run.seed, d.round, d.coalition), round=d.round,
            t_hat_round_s=d.t_hat_round_s,
            client_samples={int(c): int(strategy.client_samples[c]) for c in d.clients},
            max_client_weight=cfg.reliability.max_client_weight,
            client_step_bound=cfg.method.lr * cfg.method.tau_c
            * cfg.reliability.norm_grad_bound,
        )
        task = TaskState(task_id, d, WithModel(msg, model if model is not None
                                               else self.model_bytes(strategy)),
                         time.monotonic())
        task.deadline_s = task_deadline_s(strategy.estimator, d.coalition, cfg.reliability)
        self._tasks[task_id] = task
        return task

    def add(self, task: TaskState) -> None:
        """Keep a task made elsewhere (an answered or expired one of a checkpoint)."""
        self._tasks[task.task_id] = task

    def live(self, task_id: str) -> bool:
        """The task exists and is still expected: not answered, not expired."""
        t = self._tasks.get(task_id)
        return t is not None and t.reply is None and t.expired is None

    def in_flight(self, strategy: FedCureStrategy) -> list[TaskState]:
        """The tasks the strategy's coalitions in flight are training for."""
        return [t for t in list(self._tasks.values())
                if strategy.in_flight.get(t.dispatch.coalition) is t.dispatch]

    def mark(self) -> tuple[frozenset[str], tuple[int, bytes] | None]:
        """A point :meth:`rollback` returns to."""
        return frozenset(self._tasks), self._model

    def rollback(self, mark: tuple[frozenset[str], tuple[int, bytes] | None]) -> None:
        """Forget the tasks made since ``mark`` and restore the model cache."""
        for tid in set(self._tasks) - mark[0]:
            del self._tasks[tid]
        self._model = mark[1]


@dataclass(frozen=True)
class RoundView:
    """The strategy's figures after its last transition. The controller publishes a new one,
    under its lock, after every transition; readers take it without the lock."""

    version: int = 0
    round: int = 0
    in_flight: tuple[int, ...] = ()

    @classmethod
    def of(cls, strategy: FedCureStrategy) -> "RoundView":
        """The view of ``strategy`` now (call with the lock held)."""
        return cls(strategy.version, strategy.round, tuple(sorted(strategy.in_flight)))


@dataclass(frozen=True)
class StatusSnapshot:
    """Where the run stands, immutable (``Monitor.Status``'s fields): built without the
    controller's lock, so a reader may hold it as long as it likes (write it to a socket)."""

    phase: Phase
    version: int
    round: int
    global_rounds: int
    clients_registered: int
    expected_clients: int
    edges_connected: int
    num_edges: int
    in_flight: tuple[int, ...]
    progress: tuple[ProgressRow, ...]

    def to_proto(self) -> pb.StatusReply:
        """The ``Monitor.Status`` reply."""
        return pb.StatusReply(
            phase=int(self.phase), version=self.version, round=self.round,
            global_rounds=self.global_rounds, clients_registered=self.clients_registered,
            expected_clients=self.expected_clients, edges_connected=self.edges_connected,
            num_edges=self.num_edges, in_flight=list(self.in_flight),
            progress=[pb.CoalitionProgress(
                coalition=p.coalition, edge_round=p.edge_round, tau_e=p.tau_e,
                training_client_ids=list(p.waiting), elapsed_s=p.elapsed_s, eta_s=p.eta_s,
                age_s=p.age_s) for p in self.progress],
        )


class Tally:
    """Counts of answers the live view and ``/metrics`` show: late answers, expired tasks and
    refused updates by reason (gRPC status name). Thread-safe; its own small lock is held only
    to add or copy, never while anything is written to a socket."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._late = 0
        self._expired = 0
        self._refused: dict[str, int] = {}

    def late(self) -> None:
        """An answer came after its task's deadline."""
        with self._lock:
            self._late += 1

    def expired(self) -> None:
        """A task expired unanswered."""
        with self._lock:
            self._expired += 1

    def refused(self, reason: str) -> None:
        """An edge update was refused for ``reason``."""
        with self._lock:
            self._refused[reason] = self._refused.get(reason, 0) + 1

    def snapshot(self) -> tuple[int, int, dict[str, int]]:
        """(late, expired, refused by reason), copied."""
        with self._lock:
            return self._late, self._expired, dict(self._refused)


def jsonable(obj: Any) -> Any:
    """numpy scalars/arrays to Python, recursively."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


__all__ = ["Arrival", "ClientEntry", "Federation", "Phase", "Roster", "RoundView", "RunLog",
           "StatusSnapshot", "Tally", "TaskBook", "TaskState", "jsonable", "reply_state"]
