"""The cloud's logic without transport: registration, formation, dispatch, arrivals, failover.

:class:`CloudController` holds the cloud's state (:mod:`cloud_server.state` dataclasses and the
:class:`FedCureStrategy`) and changes it only through plain methods, each of them holding
``self.lock`` for the strategy's transitions; a request it refuses raises
:class:`cloud_server.refusal.Refusal`. It knows neither gRPC nor the event loop: the servicer
(:mod:`cloud_server.service`) calls these methods from its handlers (the heavy ones in worker
threads), and tests call them directly (``tests/deployment/test_controller.py``).

Records (``records``) carry the simulation engine's keys: round, time_s (wall seconds since
round 0 was dispatched), coalition, staleness, xi, latency_s (measured by the cloud),
estimate_s, version, queues, dispatched, frequencies_ghz, energy_j, accuracy, loss; plus
task_id, edge_latency_s (what the ES measured), dropped and late. Energy per client-round is
κ_n·c_n·f_n² with the cycles c_n = seconds·f_n·10⁹ the client reported running at f_n GHz.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts
from fedcure_app.devices import PopulationArrays
from fedcure_app.federation import build_strategy, coalitions_of, form, prior_latency
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import (
    CodecError, WithModel, encode_arrays, profile_from_proto,
)
from fedcure_app.strategy import Dispatch, FedCureStrategy
from fedcure_app.supernode_auth import check_supernode_key
from fedcure_app.tasks import derive_seed
from cloud_server import validation as door
from cloud_server.arrivals import ArrivalSteps
from cloud_server.checkpoint import CheckpointStore
from cloud_server.durable import DurableState
from cloud_server.failover import task_deadline_s
from cloud_server.formation import fill_empty_coalitions, initial_partition, natural_key
from cloud_server.reach import unreachable
from cloud_server.refusal import Reason, Refusal
from cloud_server.results import ResultsWriter
from cloud_server.screening import NormScreen
from cloud_server.state import ClientEntry, Phase, TaskState

log = logging.getLogger("fedcure.cloud")

#: ``evaluator(arrays) -> (accuracy, loss)`` on a held-out set.
Evaluator = Callable[[list[np.ndarray]], tuple[float, float]]


class CloudController(ArrivalSteps, ResultsWriter, DurableState):
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
        The initial global model; default the configured dataset's CNN seeded with ``run.seed``.
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
        self.expected_clients = int(expected_clients)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.evaluator = evaluator
        self.write_plots = write_plots
        self.initial_arrays = initial_arrays
        #: guards every strategy transition (worker threads and readers)
        self.lock = threading.Lock()
        self.phase = Phase.REGISTERING
        #: formation is running or has run (cleared when an attempt fails)
        self.forming = False
        self.strategy: FedCureStrategy | None = None
        self.clients: dict[str, ClientEntry] = {}
        #: client name -> claimed partition index (Association.Claim)
        self.claims: dict[str, int] = {}
        self.assignment: np.ndarray | None = None
        self.initial_assignment: np.ndarray | None = None
        self.formation: Any = None
        self.population: PopulationArrays | None = None
        self.counts: np.ndarray | None = None
        self.jsd_pair: tuple[float, float] | None = None
        self.records: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.failure: str | None = None
        self.initial_accuracy: float | None = None
        #: every task by id (answered ones too: a duplicate Submit gets the same reply)
        self.tasks: dict[str, TaskState] = {}
        #: the last address each edge connected with ("" never)
        self.edge_addresses: dict[int, str] = {m: "" for m in range(self.num_edges)}
        #: monotonic time round 0 was dispatched (None before)
        self.t0: float | None = None
        self._model_cache: tuple[int, bytes] | None = None
        rel = cfg.reliability
        #: refuses edge models far outside the recently accepted ones
        self.screen = NormScreen(rel.norm_factor, rel.norm_window, rel.norm_min_history)
        #: lost edge servers, expired tasks, reconnections (JSON-safe rows)
        self.faults: list[dict[str, Any]] = []
        self.checkpoints = CheckpointStore(checkpoint_dir) if checkpoint_dir is not None else None
        #: conditions the user should know about (unreachable target shares), JSON-safe rows
        self.warnings: list[dict[str, Any]] = []
        #: why the last formation attempt failed (None: none failed); cleared by a new one
        self.formation_error: str | None = None
        #: registrations changed since the last failed formation (worth trying again)
        self.registrations_changed = False

    # ================================================================== registration
    def claim(self, name: str, wanted: int | None) -> int:
        """The stable partition index of client ``name`` (``wanted`` if free, else the first)."""
        n = self.cfg.federation.num_clients
        if not name:
            raise Refusal(Reason.INVALID_ARGUMENT, "client_name is empty")
        held = self.claims.get(name)
        if held is not None:
            if wanted is not None and wanted != held:
                raise Refusal(Reason.FAILED_PRECONDITION,
                              f"client {door.clip(name)} already holds partition {held}, "
                              f"not {wanted}")
            return held
        taken = set(self.claims.values())
        if wanted is not None:
            if not 0 <= wanted < n:
                raise Refusal(Reason.INVALID_ARGUMENT, f"partition {wanted} outside [0, {n})")
            if wanted in taken:
                raise Refusal(Reason.ALREADY_EXISTS,
                              f"partition {wanted} is already held by another client")
            index = wanted
        else:
            free = [i for i in range(n) if i not in taken]
            if not free:
                raise Refusal(Reason.RESOURCE_EXHAUSTED, f"all {n} partitions are taken")
            index = free[0]
        self.claims[name] = index
        log.info("client %r claimed partition %d of %d", name, index, n)
        return index

    def client_order(self, name: str) -> tuple[int, list[Any]]:
        """Client ids follow the claimed partition index, then the name's natural order."""
        return self.claims.get(name, self.cfg.federation.num_clients), natural_key(name)

    def validate_registration(self, req: pb.RegisterRequest) -> ClientEntry:
        """Every field of a Register request within bounds (``cloud_server.validation``), and
        the client's predicted edge round finite: one client can never make formation fail."""
        try:
            name = door.check_name(req.client_name)
        except door.Refused as err:
            raise Refusal(Reason.INVALID_ARGUMENT, str(err)) from None
        who = f"client {door.clip(name)}"
        try:
            door.check_label_counts(req.label_counts, self.cfg.federation.num_classes)
            if not req.HasField("device"):
                raise door.Refused("no device profile")
            door.check_profile_size(len(req.device.cycles_per_sample))
            profile = profile_from_proto(req.device)
            door.check_profile(profile, self.cfg.data.dataset)
            door.check_key_text(req.supernode_public_key)
        except (door.Refused, CodecError) as err:
            raise Refusal(Reason.INVALID_ARGUMENT, f"{who}: {err}") from None
        counts = np.asarray(req.label_counts, dtype=np.int64)
        home: int | None = None
        if req.HasField("home_edge"):
            home = int(req.home_edge)
            if not 0 <= home < self.num_edges:
                raise Refusal(Reason.INVALID_ARGUMENT,
                              f"{who}: home_edge {home} outside [0, {self.num_edges})")
        key = req.supernode_public_key.strip()
        if key:
            try:
                check_supernode_key(key)
            except ValueError as err:
                raise Refusal(Reason.INVALID_ARGUMENT, f"{who}: {err}") from None
        return ClientEntry(name, counts, profile, home, supernode_key=key)

    def register(self, entry: ClientEntry) -> ClientEntry:
        """Record a registration (a known name before formation: the latest data counts);
        returns the stored client. Refused for a new name once formation ran."""
        known = self.clients.get(entry.name)
        if known is None:
            if self.phase != Phase.REGISTERING or self.forming:
                raise Refusal(
                    Reason.FAILED_PRECONDITION,
                    f"registration is closed: coalition formation already ran with "
                    f"{len(self.clients)} clients; {door.clip(entry.name)} is not one of them",
                )
            self.clients[entry.name] = entry
            self.registrations_changed = True
            n = len(self.clients)
            if n == self.expected_clients or n <= 3 or n % max(1, self.expected_clients // 10) == 0:
                log.info("client %r registered (%d/%d)", entry.name, n, self.expected_clients)
        elif self.phase == Phase.REGISTERING and not self.forming:
            known.label_counts, known.profile, known.home_edge = (
                entry.label_counts, entry.profile, entry.home_edge)
            self.registrations_changed = True
        client = self.clients[entry.name]
        if entry.supernode_key and entry.supernode_key != client.supernode_key:
            # a restarted client may come with a new SuperNode key: its ES registers that one
            client.supernode_key = entry.supernode_key
        return client

    def should_form(self, window_closed: bool) -> bool:
        """Formation is due: all expected clients are in, or the window closed with ≥ M."""
        if self.forming or self.phase != Phase.REGISTERING:
            return False
        if self.formation_error is not None and not self.registrations_changed:
            return False  # the same registrations would fail the same way
        n = len(self.clients)
        return n >= self.expected_clients or (window_closed and n >= self.num_edges)

    def members(self, m: int) -> list[ClientEntry]:
        """The clients of coalition m in id order (none before formation)."""
        return [c for c in sorted(self.clients.values(), key=lambda c: c.client_id or 0)
                if c.edge_id == m and c.client_id is not None]

    # ================================================================== formation
    def build_initial_arrays(self) -> list[np.ndarray]:
        """The initial global model (the given arrays, or the dataset's CNN seeded ``run.seed``)."""
        if self.initial_arrays is not None:
            return [np.array(a, copy=True) for a in self.initial_arrays]
        # lazy on purpose: torch costs the cloud's start-up seconds (tens on a loaded host),
        # and a cloud given its initial model never needs it
        import torch

        from fedcure_app.models import build_model, get_weights

        torch.manual_seed(self.cfg.run.seed)
        return get_weights(build_model(self.cfg.data.dataset, self.cfg.federation.num_classes))

    def form_and_build(self) -> list[TaskState]:
        """Form the coalitions of the registered clients, build the strategy, dispatch round 0
        and checkpoint (worker thread). Raises on failure: see :meth:`formation_failed`."""
        cfg, m = self.cfg, self.num_edges
        self.registrations_changed = False
        names = sorted(self.clients, key=self.client_order)
        clients = [self.clients[nm] for nm in names]
        counts = np.stack([c.label_counts for c in clients])
        initial, notes = initial_partition([c.home_edge for c in clients], m)
        for note in notes:
            log.warning("initial partition: %s", note)
        t = time.perf_counter()
        assignment, result = form(cfg, counts, initial)
        assignment, notes = fill_empty_coalitions(assignment, m)
        for note in notes:
            log.warning("formation left a coalition empty: %s", note)
        coalitions = coalitions_of(assignment, m)
        jsd = (float(average_pairwise_jsd(coalition_label_counts(counts, initial, m))),
               float(average_pairwise_jsd(coalition_label_counts(counts, assignment, m))))
        log.info("coalition formation (%s) over %d clients in %.2f s: sizes %s, average JSD "
                 "%.4f -> %.4f", cfg.method.formation, len(clients), time.perf_counter() - t,
                 [len(c) for c in coalitions], jsd[0], jsd[1])
        arrays = self.build_initial_arrays()
        strategy = self.install(clients, initial, assignment, result, jsd, arrays)
        self.check_reach(strategy.estimator.mean(), "the device profiles' latency prior")
        with self.lock:
            if self.evaluator is not None:
                self.initial_accuracy = float(self.evaluator(strategy.global_arrays)[0])
            tasks = [self.make_task(d) for d in strategy.dispatch()]
            self.save_checkpoint()
            return tasks

    def formation_failed(self, err: BaseException) -> None:
        """Forget a failed formation attempt; the cloud keeps registering."""
        with self.lock:
            self.strategy = None
            self.assignment = self.initial_assignment = None
            for c in self.clients.values():
                c.client_id = c.edge_id = None
        self.formation_error = ("coalition formation failed on the cloud: "
                                + door.clip(str(err), 200))
        self.fault("formation-failed", None, self.formation_error)
        self.forming = False

    def begin_training(self) -> None:
        """Round 0 is out: the clock starts."""
        self.formation_error = None
        self.t0 = time.monotonic()
        self.phase = Phase.TRAINING

    def install(self, clients: list[ClientEntry], initial: np.ndarray, assignment: np.ndarray,
                result: Any, jsd: tuple[float, float] | None, arrays: list[np.ndarray]
                ) -> FedCureStrategy:
        """Build the strategy for a formed federation (``clients`` in id order)."""
        cfg = self.cfg
        counts = np.stack([c.label_counts for c in clients])
        coalitions = coalitions_of(assignment, self.num_edges)
        model_bytes = int(sum(a.nbytes for a in arrays))
        population = PopulationArrays.from_profiles([c.profile for c in clients], cfg.data.dataset)
        prior = prior_latency(population, coalitions, cfg.method.tau_c * cfg.method.batch_size,
                              model_bytes, cfg.method.tau_e, cfg.devices.edge_link_mbps)
        strategy = build_strategy(cfg, coalitions, counts.sum(axis=1).astype(np.float64),
                                  population, prior, arrays, deployed=True)
        with self.lock:
            for i, c in enumerate(clients):
                c.client_id = i
                c.edge_id = int(assignment[i])
            self.assignment = assignment
            self.initial_assignment = initial
            self.formation = result
            self.population = population
            self.counts = counts
            self.jsd_pair = jsd
            self.strategy = strategy
        return strategy

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
            self.warnings.append({"kind": "unreachable-share", "coalition": m, "delta": delta,
                                  "max_share": cap, "source": source, "detail": text})

    # ================================================================== tasks
    def global_model_bytes(self) -> bytes:
        """The encoded global model of the current version (cached; call with the lock)."""
        assert self.strategy is not None
        v = self.strategy.version
        if self._model_cache is None or self._model_cache[0] != v:
            self._model_cache = (v, encode_arrays(self.strategy.global_arrays,
                                                  {"version": str(v)}))
        return self._model_cache[1]

    def make_task(self, d: Dispatch, *, task_id: str | None = None,
                  model: bytes | None = None) -> TaskState:
        """The task for a dispatch (call with the lock held); registers it in ``tasks``.

        ``model``: the encoded model of ``d.version`` (default: the current global model).
        The deadline is ``deadline-slack`` × the estimator's ``deadline-quantile`` of the
        coalition's latency, at least ``deadline-min-s`` (``cloud_server.failover``).
        """
        cfg = self.cfg
        if task_id is None:
            task_id = base = f"r{d.round}-c{d.coalition}-v{d.version}"
            n = 1
            while task_id in self.tasks:  # the coalition was lost and sent the same round again
                n += 1
                task_id = f"{base}-{n}"
        msg = pb.Task(
            task_id=task_id, coalition=d.coalition, version=d.version, tau_e=cfg.method.tau_e,
            tau_c=cfg.method.tau_c, lr=cfg.method.lr, batch_size=cfg.method.batch_size,
            client_ids=list(d.clients), frequencies_ghz=d.frequencies_ghz,
            seed=derive_seed(cfg.run.seed, d.round, d.coalition), round=d.round,
            t_hat_round_s=d.t_hat_round_s,
        )
        task = TaskState(task_id, d, WithModel(msg, model if model is not None
                                               else self.global_model_bytes()), time.monotonic())
        assert self.strategy is not None
        task.deadline_s = task_deadline_s(self.strategy.estimator, d.coalition, cfg.reliability)
        self.tasks[task_id] = task
        return task

    def evaluate(self) -> tuple[float, float]:
        """Accuracy and loss of a copy of the global model (worker thread)."""
        assert self.evaluator is not None and self.strategy is not None
        with self.lock:
            arrays = [np.array(a, copy=True) for a in self.strategy.global_arrays]
        acc, loss = self.evaluator(arrays)
        return float(acc), float(loss)

    def fault(self, kind: str, coalition: int | None, detail: str) -> None:
        """Record a failure event (lost ES, expired task, reconnection, resumption)."""
        t = time.monotonic() - self.t0 if self.t0 is not None else 0.0
        self.faults.append({"time_s": t, "kind": kind, "coalition": coalition,
                            "round": self.strategy.round if self.strategy else 0,
                            "detail": detail})

    def finished(self) -> bool:
        """All ``global_rounds`` rounds are aggregated."""
        return self.strategy is not None and self.strategy.round >= self.cfg.run.global_rounds
