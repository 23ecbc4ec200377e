"""Event-driven SAFL simulation on a simulated clock (DESIGN.md semantics).

Round 0 dispatches every coalition. A dispatched coalition's training depends only on the model
it was sent: with a worker pool, tasks in flight train side by side from their dispatch and each
result is collected at its arrival; with one worker a task trains when it arrives, so a task
still in flight when the run ends is never trained. The simulated clock decides when its edge
model *arrives*:
its latency is drawn from the device profiles (compute c_n/f_n at the directed frequency, model
down/up links, lognormal jitter), τ_e edge rounds each as slow as its slowest client, plus the
edge↔cloud transfers. Each arrival is one global round: the strategy aggregates it, updates the
estimator and the queues, and refills free slots.

The latency draws use their own seeded RNG and never depend on what the executor measured, so
the in-process and the Flower executors give the same schedule trace for the same seed.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedcure_app.federation import partition_for, profiles_for
from fedcure_app.config import FedCureConfig
from fedcure_app.core.coalition import FormationResult
from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts
from fedcure_app.data.dataset import Dataset
from fedcure_app.data.own_federation import fitted_config, load_federation_data
from fedcure_app.data.partition import Partition
from fedcure_app.devices import PopulationArrays, access_caps
from fedcure_app.federation import build_strategy, form, prior_latency, samples_per_round
from fedcure_app.models import (
    build_model,
    cycles_key,
    get_weights,
    model_num_bytes,
    set_weights,
)
from fedcure_app.simulation.pacing import (GPU_EVAL_BATCH, EvalSchedule, eval_batch_size,
                                          local_steps, past_budget, record_totals)
from fedcure_app.simulation.executors import (
    ClientExecutor,
    InProcessExecutor,
    ParallelExecutor,
    resolve_workers,
)
from fedcure_app.strategy import Dispatch, EdgeUpdate, FedCureStrategy
from fedcure_app.tasks import EdgeResult, EdgeTask, derive_seed
from fedcure_app.trained.names import by_name, last_class_accuracy
from fedcure_app.training import class_accuracy, evaluate

log = logging.getLogger(__name__)


@dataclass
class Federation:
    """Everything fixed before round 0: data, partition, coalitions, devices, the model."""

    cfg: FedCureConfig
    dataset: Dataset
    partition: Partition
    assignment: np.ndarray
    formation: FormationResult | None
    population: PopulationArrays
    model_bytes: int
    initial_arrays: list[np.ndarray]

    @property
    def coalitions(self) -> list[list[int]]:
        m = self.cfg.federation.num_edges
        return [np.flatnonzero(self.assignment == e).tolist() for e in range(m)]

    @property
    def client_samples(self) -> np.ndarray:
        """|D_n| per client."""
        return np.array([len(ix) for ix in self.partition.client_indices], dtype=np.int64)

    @property
    def samples_per_round(self) -> np.ndarray:
        """Samples each client trains on in one edge round (:func:`fedcure_app.federation.
        samples_per_round`: τ_c · batch size, or τ_c · |D_n| when τ_c counts epochs)."""
        return samples_per_round(self.cfg, self.client_samples)

    def client_cycles(self) -> np.ndarray:
        """CPU cycles per client per edge round."""
        return self.population.cycles(self.samples_per_round)

    def prior_latency(self) -> np.ndarray:
        """Device-profile prediction of each coalition's task latency at f_max, no jitter (s)."""
        return prior_latency(self.population, self.coalitions, self.samples_per_round,
                             self.model_bytes, self.cfg.method.tau_e,
                             self.cfg.devices.edge_link_mbps,
                             self.cfg.devices.edge_round_overhead_s,
                             self.cfg.devices.edge_round_client_samples)


def build_federation(cfg: FedCureConfig, dataset: Dataset | None = None) -> Federation:
    """Load the data, partition it, form coalitions, sample devices and the initial model."""
    if dataset is None:
        dataset = load_federation_data(cfg)
    cfg = fitted_config(cfg, dataset)  # the clients left when some were refused
    fed = cfg.federation
    part = partition_for(cfg, dataset)
    assignment, formation = form(cfg, reported_counts(cfg, part.label_counts),
                                 part.initial_assignment)
    profiles = profiles_for(cfg)
    population = PopulationArrays.from_profiles(profiles[: fed.num_clients],
                                                cycles_key(dataset.model_spec))
    # each ES's access network caps its clients' links (docs/DESIGN.md, "Simulated devices")
    population = population.with_link_caps(access_caps(assignment, cfg.devices.edge_access_mbps))
    torch.manual_seed(cfg.run.seed)
    model = build_model(dataset.model_spec, dataset.num_classes)
    return Federation(
        cfg=cfg, dataset=dataset, partition=part, assignment=np.asarray(assignment),
        formation=formation, population=population, model_bytes=model_num_bytes(model),
        initial_arrays=get_weights(model),
    )


