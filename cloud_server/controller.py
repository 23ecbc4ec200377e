"""The cloud's logic without transport: registration, formation, dispatch, arrivals, failover.

:class:`CloudController` owns the cloud's state and the objects working on it, each made with
explicit arguments: a :class:`~cloud_server.state.Roster` (clients, claims, edges) and the
:class:`~cloud_server.registry.Registry` rules changing it, a :class:`~cloud_server.state.RunLog`, a :class:`~cloud_server.state.TaskBook`, a
:class:`~cloud_server.screening.NormScreen`, :class:`~cloud_server.durable.Durability` (over an
optional :class:`~cloud_server.checkpoint.CheckpointStore`), a
:class:`~cloud_server.results.ResultsWriter` and a :class:`~cloud_server.progress.ProgressBoard`;
once formed, a :class:`~cloud_server.state.Federation` and the
:class:`~cloud_server.arrivals.Arrivals` that change it.

It changes that state only through plain methods, each holding ``self.lock`` for the strategy's
transitions (the collaborators never take it); a request it refuses raises
:class:`cloud_server.refusal.Refusal`. After each transition it publishes a
:class:`~cloud_server.state.RoundView`, so that :meth:`status` answers without the lock. It knows
neither gRPC nor the event loop: the run loop (:mod:`cloud_server.runloop`) calls these methods
(the heavy ones in worker threads), and tests call them directly
(``tests/deployment/test_controller.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.live.model import StrategyView
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import CodecError, check_like, decode_arrays, encode_arrays
from fedcure_app.strategy import FedCureStrategy
from fedcure_app.tasks import ClientReport
from cloud_server import validation as door
from cloud_server.arrivals import Arrivals
from cloud_server.checkpoint import CheckpointStore
from cloud_server.durable import Durability
from cloud_server.formation import build_federation, partition
from cloud_server.progress import ProgressBoard, Report
from cloud_server.reach import unreachable
from cloud_server.refusal import Reason, Refusal
from cloud_server.registry import Registry
from cloud_server.results import ResultsWriter
from cloud_server.screening import NormScreen
from cloud_server.state import (
    Arrival, ClientEntry, Federation, Phase, Roster, RoundView, RunLog, StatusSnapshot,
    Tally, TaskBook, TaskState,
)

log = logging.getLogger("fedcure.cloud")

#: ``evaluator(arrays) -> (accuracy, loss)`` on a held-out set.
Evaluator = Callable[[list[np.ndarray]], tuple[float, float]]


def initial_model(cfg: FedCureConfig) -> list[np.ndarray]:
    """The configured dataset's CNN seeded with ``run.seed``: the default initial global model."""
    # lazy on purpose: torch costs the cloud's start-up seconds (tens on a loaded host), and a
    # cloud given its initial model never needs it
    import torch

    from fedcure_app.models import build_model, get_weights

    torch.manual_seed(cfg.run.seed)
    return get_weights(build_model(cfg.data.dataset, cfg.federation.num_classes))


