"""The peers (FedAvg, HierFAVG, FedBuff, FedAT) on FedCure's simulated clock.

Same federation as FedCure's engine (data, partition, device profiles with their access-capped
links, model, local optimiser, τ_c, the clock's seeded jitter stream) and the same executors: a
group's synchronous round is an :class:`~fedcure_app.tasks.EdgeTask` (τ_e = 1 over a set of
clients is one FedAvg round over them; one client is that client's local training). The
aggregation rules are :mod:`fedcure_app.core.peers`. Latency (docs/DESIGN.md, "The peers"):
a flat method's clients reach the cloud over their own links (the model down and up, no edge
hop); HierFAVG crosses the edge↔cloud link as FedCure does. One global round is one
aggregation at the top; each record has FedCure's keys plus ``client_steps`` and ``wan_bytes``
(bytes on the cloud's links).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedcure_app.core import peers as rules
from fedcure_app.core.allocation import optimal_frequency
from fedcure_app.models import build_model, set_weights
from fedcure_app.simulation.executors import ClientExecutor
from fedcure_app.simulation.pacing import (EvalSchedule, eval_batch_size, local_steps,
                                          past_budget, record_totals)
from fedcure_app.tasks import EdgeResult, EdgeTask, derive_seed
from fedcure_app.trained.names import by_name, last_class_accuracy
from fedcure_app.training import class_accuracy, evaluate

log = logging.getLogger(__name__)

#: FedBuff's K and FedAT's tier count when not configured (Nguyen et al. 2022; Chai et al. 2021)
PAPER_BUFFER_K = 10
PAPER_TIERS = 5


@dataclass
class Aggregation:
    """One global round of a peer: the new global model and what it cost."""

    time_s: float
    arrays: list[np.ndarray]
    latency_s: float
    energy_j: float
    client_steps: int
    wan_bytes: int
    clients: list[int]
    group: int | None = None
    staleness: float = 0.0
    losses: list[float] = field(default_factory=list)


class PeerClock:
    """The simulated devices, the clock's RNG and the executor, as the peers use them (``fed``:
    a :class:`fedcure_app.simulation.engine.Federation`, which builds the peers' runs)."""

    def __init__(self, fed: Federation, executor: ClientExecutor) -> None:
        self.fed = fed
        self.cfg = fed.cfg
        self.executor = executor
        self.pop = fed.population
        self.rng = np.random.default_rng(derive_seed(self.cfg.run.seed, "clock"))
        self.pick = np.random.default_rng(derive_seed(self.cfg.run.seed, "peer-sampling"))
        self.work = fed.samples_per_round + self.cfg.devices.edge_round_client_samples
        self.steps = local_steps(self.cfg, fed.client_samples)
        self.bytes = fed.model_bytes
        self.tasks = 0

    def frequencies(self, idx: np.ndarray) -> np.ndarray:
        """Each client's frequency (GHz) in a round over ``idx``: f_max, or with
        ``--frequency fedcure`` Theorem 2's f* for T̂ = the round's latency at f_max."""
        top = self.pop.f_max_ghz[idx]
        if self.cfg.peers.frequency == "top":
            return top
        t_hat = float(self.pop.round_seconds(self.work[idx], self.bytes, top, idx=idx).max())
        m = self.cfg.method
        return np.atleast_1d(optimal_frequency(
            self.pop.cycles_per_sample[idx] * self.work[idx], t_hat, alpha=m.alpha, gamma=m.gamma,
            varsigma=m.varsigma, f_min_ghz=self.pop.f_min_ghz[idx], f_max_ghz=top))

    def round_cost(self, clients: list[int]) -> tuple[float, float, np.ndarray]:
        """(latency s, energy J, frequencies) of one synchronous round of ``clients``: the
        slowest client's compute and model down and up its own link, jittered."""
        idx = np.asarray(clients)
        f = self.frequencies(idx)
        seconds = self.pop.round_seconds(self.work[idx], self.bytes, f, rng=self.rng, idx=idx)
        latency = float(seconds.max()) + self.cfg.devices.edge_round_overhead_s
        return latency, float(self.pop.energy_joules(self.work[idx], f, idx=idx).sum()), f

    def train(self, arrays: list[np.ndarray], clients: list[int], freqs: np.ndarray,
              tau_e: int = 1) -> EdgeResult:
        """τ_e FedAvg rounds over ``clients`` from ``arrays`` (one round: their sample-weighted
        mean after τ_c local steps each)."""
        self.tasks += 1
        m = self.cfg.method
        return self.executor.run(EdgeTask(
            task_id=f"peer-{self.tasks}", coalition=0, version=self.tasks, arrays=arrays,
            clients=tuple(int(c) for c in clients),
            frequencies_ghz={int(c): float(f) for c, f in zip(clients, freqs)},
            tau_e=tau_e, tau_c=m.tau_c, lr=m.lr, batch_size=m.batch_size,
            seed=derive_seed(self.cfg.run.seed, "peer", self.tasks), momentum=m.momentum,
            tau_c_unit=m.tau_c_unit))

    def client_steps(self, clients: list[int], tau_e: int = 1) -> int:
        return int(self.steps[np.asarray(clients)].sum()) * tau_e