def reported_counts(cfg: FedCureConfig, counts: np.ndarray) -> np.ndarray:
    """The label histograms formation sees: the clients' own, or with ``data.histogram-
    epsilon`` > 0 each released with Laplace noise (:func:`fedcure_app.core.privacy.
    private_histogram`, seeded by the run's seed) as a deployed client would report it. The
    run's JSD figures are still measured on the true counts."""
    eps = cfg.data.histogram_epsilon
    if eps <= 0 and cfg.data.histogram_min_count == 0:
        return counts
    from fedcure_app.core.privacy import private_histogram

    rng = np.random.default_rng([cfg.run.seed, 0x5EED])
    return private_histogram(counts, eps if eps > 0 else math.inf,
                             cfg.data.histogram_min_count, rng)


def client_tensors(federation: Federation) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every client's (x, y) training tensors, sliced once."""
    ds = federation.dataset
    x = torch.from_numpy(ds.x_train)
    y = torch.from_numpy(ds.y_train)
    return [(x[idx].contiguous(), y[idx].contiguous())
            for idx in (torch.from_numpy(np.asarray(ix, dtype=np.int64))
                        for ix in federation.partition.client_indices)]


def make_inprocess_executor(federation: Federation, *,
                            device: torch.device | str = "cpu") -> InProcessExecutor:
    """The sequential executor over the federation's client data (sliced once), training on
    ``device``."""
    ds = federation.dataset
    return InProcessExecutor(ds.model_spec, ds.num_classes, client_tensors(federation), device=device)


def arrival_diagnostics(result: EdgeResult, global_arrays: list[np.ndarray]) -> dict[str, Any]:
    """What a record keeps about one arriving edge model besides the schedule (diagnostics
    only: nothing here feeds back into the run).

    ``edge_distance``: L2 distance between the edge model and the global model it is about to
    be mixed into (the cloud moves the global model ξ times this far); ``train_loss_first`` /
    ``train_loss_last``: the clients' mean training loss (nats, mean of each client's mini-batch
    losses) in the task's first and last edge round, None without client reports (schedule-only
    runs)."""
    sq = 0.0
    for e, g in zip(result.arrays, global_arrays):
        d = np.asarray(e, dtype=np.float64) - np.asarray(g, dtype=np.float64)
        sq += float(np.dot(d.ravel(), d.ravel()))
    out: dict[str, Any] = {"edge_distance": float(np.sqrt(sq)),
                           "train_loss_first": None, "train_loss_last": None}
    if result.reports:
        rounds = [r.edge_round for r in result.reports]
        for name, er in (("train_loss_first", min(rounds)), ("train_loss_last", max(rounds))):
            losses = [r.loss for r in result.reports if r.edge_round == er]
            out[name] = float(np.mean(losses))
    return out


def make_executor(federation: Federation, workers: int | None = None, *,
                  device: torch.device | str = "cpu") -> ClientExecutor:
    """The executor ``run.executor`` names for ``workers`` processes (None: one per core).

    ``inprocess``: sequential in this process for 1 worker, else a :class:`ParallelExecutor`
    (same results, less wall time); on a GPU (``device`` not the CPU) one process trains:
    forked workers cannot share a CUDA context. ``batched``: a
    :class:`~fedcure_app.simulation.batched.BatchedExecutor` in this process (one computation
    per coalition; parallel runs come from ``fedcure experiment --jobs``)."""
    n = resolve_workers(workers)
    if federation.cfg.run.executor == "batched":
        from fedcure_app.simulation.batched import BatchedExecutor

        if n > 1:
            log.info("the batched executor trains in one process (--workers %d unused)", n)
        ds = federation.dataset
        return BatchedExecutor(ds.model_spec, ds.num_classes, client_tensors(federation),
                               device=device,
                               graphs=(federation.cfg.run.cuda_graphs
                                       and torch.device(device).type == "cuda"))
    if torch.device(device).type != "cpu":
        if n > 1:
            log.info("training on %s in one process (worker processes are CPU-only)", device)
        return make_inprocess_executor(federation, device=device)
    if n == 1:
        return make_inprocess_executor(federation)
    ds = federation.dataset
    test = (torch.from_numpy(ds.x_test).float(), torch.from_numpy(ds.y_test).long())
    return ParallelExecutor(ds.model_spec, ds.num_classes, client_tensors(federation), n,
                            test_data=test)