class CloudController:
    """The cloud's state and the transitions of a run (see the module docstring).

    Parameters
    ----------
    cfg:
        The configuration; ``federation.num_edges`` is M, ``run.global_rounds`` the stop.
    expected_clients:
        Formation runs as soon as this many clients are registered.
    out_dir:
        Where ``result.json``, plots and ``final_model.safetensors`` go (None: nothing written).
    initial_arrays:
        The initial global model; default :func:`initial_model`.
    evaluator:
        ``arrays -> (accuracy, loss)`` run at formation, every ``eval_every`` rounds and at the end.
    write_plots:
        Write the PNG plots with the results.
    checkpoint_dir:
        Where the durable state goes (None: no checkpoints).
    """

    def __init__(self, cfg: FedCureConfig, *, expected_clients: int,
                 out_dir: str | Path | None = None,
                 initial_arrays: list[np.ndarray] | None = None,
                 evaluator: Evaluator | None = None, write_plots: bool = True,
                 checkpoint_dir: str | Path | None = None) -> None:
        if expected_clients < cfg.federation.num_edges:
            raise ValueError(
                f"expected_clients ({expected_clients}) < edges ({cfg.federation.num_edges}): "
                "every edge server needs at least one client"
            )
        self.cfg = cfg
        self.num_edges = cfg.federation.num_edges
        self.evaluator = evaluator
        self.initial_arrays = initial_arrays
        #: guards every strategy transition (worker threads and readers)
        self.lock = threading.Lock()
        self.phase = Phase.REGISTERING
        #: formation is running or has run (cleared when an attempt fails)
        self.forming = False
        #: why the last formation attempt failed (None: none failed); cleared by a new one
        self.formation_error: str | None = None
        #: no task is expected any more: the results are written or the cloud is closing
        self.ended = False
        #: the run's result dict once written
        self.result: dict[str, Any] | None = None
        rel = cfg.reliability
        self.roster = Roster(self.num_edges, int(expected_clients))
        self.registry = Registry(cfg, self.roster)
        self.log = RunLog()
        self.tasks = TaskBook(cfg)
        #: refuses edge models far outside the recently accepted ones
        self.screen = NormScreen(rel.norm_factor, rel.norm_window, rel.norm_min_history)
        self.checkpoints = CheckpointStore(checkpoint_dir) if checkpoint_dir is not None else None
        self.durability = Durability(cfg, self.checkpoints, self.roster, self.log, self.tasks,
                                     self.screen)
        self.results = ResultsWriter(cfg, out_dir, write_plots)
        #: the ESs' live reports inside a task (EdgeLink.Progress): logged, shown in Status
        self.progress = ProgressBoard()
        #: the formed federation and what changes it (None before formation)
        self.federation: Federation | None = None
        self.arrivals: Arrivals | None = None
        #: late, expired and refused answers (the live view, /metrics)
        self.tally = Tally()
        self._view = RoundView()
        self._strategy_view = StrategyView(tau_e=cfg.method.tau_e)

    # ================================================================== reading
    @property
    def strategy(self) -> FedCureStrategy | None:
        """The formed federation's strategy (None before formation)."""
        return self.federation.strategy if self.federation is not None else None

    @property
    def clients(self) -> dict[str, ClientEntry]:
        """The registered clients by name."""
        return self.roster.clients

    @property
    def records(self) -> list[dict[str, Any]]:
        """One row per global round (see :mod:`cloud_server.arrivals`)."""
        return self.log.records

    @property
    def faults(self) -> list[dict[str, Any]]:
        """Lost edge servers, expired tasks, reconnections, resumptions."""
        return self.log.faults

    @property
    def initial_accuracy(self) -> float | None:
        """The initial model's accuracy (None without an evaluator)."""
        return self.log.initial_accuracy

    @property
    def expected_clients(self) -> int:
        """Formation runs as soon as this many clients are registered."""
        return self.roster.expected_clients

    def status(self) -> StatusSnapshot:
        """Where the run stands, without taking the lock: the strategy's figures as of its last
        transition, the roster's counts and the progress of the tasks in flight."""
        view, reg = self._view, self.roster
        return StatusSnapshot(
            phase=self.phase, version=view.version, round=view.round,
            global_rounds=self.cfg.run.global_rounds, clients_registered=len(reg.clients),
            expected_clients=reg.expected_clients, edges_connected=len(reg.connected),
            num_edges=self.num_edges, in_flight=view.in_flight,
            progress=self.progress.snapshot(self.is_live))

    @property
    def strategy_view(self) -> StrategyView:
        """The strategy's figures and the rounds as of its last transition (the live view and
        ``/metrics`` read it without the lock)."""
        return self._strategy_view

    def is_live(self, task_id: str) -> bool:
        """The task is still expected (not answered, not expired, the run not ended)."""
        return not self.ended and self.tasks.live(task_id)

    def live_tasks(self) -> list[TaskState]:
        """The tasks the coalitions in flight are training for."""
        return [] if self.strategy is None else self.tasks.in_flight(self.strategy)

    def finished(self) -> bool:
        """All ``global_rounds`` rounds are aggregated."""
        return self.federation is not None and self.federation.finished(
            self.cfg.run.global_rounds)

    def _publish(self) -> None:
        """A new :class:`RoundView` and :class:`StrategyView` of the strategy (call holding
        the lock)."""
        s = self.strategy
        self._view = RoundView.of(s) if s is not None else RoundView()
        self._strategy_view = (
            StrategyView.of(s, self.log.records, self.cfg.method.tau_e, self._strategy_view,
                            self.log.initial_accuracy,
                            devices=[c.profile.name for c in self.federation.clients]
                            if self.federation is not None else None)
            if s is not None else StrategyView(tau_e=self.cfg.method.tau_e))

    def _fault(self, kind: str, coalition: int | None, detail: str) -> None:
        self.log.fault(kind, coalition, detail, self.strategy.round if self.strategy else 0)

    # ================================================================== registration
    def claim(self, name: str, wanted: int | None) -> int:
        """The stable partition index of client ``name`` (``wanted`` if free, else the first)."""
        return self.registry.claim(name, wanted)

    def validate_registration(self, req: pb.RegisterRequest) -> ClientEntry:
        """The client a Register request describes, every field checked at the door."""
        return self.registry.validate(req)

    def register(self, entry: ClientEntry) -> ClientEntry:
        """Record a registration (a known name before formation: the latest data counts);
        returns the stored client. Refused for a new name once formation ran."""
        return self.registry.register(
            entry, open_=self.phase == Phase.REGISTERING and not self.forming)

    def should_form(self, window_closed: bool) -> bool:
        """Formation is due: all expected clients are in, or the window closed with ≥ M."""
        if self.forming or self.phase != Phase.REGISTERING:
            return False
        if self.formation_error is not None and not self.registry.changed:
            return False  # the same registrations would fail the same way
        n = len(self.roster.clients)
        return n >= self.expected_clients or (window_closed and n >= self.num_edges)

    def members(self, m: int) -> list[ClientEntry]:
        """The clients of coalition m in id order (none before formation)."""
        return self.registry.members(m)

    def edge_connected(self, m: int, address: str) -> None:
        """Edge m connected with its fleet ``address``."""
        self.registry.edge_connected(m, address)

    def edge_left(self, m: int) -> None:
        """Edge m's stream ended."""
        self.registry.edge_left(m)

    def edge_address(self, m: int) -> str:
        """The address edge m last connected with ("" never)."""
        return self.roster.edge_addresses[m]

    # ================================================================== formation
    def build_initial_arrays(self) -> list[np.ndarray]:
        """The initial global model (the given arrays, or :func:`initial_model`)."""
        if self.initial_arrays is not None:
            return [np.array(a, copy=True) for a in self.initial_arrays]
        return initial_model(self.cfg)

    def start_forming(self) -> None:
        """Formation is about to run: registration closes to new names."""
        self.forming = True

    def form_and_build(self) -> list[TaskState]:
        """Form the coalitions of the registered clients, build the strategy, dispatch round 0
        and checkpoint (worker thread). Raises on failure: see :meth:`formation_failed`."""
        self.registry.changed = False
        clients = self.registry.ordered()
        initial, assignment, formation, jsd = partition(self.cfg, clients)
        arrays = self.build_initial_arrays()
        strategy = self._install(build_federation(self.cfg, clients, initial, assignment,
                                                  formation, jsd, arrays)).strategy
        self.check_reach(strategy.estimator.mean(), "the device profiles' latency prior")
        with self.lock:
            if self.evaluator is not None:
                self.log.initial_accuracy = float(self.evaluator(strategy.global_arrays)[0])
            tasks = [self.tasks.make(d, strategy) for d in strategy.dispatch()]
            self.save_checkpoint()
            self._publish()
            return tasks

    def formation_failed(self, err: BaseException) -> None:
        """Forget a failed formation attempt; the cloud keeps registering."""
        with self.lock:
            self.federation = None
            self.arrivals = None
            self.registry.forget_ids()
            self._publish()
        self.formation_error = ("coalition formation failed on the cloud: "
                                + door.clip(str(err), 200))
        self._fault("formation-failed", None, self.formation_error)
        self.forming = False

    def begin_training(self) -> None:
        """Round 0 is out: the clock starts."""
        self.formation_error = None
        self.log.t0 = time.monotonic()
        self.phase = Phase.TRAINING

    def _install(self, fed: Federation) -> Federation:
        """Make ``fed`` the run's federation: its clients get their ids, and its
        :class:`Arrivals` the state they change."""
        with self.lock:
            for i, c in enumerate(fed.clients):
                c.client_id = i
                c.edge_id = int(fed.assignment[i])
            self.federation = fed
            self.arrivals = Arrivals(self.cfg, fed, self.log, self.tasks, self.screen,
                                     self.durability)
        return fed

    def check_reach(self, latency_s: np.ndarray, source: str) -> None:
        """Warn (log and result.json ``warnings``) about every coalition whose target share
        δ_m exceeds what K concurrent slots and its latency allow (``cloud_server.reach``)."""
        s = self.strategy
        if s is None:
            return
        try:
            bad = unreachable(s.delta, latency_s, s.max_concurrent)
        except ValueError as err:  # e.g. a non-finite estimate: nothing to say
            log.debug("reachability check skipped: %s", err)
            return
        for m, delta, cap in bad:
            text = (f"coalition {m}: target share delta {delta:.3f} is out of reach: with at "
                    f"most {s.max_concurrent} coalitions in flight and its latency (from "
                    f"{source}) it can get at most {cap:.3g} of the rounds; its virtual queue "
                    "will grow without bound (not mean-rate stable)")
            log.warning("%s", text)
            self.log.warnings.append({"kind": "unreachable-share", "coalition": m,
                                      "delta": delta, "max_share": cap, "source": source,
                                      "detail": text})

    # ================================================================== submits
    def find_task(self, task_id: str, edge_id: int) -> TaskState:
        """The task a Submit names, checked against the submitting edge."""
        task = self.tasks.get(task_id) if door.task_id_known(task_id) else None
        if task is None:
            raise Refusal(Reason.NOT_FOUND, f"unknown task id {door.clip(task_id)}")
        if edge_id != task.dispatch.coalition:
            raise Refusal(Reason.INVALID_ARGUMENT,
                          f"task {task.task_id} belongs to edge {task.dispatch.coalition}, "
                          f"not edge {edge_id}")
        return task

    def answer_over(self, task: TaskState, detail: str) -> pb.SubmitReply:
        """Answer ``task`` once and for all without aggregating it (training is over)."""
        task.reply = pb.SubmitReply(accepted=False,
                                    version=self.strategy.version if self.strategy else 0,
                                    detail=detail)
        return task.reply

    def too_stale(self, task: TaskState) -> Refusal | None:
        """For an expired task: the refusal when it is staler than ``late-staleness-bound``."""
        assert self.arrivals is not None
        return self.arrivals.too_stale(task)

    def check_submit(self, task: TaskState, num_samples: int, latency_s: float, stats: Any,
                     dropped: list[int], startup_s: float = 0.0) -> None:
        """A Submit of ``task`` is expected and its numbers are within bounds."""
        assert self.arrivals is not None
        self.arrivals.check(task, num_samples, latency_s, stats, dropped, startup_s)

    def decode_model(self, task: TaskState, blob: bytes | memoryview) -> list[np.ndarray]:
        """The edge model of a Submit, decoded and checked against the global model's tensors
        (worker thread)."""
        assert self.strategy is not None
        try:
            arrays = decode_arrays(blob)
            check_like(arrays, self.strategy.global_arrays)
        except CodecError as err:
            raise Refusal(Reason.INVALID_ARGUMENT, f"task {task.task_id}: {err}") from None
        return arrays

    def arrive(self, task: TaskState, arrays: list[np.ndarray], latency: float,
               edge_latency: float, num_samples: int, reports: list[ClientReport],
               dropped: list[int], late: bool = False, startup_s: float = 0.0) -> Arrival:
        """Aggregate one edge model, dispatch again, record the round, write the checkpoint
        (worker thread): all of it or, when any step fails, none (:meth:`Arrivals.arrive`)."""
        assert self.arrivals is not None and self.log.t0 is not None
        with self.lock:
            arrival = self.arrivals.arrive(task, arrays, latency, edge_latency, num_samples,
                                           reports, dropped, late, startup_s)
            self._publish()
            return arrival

    def should_evaluate(self, arrival: Arrival) -> bool:
        """The global model is evaluated after this arrival (every ``eval_every`` rounds and
        at the end, given an evaluator)."""
        return self.evaluator is not None and (
            arrival.record["round"] % self.cfg.run.eval_every == 0 or arrival.finished)

    def record_evaluation(self, record: dict[str, Any], accuracy: float, loss: float) -> None:
        """Keep an evaluation of the global model in its round's ``record`` and publish it."""
        with self.lock:
            record["accuracy"], record["loss"] = accuracy, loss
            self._publish()

    def evaluate(self) -> tuple[float, float]:
        """Accuracy and loss of a copy of the global model (worker thread)."""
        assert self.evaluator is not None and self.strategy is not None
        with self.lock:
            arrays = [np.array(a, copy=True) for a in self.strategy.global_arrays]
        acc, loss = self.evaluator(arrays)
        return float(acc), float(loss)

    # ================================================================== failover
    def lose(self, m: int, task: TaskState | None, why: str) -> list[TaskState]:
        """Mark coalition m unavailable (its task, if any, expires) and refill the free slot;
        returns the new tasks (worker thread)."""
        assert self.arrivals is not None
        with self.lock:
            new = self.arrivals.lose(m, task, why)
            if task is not None:
                self.tally.expired()
            self._publish()
            return new

    def take_back(self, m: int, why: str) -> list[TaskState]:
        """Let coalition m be scheduled again and fill free slots; returns the new tasks."""
        assert self.arrivals is not None
        with self.lock:
            new = self.arrivals.take_back(m, why)
            self._publish()
            return new

    # ================================================================== progress
    def report_progress(self, m: int, task_id: str, edge_round: int, tau_e: int,
                        waiting: Sequence[int], elapsed_s: float) -> bool:
        """An ES's report on task ``task_id`` of coalition m (``EdgeLink.Progress``): kept and
        logged by the progress board while the task is expected; returns whether it is."""
        task = self.tasks.get(task_id)
        if task is not None and task.dispatch.coalition != m:
            raise Refusal(Reason.INVALID_ARGUMENT,
                          f"task {task_id[:80]!r} belongs to edge {task.dispatch.coalition}, "
                          f"not edge {m}")
        if not (0 <= edge_round <= tau_e <= 1_000_000 and elapsed_s >= 0
                and len(waiting) <= 100_000):
            raise Refusal(Reason.INVALID_ARGUMENT,
                          "edge_round must be in [0, tau_e], elapsed_s >= 0")
        if task is None or not self.is_live(task_id):
            return False
        members = set(task.dispatch.clients)
        self.progress.update(Report(
            task_id=task.task_id, coalition=m, edge_round=int(edge_round), tau_e=int(tau_e),
            waiting=tuple(int(c) for c in waiting if c in members),
            elapsed_s=float(elapsed_s), estimate_s=float(task.dispatch.t_hat_s),
            received_at=self.progress.now()))
        return True

    # ================================================================== the end
    def end_training(self) -> None:
        """The last round is aggregated: phase DONE (the results are still to be written)."""
        self.phase = Phase.DONE

    def end(self) -> None:
        """No task is expected any more (the results are written, or the cloud is closing)."""
        self.ended = True

    def finish(self) -> None:
        """Close a finished run (worker thread): warn about the target shares the measured
        latencies put out of reach, write the final checkpoint and the results. A failure of
        either write is logged; the run still ends."""
        if self.strategy is not None and self.records:
            with self.lock:
                measured = self.strategy.estimator.mean()
            self.check_reach(measured, "the measured latencies")
        try:
            with self.lock:
                self.save_checkpoint()
        except Exception:  # noqa: BLE001
            log.exception("writing the final checkpoint failed")
        try:
            self.result = self.write_results()
        except Exception:  # noqa: BLE001
            log.exception("writing the results failed")

    def write_results(self) -> dict[str, Any]:
        """The run's summary (:meth:`ResultsWriter.summary`), written with the final model and
        the plots into ``out_dir`` (nothing written without one); returns the summary."""
        fed = self.federation
        assert fed is not None
        with self.lock:
            result = self.results.summary(fed, self.roster, self.log, self.checkpoints)
            blob = None if self.results.out_dir is None else encode_arrays(
                fed.strategy.global_arrays, {"version": str(fed.strategy.version),
                                             "rounds": str(len(self.log.records))})
        self.results.write(result, blob)
        return result

    # ================================================================== durability
    def save_checkpoint(self) -> None:
        """Write the durable state (holding ``self.lock``; nothing before formation)."""
        self.durability.save(self.federation)

    def restore(self, state: dict[str, Any], models: dict[int, bytes]) -> None:
        """Rebuild the run (before any request) from a checkpoint's state and models."""
        saved = self.durability.read(state, models)
        fed = self._install(build_federation(
            self.cfg, saved.clients, saved.initial_assignment, saved.assignment,
            saved.formation, saved.jsd, saved.arrays))
        with self.lock:
            self.durability.restore(fed, saved)
            self._publish()
        self.phase = Phase.TRAINING
        self.forming = True

    def resume(self) -> bool:
        """Restore the last checkpoint of ``checkpoint_dir`` (before any request); returns
        whether that run was already complete."""
        assert self.checkpoints is not None
        state, models = self.checkpoints.load()
        self.restore(state, models)
        s = self.strategy
        assert s is not None
        self._fault("resumed", None, f"resumed from checkpoint at version {s.version}, "
                                     f"round {s.round}")
        return state["phase"] == "done" or self.finished()


__all__ = ["CloudController", "Evaluator", "initial_model"]