def _losses(result: EdgeResult) -> list[float]:
    return [r.loss for r in result.reports]


def fedavg_rounds(c: PeerClock, arrays: list[np.ndarray]) -> Iterator[Aggregation]:
    """Flat synchronous FedAvg: sample C·K clients, wait for all, sample-weighted mean."""
    now = 0.0
    n = len(c.pop)
    while True:
        clients = rules.sample_clients(c.pick, n, c.cfg.peers.fraction).tolist()
        latency, energy, f = c.round_cost(clients)
        res = c.train(arrays, clients, f)
        now += latency
        arrays = res.arrays
        yield Aggregation(now, arrays, latency, energy, c.client_steps(clients),
                          2 * c.bytes * len(clients), clients, losses=_losses(res))


def hierfavg_rounds(c: PeerClock, arrays: list[np.ndarray]) -> Iterator[Aggregation]:
    """HierFAVG: every edge (the initial partition) runs τ_e FedAvg rounds of all its clients;
    the cloud waits for every edge and averages the edge models by samples."""
    now = 0.0
    tau_e = c.cfg.method.tau_e
    assign = np.asarray(c.fed.partition.initial_assignment)
    edges = [np.flatnonzero(assign == e).tolist() for e in range(int(assign.max()) + 1)]
    edges = [e for e in edges if e]
    wan = 2 * 8.0 * c.bytes / (c.cfg.devices.edge_link_mbps * 1e6)
    while True:
        models, samples, latency, energy, losses = [], [], 0.0, 0.0, []
        for clients in edges:
            t = 0.0
            for _ in range(tau_e):
                lat, en, f = c.round_cost(clients)
                t += lat
                energy += en
            res = c.train(arrays, clients, f, tau_e=tau_e)
            models.append(res.arrays)
            samples.append(res.num_samples)
            losses += _losses(res)
            latency = max(latency, t + wan)
        now += latency
        arrays = rules.weighted_mean(models, rules.sample_weights(samples))
        everyone = [k for e in edges for k in e]
        yield Aggregation(now, arrays, latency, energy, c.client_steps(everyone, tau_e),
                          2 * c.bytes * len(edges), everyone, losses=losses)


