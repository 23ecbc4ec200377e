"""The cloud's logic without transport: registration, formation, dispatch, arrivals, failover.

:class:`CloudController` owns the cloud's state and the objects working on it, each made with
explicit arguments: a :class:`~cloud_server.state.Roster` (clients, claims, edges) and the
:class:`~cloud_server.registry.Registry` rules changing it, a :class:`~cloud_server.state.RunLog`, a :class:`~cloud_server.state.TaskBook`, a
:class:`~cloud_server.screening.NormScreen`, :class:`~cloud_server.durable.Durability` (over an
optional :class:`~cloud_server.checkpoint.CheckpointStore`), a
:class:`~cloud_server.results.ResultsWriter` and a :class:`~cloud_server.progress.ProgressBoard`;
the :class:`~cloud_server.views.RunViews` readers take without the lock; once formed, a
:class:`~cloud_server.formed.FormedRun` (the federation, the
:class:`~cloud_server.arrivals.Arrivals` that change it, and the transitions of the rounds).

It changes that state only through plain methods: registration, formation and resumption here,
the rounds' transitions in its :class:`~cloud_server.formed.FormedRun`; each holds ``self.lock``
for the strategy's transitions (the collaborators never take it); a request it refuses raises
:class:`cloud_server.refusal.Refusal`. After each transition the views are published, so that
:meth:`status` answers without the lock. It knows neither gRPC nor the event loop: the run loop
(:mod:`cloud_server.runloop`) calls these methods (the heavy ones in worker threads), and tests
call them directly (``tests/deployment/test_controller.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.live.model import StrategyView
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.strategy import FedCureStrategy
from cloud_server import validation as door
from cloud_server.checkpoint import CheckpointStore
from cloud_server.durable import Durability
from cloud_server.fedeval import federated_mode
from cloud_server.formation import build_federation, partition
from cloud_server.formed import Evaluator, FormedRun
from cloud_server.progress import ProgressBoard, Report, current_estimate
from cloud_server.reach import reach_warnings
from cloud_server.refusal import Reason, Refusal
from cloud_server.registry import Registry
from cloud_server.results import ResultsWriter
from cloud_server.screening import NormScreen
from cloud_server.state import (
    ClientEntry, Federation, Phase, Roster, RunLog, StatusSnapshot, Tally, TaskBook, TaskState,
)
from cloud_server.views import RunViews

log = logging.getLogger("fedcure.cloud")


def initial_model(cfg: FedCureConfig) -> list[np.ndarray]:
    """The configured dataset's CNN seeded with ``run.seed``: the default initial global model."""
    # lazy on purpose: torch costs the cloud's start-up seconds (tens on a loaded host), and a
    # cloud given its initial model never needs it
    import torch

    from fedcure_app.models import build_model, get_weights

    torch.manual_seed(cfg.run.seed)
    return get_weights(build_model(cfg.task if cfg.task is not None else cfg.data.dataset,
                                   cfg.federation.num_classes))


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
    federated_evaluation:
        Evaluate on the clients' held-out parts (the run loop does; ``federated_mode``).
    """

    def __init__(self, cfg: FedCureConfig, *, expected_clients: int,
                 out_dir: str | Path | None = None,
                 initial_arrays: list[np.ndarray] | None = None,
                 evaluator: Evaluator | None = None, write_plots: bool = True,
                 checkpoint_dir: str | Path | None = None,
                 federated_evaluation: bool | None = None) -> None:
        if expected_clients < cfg.federation.num_edges:
            raise ValueError(
                f"expected_clients ({expected_clients}) < edges ({cfg.federation.num_edges}): "
                "every edge server needs at least one client"
            )
        self.cfg = cfg
        self.num_edges = cfg.federation.num_edges
        self.evaluator = evaluator
        self.federated_evaluation = federated_mode(cfg, evaluator, federated_evaluation)
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
        self.roster = Roster(self.num_edges, int(expected_clients))
        self.registry = Registry(cfg, self.roster)
        self.log = RunLog()
        self.tasks = TaskBook(cfg)
        #: refuses edge models far outside the recently accepted ones
        self.screen = NormScreen.from_config(cfg)
        self.checkpoints = CheckpointStore(checkpoint_dir) if checkpoint_dir is not None else None
        self.durability = Durability(cfg, self.checkpoints, self.roster, self.log, self.tasks,
                                     self.screen)
        self.results = ResultsWriter(cfg, out_dir, write_plots, evaluation="federated"
                                     if self.federated_evaluation else "central")
        #: the ESs' live reports inside a task (EdgeLink.Progress): logged, shown in Status
        self.progress = ProgressBoard()
        #: late, expired and refused answers (the live view, /metrics)
        self.tally = Tally()
        #: what readers take without the lock (Monitor.Status, the live view, /metrics)
        self.views = RunViews(cfg, self.roster, self.log, self.progress)
        #: the formed federation and its transitions (None before formation)
        self.formed: FormedRun | None = None

    # ================================================================== reading
    @property
    def federation(self) -> Federation | None:
        """The formed federation (None before formation)."""
        return self.formed.federation if self.formed is not None else None

    @property
    def strategy(self) -> FedCureStrategy | None:
        """The formed federation's strategy (None before formation)."""
        return self.formed.strategy if self.formed is not None else None

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
        """Where the run stands, without taking the lock (:meth:`RunViews.status`)."""
        return self.views.status(self.phase, self.is_live)

    @property
    def strategy_view(self) -> StrategyView:
        """The strategy's figures and the rounds as of its last transition (the live view and
        ``/metrics`` read it without the lock)."""
        return self.views.strategy

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

    def _fault(self, kind: str, coalition: int | None, detail: str) -> None:
        self.log.fault(kind, coalition, detail, self.strategy.round if self.strategy else 0)

    # ================================================================== registration
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
        if n < self.num_edges:
            return False
        return n >= self.roster.awaited or window_closed

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
        self.log.warnings.extend(reach_warnings(strategy.delta, strategy.estimator.mean(),
                                                strategy.max_concurrent,
                                                "the device profiles' latency prior"))
        with self.lock:
            if self.evaluator is not None:
                self.log.initial_accuracy = float(self.evaluator(strategy.global_arrays)[0])
            tasks = [self.tasks.make(d, strategy) for d in strategy.dispatch()]
            self.save_checkpoint()
            self.views.publish(self.federation)
            return tasks

    def formation_failed(self, err: BaseException) -> None:
        """Forget a failed formation attempt; the cloud keeps registering."""
        with self.lock:
            self.formed = None
            self.registry.forget_ids()
            self.views.publish(self.federation)
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
        """Make ``fed`` the run's federation: its clients get their ids, and a
        :class:`FormedRun` its transitions."""
        with self.lock:
            for i, c in enumerate(fed.clients):
                c.client_id = i
                c.edge_id = int(fed.assignment[i])
            self.formed = FormedRun(
                self.cfg, fed, lock=self.lock, roster=self.roster, log=self.log,
                tasks=self.tasks, screen=self.screen, durability=self.durability,
                results=self.results, store=self.checkpoints, views=self.views,
                tally=self.tally, evaluator=self.evaluator)
        return fed

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
            elapsed_s=float(elapsed_s),
            estimate_s=current_estimate(self.views.strategy.t_hat_s, m, task.dispatch.t_hat_s),
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
        """Close a finished run (worker thread): :meth:`FormedRun.finish` (the final checkpoint
        and the results; a failed write is logged and the run still ends)."""
        result = self.formed.finish() if self.formed is not None else None
        if result is not None:
            self.result = result

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
            self.views.publish(self.federation)
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