@dataclass(order=True)
class _Arrival:
    time_s: float
    seq: int
    dispatch: Dispatch = field(compare=False)
    #: the edge model, a worker pool's future of it, or the task itself until it is trained
    result: EdgeResult | Future[EdgeResult] | EdgeTask = field(compare=False)
    latency_s: float = field(compare=False)
    energy_j: float = field(compare=False)


#: ``(strategy, records, simulated seconds now, initial accuracy or None) -> None``
StateHook = Callable[[FedCureStrategy, list[dict[str, Any]], float, float | None], None]


class SimulationEngine:
    """Runs the semi-asynchronous hierarchy on a simulated clock with a client executor."""

    def __init__(self, federation: Federation, executor: ClientExecutor, *,
                 device: torch.device | str = "cpu") -> None:
        self.fed = federation
        self.device = torch.device(device)
        self.cfg = federation.cfg
        self.executor = executor
        self.strategy = build_strategy(
            self.cfg, federation.coalitions, federation.client_samples, federation.population,
            federation.prior_latency(), federation.initial_arrays, deployed=False)
        self._clock_rng = np.random.default_rng(derive_seed(self.cfg.run.seed, "clock"))
        self._eval_model = build_model(federation.dataset.model_spec,
                                       federation.dataset.num_classes).to(self.device)
        self._x_test = torch.from_numpy(federation.dataset.x_test).to(self.device)
        self._y_test = torch.from_numpy(federation.dataset.y_test).to(self.device)
        self._spr = federation.samples_per_round
        self._seq = 0
        submit = getattr(executor, "submit", None)
        workers = int(getattr(executor, "workers", 1))
        #: tasks run asynchronously (collected at their arrival) when the executor offers it
        #: and at least as many coalitions train at once as it has workers; else one at a time
        self._submit = (submit if submit is not None and workers > 1
                        and self.strategy.max_concurrent >= workers else None)

    # -------------------------------------------------------------- simulated latency
    def _simulated_latency(self, d: Dispatch) -> tuple[float, float]:
        """Latency (s) and energy (J) of coalition task ``d`` on the simulated devices."""
        pop = self.fed.population
        idx = np.asarray(d.clients)
        f = np.clip(np.array([d.frequencies_ghz[c] for c in d.clients]),
                    pop.f_min_ghz[idx], pop.f_max_ghz[idx])
        spr = self._spr[idx]
        work = spr + self.cfg.devices.edge_round_client_samples
        total = 0.0
        for _ in range(self.cfg.method.tau_e):
            total += float(pop.round_seconds(work, self.fed.model_bytes, f,
                                             rng=self._clock_rng, idx=idx).max())
        total += self.cfg.method.tau_e * self.cfg.devices.edge_round_overhead_s
        total += 2 * 8.0 * self.fed.model_bytes / (self.cfg.devices.edge_link_mbps * 1e6)
        energy = float(pop.energy_joules(work, f, idx=idx).sum()) * self.cfg.method.tau_e
        return total, energy

    def _launch(self, d: Dispatch, now: float, heap: list[_Arrival]) -> None:
        task = EdgeTask(
            task_id=f"r{d.round}-c{d.coalition}",
            coalition=d.coalition,
            version=d.version,
            arrays=self.strategy.global_arrays,
            clients=d.clients,
            frequencies_ghz=d.frequencies_ghz,
            tau_e=self.cfg.method.tau_e,
            tau_c=self.cfg.method.tau_c,
            lr=self.cfg.method.lr,
            batch_size=self.cfg.method.batch_size,
            seed=derive_seed(self.cfg.run.seed, d.round, d.coalition),
            momentum=self.cfg.method.momentum,
            tau_c_unit=self.cfg.method.tau_c_unit,
        )
        # whole tasks side by side where the executor can and enough coalitions train at once;
        # else the task trains when it arrives (never, if the run ends first)
        result: Future[EdgeResult] | EdgeTask = (
            self._submit(task) if self._submit is not None else task)
        latency, energy = self._simulated_latency(d)
        self._seq += 1
        heapq.heappush(heap, _Arrival(now + latency, self._seq, d, result, latency, energy))

    def _evaluate(self) -> tuple[float, float, list[list[int]]]:
        """(accuracy, mean loss in nats, confusion counts [true][predicted]) of the global
        model on the test data."""
        # an executor with worker processes may evaluate there (same numbers, less wall time)
        split = getattr(self.executor, "evaluate_global", None)
        if split is not None:
            got = split(self.strategy.global_arrays)
            if got is not None:
                return float(got[0]), float(got[1]), np.asarray(got[2]).tolist()
        set_weights(self._eval_model, self.strategy.global_arrays)
        res = evaluate(self._eval_model, self._x_test, self._y_test,
                       batch_size=eval_batch_size(self.device))
        return float(res.accuracy), float(res.loss), [list(row) for row in res.confusion]

    def _decision_inputs(self) -> dict[str, Any]:
        """What the scheduler sees when it fills the free slots after an arrival (diagnostics:
        read before :meth:`FedCureStrategy.dispatch`, changing nothing): the available
        coalitions, every virtual queue Λ_m and every latency estimate T̂_m (s)."""
        return {"candidates": self.strategy.available(),
                "queues_before": self.strategy.scheduler.queues.values.tolist(),
                "estimates_s": [float(v) for v in self.strategy.estimator.mean()]}

    # -------------------------------------------------------------- the loop
    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None,
            on_state: StateHook | None = None) -> dict[str, Any]:
        """Run ``global_rounds`` arrivals; return the result dict (records + summary).

        ``on_state(strategy, records, now_s, initial_accuracy)``, called on this thread after
        round 0's dispatch and after every round, may read the strategy (the live view)."""
        cfg = self.cfg
        wall0 = time.perf_counter()
        heap: list[_Arrival] = []
        now = 0.0
        for d in self.strategy.dispatch():
            self._launch(d, now, heap)
        records: list[dict[str, Any]] = []
        acc0, _, _ = self._evaluate()
        if on_state is not None:
            on_state(self.strategy, records, now, acc0)
        schedule = EvalSchedule(cfg)
        steps = local_steps(cfg, self.fed.client_samples)
        for _ in range(cfg.run.global_rounds):
            if not heap:
                raise RuntimeError("no coalition is training: nothing can arrive")
            a = heapq.heappop(heap)
            now = a.time_s
            if isinstance(a.result, Future):
                a.result = a.result.result()
            elif isinstance(a.result, EdgeTask):
                a.result = self.executor.run(a.result)
            diag = arrival_diagnostics(a.result, self.strategy.global_arrays)
            rec = self.strategy.on_arrival(EdgeUpdate(
                coalition=a.dispatch.coalition, base_version=a.dispatch.version,
                arrays=a.result.arrays, num_samples=a.result.num_samples,
                latency_s=a.latency_s,
            ))
            decision = self._decision_inputs()
            new = self.strategy.dispatch()
            for d in new:
                self._launch(d, now, heap)
            acc = loss = confusion = per_class = None
            last = rec.round == cfg.run.global_rounds or past_budget(cfg, now)
            if schedule.due(rec.round, now) or last:
                acc, loss, confusion = self._evaluate()
                per_class = list(class_accuracy(np.asarray(confusion)))
            row = {
                "round": rec.round, "time_s": now, "coalition": rec.coalition,
                "staleness": rec.staleness, "xi": rec.xi, "latency_s": rec.latency_s,
                "estimate_s": rec.estimate_s, "version": rec.version,
                "queues": self.strategy.scheduler.queues.values.tolist(),
                "dispatched": [d.coalition for d in new],
                "frequencies_ghz": {str(c): f for c, f in a.dispatch.frequencies_ghz.items()},
                "energy_j": a.energy_j, "accuracy": acc, "loss": loss,
                "client_steps": int(steps[list(a.dispatch.clients)].sum()) * cfg.method.tau_e,
                "wan_bytes": 2 * self.fed.model_bytes,
                "class_accuracy": per_class, "confusion": confusion, **diag, **decision,
            }
            records.append(row)
            if on_round is not None:
                on_round(row)
            if on_state is not None:
                on_state(self.strategy, records, now, None)
            if last:
                break
        for left in heap:  # tasks still training when the run ended: not needed
            if isinstance(left.result, Future):
                left.result.cancel()
        return self._summary(records, acc0, time.perf_counter() - wall0)

    def _summary(self, records: list[dict[str, Any]], acc0: float, wall: float) -> dict[str, Any]:
        fed = self.fed
        part = self.strategy.participation
        share = part / max(1, part.sum())
        accs = [r["accuracy"] for r in records if r["accuracy"] is not None]
        counts = fed.partition.label_counts
        m = self.cfg.federation.num_edges
        choice = getattr(self.executor, "conv_choice", None)  # the batched executor's timing
        return {
            "config": self.cfg.model_dump(mode="json", by_alias=True),
            "dataset": fed.dataset.name,
            # own data: the test split is the union of the clients' held-out parts, so its
            # accuracy is the clients' sample-weighted (federated) accuracy
            "evaluation": "federated" if fed.dataset.task is not None
            and not fed.dataset.test_source else "central",
            "clients": list(fed.dataset.client_names) or None,
            # own data: the clients refused (name -> why), as a deployed cloud lists them
            "withdrawn": dict(fed.dataset.withdrawn),
            "initial_accuracy": acc0,
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            # the last evaluation's per-class accuracy, keyed by class name
            "class_accuracy_by_name": by_name(last_class_accuracy(records),
                                              fed.dataset.class_names),
            **record_totals(records),
            "wall_seconds": wall,
            "device": str(self.device),
            "conv_path": getattr(self.executor, "conv_path", None),
            "conv_choice": choice.to_dict() if choice is not None else None,
            "coalitions": fed.coalitions,
            "initial_jsd": float(average_pairwise_jsd(
                coalition_label_counts(counts, fed.partition.initial_assignment, m))),
            "formed_jsd": float(average_pairwise_jsd(
                coalition_label_counts(counts, fed.assignment, m))),
            "participation": {
                "rounds": part.tolist(),
                "share": share.tolist(),
                "delta": self.strategy.delta.tolist(),
            },
            "records": records,
        }