def fedbuff_rounds(c: PeerClock, arrays: list[np.ndarray]) -> Iterator[Aggregation]:
    """FedBuff: ``concurrency`` clients train on the model they received; every K arrivals
    w ← w + η_g·mean(s(τ)·Δ); a client that reported is replaced by one drawn uniformly from
    the idle clients."""
    p = c.cfg.peers
    n = len(c.pop)
    conc = p.concurrency or n
    k = p.buffer_k or min(PAPER_BUFFER_K, conc)
    version = 0
    heap: list[tuple[float, int, int, int, list[np.ndarray], float, float, np.ndarray]] = []
    idle = set(range(n))
    seq = 0

    def start(now: float) -> None:
        nonlocal seq
        client = int(c.pick.choice(sorted(idle)))
        idle.discard(client)
        latency, energy, f = c.round_cost([client])
        seq += 1
        heapq.heappush(heap, (now + latency, seq, client, version, arrays, latency, energy, f))

    for _ in range(conc):
        start(0.0)
    buffer: list[tuple[list[np.ndarray], float]] = []
    since, energy, clients, losses = 0.0, 0.0, [], []
    while True:
        now, _, client, base, received, latency, en, f = heapq.heappop(heap)
        res = c.train(received, [client], f)
        buffer.append((rules.model_delta(res.arrays, received), float(version - base)))
        energy += en
        clients.append(client)
        losses += _losses(res)
        idle.add(client)
        if len(buffer) == k:
            arrays = rules.buffered_step(arrays, [d for d, _ in buffer],
                                         [s for _, s in buffer], p.server_lr)
            version += 1
            yield Aggregation(now, arrays, now - since, energy, c.client_steps(clients),
                              2 * c.bytes * len(clients), clients,
                              staleness=float(np.mean([s for _, s in buffer])), losses=losses)
            buffer, since, energy, clients, losses = [], now, 0.0, [], []
        start(now)


def fedat_rounds(c: PeerClock, arrays: list[np.ndarray]) -> Iterator[Aggregation]:
    """FedAT: tiers by profile latency at f_max; each tier runs synchronous FedAvg rounds of
    all its clients from the latest global model, asynchronously of the other tiers; after
    each tier round the global model is the cross-tier weighted mean of the tier models
    (mirror weights over the tiers that have reported so far)."""
    n = len(c.pop)
    m = min(c.cfg.peers.tiers or PAPER_TIERS, n)
    prior = c.pop.round_seconds(c.work, c.bytes, c.pop.f_max_ghz)
    tier_of = rules.latency_tiers(prior, m)
    tiers = [np.flatnonzero(tier_of == t).tolist() for t in range(m)]
    models = [arrays] * m
    counts = np.zeros(m, dtype=np.int64)
    heap: list[tuple[float, int, list[np.ndarray], float, float, np.ndarray]] = []
    for t in range(m):
        latency, energy, f = c.round_cost(tiers[t])
        heapq.heappush(heap, (latency, t, arrays, latency, energy, f))
    version = 0
    based = np.zeros(m, dtype=np.int64)
    while True:
        now, t, received, latency, energy, f = heapq.heappop(heap)
        res = c.train(received, tiers[t], f)
        models[t] = res.arrays
        counts[t] += 1
        reported = np.flatnonzero(counts > 0)
        w = np.zeros(m)
        w[reported] = rules.cross_tier_weights(counts[reported])
        arrays = rules.weighted_mean([models[i] for i in reported], w[reported])
        staleness = float(version - based[t])
        version += 1
        based[t] = version
        yield Aggregation(now, arrays, latency, energy, c.client_steps(tiers[t]),
                          2 * c.bytes * len(tiers[t]), tiers[t], group=t,
                          staleness=staleness, losses=_losses(res))
        latency, energy, f = c.round_cost(tiers[t])
        heapq.heappush(heap, (now + latency, t, arrays, latency, energy, f))


PEER_RUNS: dict[str, Callable[[PeerClock, list[np.ndarray]], Iterator[Aggregation]]] = {
    "fedavg": fedavg_rounds, "hierfavg": hierfavg_rounds, "fedbuff": fedbuff_rounds,
    "fedat": fedat_rounds,
}


