"""``GET /metrics``: a :class:`~fedcure_app.live.model.LiveState` in the Prometheus text format.

A custom ``prometheus_client`` collector reads one snapshot per scrape (nothing is counted
twice, nothing holds the driver's lock). Names and units (:data:`METRICS` documents each):

=====================================  =========  =================================================
name                                   type       meaning
=====================================  =========  =================================================
fedcure_info                           gauge      1, labels ``source`` (cloud/simulation), ``clock``,
                                                  ``mode`` (simulation/deployment/testbed)
fedcure_phase                          gauge      1 for the current phase (label ``phase``), else 0
fedcure_global_version                 gauge      version of the global model
fedcure_global_rounds_total            counter    global rounds aggregated (edge-model arrivals)
fedcure_global_rounds_target           gauge      configured global rounds
fedcure_elapsed_seconds                gauge      seconds since round 0 was dispatched
fedcure_task_latency_seconds           histogram  measured task latency per coalition (label)
fedcure_virtual_queue                  gauge      Λ_m per coalition
fedcure_target_share                   gauge      δ_m per coalition
fedcure_round_share                    gauge      share of the rounds coalition m contributed
fedcure_latency_estimate_seconds       gauge      T̂_m per coalition (whole task)
fedcure_coalition_training             gauge      1 while coalition m trains
fedcure_client_directive_ghz           gauge      latest CPU-frequency directive per client id
fedcure_client_applied_ghz             gauge      latest frequency the client reported applying
fedcure_accuracy_ratio                 gauge      last test accuracy of the global model (0..1)
fedcure_evaluation_federated           gauge      1: that accuracy is the clients' (federated,
                                                  on their held-out parts), 0: a test set's
fedcure_evaluation_clients             gauge      federated: clients the last evaluation covers
fedcure_evaluation_samples             gauge      federated: held-out samples it covers
fedcure_clients_registered             gauge      clients registered
fedcure_clients_expected               gauge      clients formation waits for
fedcure_edges_connected                gauge      edge servers connected
fedcure_edges                          gauge      edge servers (coalitions) configured
fedcure_updates_accepted_total         counter    edge models aggregated
fedcure_updates_refused_total          counter    edge updates refused, label ``reason``
fedcure_late_answers_total             counter    answers after their task's deadline
fedcure_dropped_clients_total          counter    clients dropped from an edge round
fedcure_expired_tasks_total            counter    tasks that expired unanswered
=====================================  =========  =================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fedcure_app.live.model import PHASES, LiveState

#: upper bounds (s) of the task latency histogram's buckets
LATENCY_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)

#: name -> help text (the unit is in the name)
METRICS: dict[str, str] = {
    "fedcure_info": "FedCure live source (cloud or simulation), clock (wall or simulated) and "
                    "mode (simulation, deployment or testbed)",
    "fedcure_phase": "1 for the run's current phase, 0 for the others",
    "fedcure_global_version": "Version of the global model",
    "fedcure_global_rounds": "Global rounds aggregated (edge-model arrivals)",
    "fedcure_global_rounds_target": "Configured global rounds",
    "fedcure_elapsed_seconds": "Seconds since round 0 was dispatched (clock: see fedcure_info)",
    "fedcure_task_latency_seconds": "Measured latency of coalition tasks, dispatch to answer",
    "fedcure_virtual_queue": "Virtual queue Lambda_m of each coalition",
    "fedcure_target_share": "Target share of rounds delta_m of each coalition",
    "fedcure_round_share": "Share of the global rounds each coalition contributed",
    "fedcure_latency_estimate_seconds": "Bayesian latency estimate T-hat_m of a whole task",
    "fedcure_coalition_training": "1 while the coalition trains a task, else 0",
    "fedcure_client_directive_ghz": "Latest CPU-frequency directive sent to each client (GHz)",
    "fedcure_client_applied_ghz": "Latest CPU frequency each client reported applying (GHz)",
    "fedcure_accuracy_ratio": "Last measured test accuracy of the global model (0..1)",
    "fedcure_evaluation_federated": "1 when the accuracy is the clients' sample-weighted one "
                                    "on their held-out parts (federated), 0 for a test set's",
    "fedcure_evaluation_clients": "Clients whose held-out parts the last federated evaluation "
                                  "covers",
    "fedcure_evaluation_samples": "Held-out samples the last federated evaluation covers",
    "fedcure_clients_registered": "Clients registered with the cloud",
    "fedcure_clients_expected": "Clients coalition formation waits for",
    "fedcure_edges_connected": "Edge servers connected to the cloud",
    "fedcure_edges": "Edge servers (coalitions) configured",
    "fedcure_updates_accepted": "Edge models aggregated into the global model",
    "fedcure_updates_refused": "Edge updates refused, by reason (gRPC status name)",
    "fedcure_late_answers": "Edge answers that came after their task's deadline",
    "fedcure_dropped_clients": "Clients an edge dropped from an edge round",
    "fedcure_expired_tasks": "Coalition tasks that expired unanswered",
}


class LiveCollector(Collector):
    """Collects the metrics of ``source()`` (one :class:`LiveState` per scrape)."""

    def __init__(self, source: Callable[[], LiveState]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        s = self.source()
        v = s.view
        h = METRICS

        def gauge(name: str, value: float, labels: list[str] | None = None,
                  rows: list[tuple[list[str], float]] | None = None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, h[name], value=None if labels else value,
                                  labels=labels)
            for lv, x in rows or []:
                g.add_metric(lv, x)
            return g

        def counter(name: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, h[name], value=value)

        info = GaugeMetricFamily("fedcure_info", h["fedcure_info"],
                                 labels=["source", "clock", "mode"])
        info.add_metric([s.source, s.clock, s.mode], 1.0)
        yield info
        yield gauge("fedcure_phase", 0, ["phase"],
                    [([p], 1.0 if p == s.phase else 0.0) for p in PHASES])
        yield gauge("fedcure_global_version", v.version)
        yield counter("fedcure_global_rounds", v.round)
        yield gauge("fedcure_global_rounds_target", s.global_rounds)
        yield gauge("fedcure_elapsed_seconds", s.elapsed_s)
        hist = HistogramMetricFamily("fedcure_task_latency_seconds",
                                     h["fedcure_task_latency_seconds"], labels=["coalition"])
        m_count = len(v.members)
        per: list[list[float]] = [[] for _ in range(m_count)]
        for p in v.history:
            if 0 <= p.coalition < m_count:
                per[p.coalition].append(p.latency_s)
        for m, lat in enumerate(per):
            buckets = [(str(b), float(sum(1 for x in lat if x <= b))) for b in LATENCY_BUCKETS_S]
            buckets.append(("+Inf", float(len(lat))))
            hist.add_metric([str(m)], buckets, sum_value=float(sum(lat)))
        yield hist
        ms = [str(m) for m in range(m_count)]
        total = max(1, sum(v.rounds))
        yield gauge("fedcure_virtual_queue", 0, ["coalition"],
                    [([ms[m]], q) for m, q in enumerate(v.queues)])
        yield gauge("fedcure_target_share", 0, ["coalition"],
                    [([ms[m]], d) for m, d in enumerate(v.delta)])
        yield gauge("fedcure_round_share", 0, ["coalition"],
                    [([ms[m]], r / total) for m, r in enumerate(v.rounds)])
        yield gauge("fedcure_latency_estimate_seconds", 0, ["coalition"],
                    [([ms[m]], t) for m, t in enumerate(v.t_hat_s)])
        yield gauge("fedcure_coalition_training", 0, ["coalition"],
                    [([ms[m]], 1.0 if m in v.in_flight else 0.0) for m in range(m_count)])
        yield gauge("fedcure_client_directive_ghz", 0, ["client"],
                    [([str(c)], f) for c, f in sorted(v.directive_ghz.items())])
        yield gauge("fedcure_client_applied_ghz", 0, ["client"],
                    [([str(c)], f) for c, f in sorted(v.applied_ghz.items())])
        evaluated = [p for p in v.history if p.accuracy is not None]
        acc = evaluated[-1].accuracy if evaluated else v.initial_accuracy
        if acc is not None:
            yield gauge("fedcure_accuracy_ratio", acc)
        yield gauge("fedcure_evaluation_federated", float(s.evaluation == "federated"))
        last = evaluated[-1] if evaluated else None
        if last is not None and last.evaluation_clients is not None:
            yield gauge("fedcure_evaluation_clients", last.evaluation_clients)
        if last is not None and last.evaluation_samples is not None:
            yield gauge("fedcure_evaluation_samples", last.evaluation_samples)
        yield gauge("fedcure_clients_registered", s.clients_registered)
        yield gauge("fedcure_clients_expected", s.expected_clients)
        yield gauge("fedcure_edges_connected", s.edges_connected)
        yield gauge("fedcure_edges", s.num_edges)
        c = s.counts
        yield counter("fedcure_updates_accepted", c.accepted)
        refused = CounterMetricFamily("fedcure_updates_refused", h["fedcure_updates_refused"],
                                      labels=["reason"])
        for reason, n in sorted(c.refused.items()):
            refused.add_metric([reason], float(n))
        yield refused
        yield counter("fedcure_late_answers", c.late)
        yield counter("fedcure_dropped_clients", c.dropped)
        yield counter("fedcure_expired_tasks", c.expired)


def exposition(source: Callable[[], LiveState]) -> bytes:
    """The Prometheus text exposition of ``source()`` (one scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LiveCollector(source))
    return generate_latest(registry)


__all__ = ["LATENCY_BUCKETS_S", "METRICS", "LiveCollector", "exposition"]