def simulate(
    cfg: FedCureConfig,
    *,
    dataset: Dataset | None = None,
    executor: ClientExecutor | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_state: StateHook | None = None,
    workers: int | None = 1,
    device: torch.device | str = "cpu",
    initial_arrays: list[np.ndarray] | None = None,
    on_model: Callable[[list[np.ndarray]], None] | None = None,
) -> dict[str, Any]:
    """Build the federation and run it with the configured executor; return the result dict.

    ``workers``: processes training a coalition's clients when no ``executor`` is given
    (1: in this process; None: one per core, what ``fedcure simulate`` uses). Wall time is all
    it changes. ``device``: where the clients train and the global model is evaluated (a GPU
    trains in this process, whatever ``workers`` says). ``on_state``: see
    :meth:`SimulationEngine.run` (the live view). ``initial_arrays``: the model to start from
    (``--init-model``) instead of a seeded fresh one; ``on_model(arrays)``: called with the
    final global model."""
    fed = build_federation(cfg, dataset)
    if initial_arrays is not None:
        fed.initial_arrays = [np.asarray(a, dtype=np.float32) for a in initial_arrays]
    own = executor is None
    if executor is None:
        if cfg.run.executor == "flower":
            raise ValueError(
                "the flower executor runs under `flwr run` (see docs/flower.md); "
                "use --executor inprocess or batched here"
            )
        executor = make_executor(fed, workers, device=device)
    try:
        if cfg.peers.peer != "none":  # a peer on the same clock (docs/DESIGN.md, "The peers")
            from fedcure_app.simulation.peer_engine import PeerEngine

            peer = PeerEngine(fed, executor, device=device)
            result = peer.run(on_round)
            if on_model is not None and peer.final_arrays is not None:
                on_model(peer.final_arrays)
            return result
        engine = SimulationEngine(fed, executor, device=device)
        result = engine.run(on_round, on_state)
        if on_model is not None:
            on_model(engine.strategy.global_arrays)
        return result
    finally:
        if own:
            executor.close()


__all__ = [
    "GPU_EVAL_BATCH", "Federation", "SimulationEngine", "arrival_diagnostics", "build_federation",
    "eval_batch_size",
    "client_tensors", "make_executor",
    "make_inprocess_executor", "simulate",
]