class PeerEngine:
    """Runs one peer (``peers.peer``) to ``global-rounds`` aggregations or the time budget."""

    def __init__(self, fed: Federation, executor: ClientExecutor, *,
                 device: torch.device | str = "cpu") -> None:
        self.fed = fed
        self.cfg = fed.cfg
        self.device = torch.device(device)
        self.clock = PeerClock(fed, executor)
        self._model = build_model(fed.dataset.model_spec, fed.dataset.num_classes).to(self.device)
        self._x = torch.from_numpy(fed.dataset.x_test).to(self.device)
        self._y = torch.from_numpy(fed.dataset.y_test).to(self.device)
        #: the global model after the last round (None before :meth:`run`)
        self.final_arrays: list[np.ndarray] | None = None

    def _evaluate(self, arrays: list[np.ndarray]) -> tuple[float, float, list[list[int]]]:
        set_weights(self._model, arrays)
        res = evaluate(self._model, self._x, self._y, batch_size=eval_batch_size(self.device))
        return float(res.accuracy), float(res.loss), [list(row) for row in res.confusion]

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        cfg = self.cfg
        wall0 = time.perf_counter()
        acc0, _, _ = self._evaluate(self.fed.initial_arrays)
        schedule = EvalSchedule(cfg)
        part = np.zeros(len(self.fed.population), dtype=np.int64)
        records: list[dict[str, Any]] = []
        rounds = PEER_RUNS[cfg.peers.peer](self.clock, list(self.fed.initial_arrays))
        for r, agg in zip(range(1, cfg.run.global_rounds + 1), rounds):
            part[agg.clients] += 1
            last = r == cfg.run.global_rounds or past_budget(cfg, agg.time_s)
            acc = loss = confusion = per_class = None
            if schedule.due(r, agg.time_s) or last:
                acc, loss, confusion = self._evaluate(agg.arrays)
                per_class = list(class_accuracy(np.asarray(confusion)))
            row = {
                "round": r, "time_s": agg.time_s, "coalition": agg.group,
                "staleness": agg.staleness, "xi": None, "latency_s": agg.latency_s,
                "estimate_s": None, "version": r, "queues": [], "dispatched": [],
                "frequencies_ghz": {}, "energy_j": agg.energy_j, "accuracy": acc, "loss": loss,
                "client_steps": agg.client_steps, "wan_bytes": agg.wan_bytes,
                "clients": len(agg.clients), "class_accuracy": per_class,
                "confusion": confusion, "edge_distance": None,
                "train_loss_first": None, "train_loss_last": (
                    float(np.mean(agg.losses)) if agg.losses else None),
                "candidates": [], "queues_before": [], "estimates_s": [],
            }
            records.append(row)
            if on_round is not None:
                on_round(row)
            if last:
                break
        self.final_arrays = agg.arrays
        return self._summary(records, acc0, part, time.perf_counter() - wall0)

    def _summary(self, records: list[dict[str, Any]], acc0: float, part: np.ndarray,
                 wall: float) -> dict[str, Any]:
        accs = [r["accuracy"] for r in records if r["accuracy"] is not None]
        samples = self.fed.client_samples.astype(np.float64)
        return {
            "config": self.cfg.model_dump(mode="json", by_alias=True),
            "method": self.cfg.peers.peer,
            "dataset": self.fed.dataset.name,
            "evaluation": "federated" if self.fed.dataset.task is not None
            and not self.fed.dataset.test_source else "central",
            "clients": list(self.fed.dataset.client_names) or None,
            "withdrawn": dict(self.fed.dataset.withdrawn),
            "initial_accuracy": acc0,
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "class_accuracy_by_name": by_name(last_class_accuracy(records),
                                              self.fed.dataset.class_names),
            **record_totals(records),
            "wall_seconds": wall,
            "device": str(self.device),
            "conv_path": getattr(self.clock.executor, "conv_path", None),
            "conv_choice": None,
            "coalitions": self.fed.coalitions,
            "initial_jsd": None, "formed_jsd": None,
            # per client: the global rounds it took part in, against its share of the samples
            "participation": {"rounds": part.tolist(),
                              "share": (part / max(1, part.sum())).tolist(),
                              "delta": (samples / samples.sum()).tolist()},
            "records": records,
        }


__all__ = ["PAPER_BUFFER_K", "PAPER_TIERS", "PEER_RUNS", "Aggregation", "PeerClock",
           "PeerEngine", "fedat_rounds", "fedavg_rounds", "fedbuff_rounds", "hierfavg_rounds"]
