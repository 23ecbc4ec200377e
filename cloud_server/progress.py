"""Live progress inside a global round: what each coalition's ES reports (``EdgeLink.Progress``).

An ES reports the edge round its task is training and the clients it still waits for (see
``edge_server.progress``). :class:`ProgressBoard` keeps the latest report per coalition, logs it
(``coalition 1: task r3-c1-v2 edge round 4/12, waiting for clients [3, 5], 35 s in, ETA ~40 s``) on
every new edge round and at least every ``log_every_s`` seconds while reports keep coming, and
gives ``Monitor.Status`` a :class:`ProgressRow` per task still in flight. The ETA comes from the
latency estimator: the coalition's estimate T̂_m *now* (:func:`current_estimate`), split evenly
over its τ_e edge rounds (:func:`eta_s`). Not the T̂ the task was dispatched with: in deployment
the first measured answers rescale every coalition's prior (often by 10-100×), so a task sent
in round 0 with the device profiles' prediction would show an ETA of a fraction of a second
while its coalition's own estimate, one column over, says far more is left. The controller
holds the board (``CloudController.report_progress``); :func:`progress_handler` serves the RPC
next to the codec's EdgeLink handler.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from fedcure_app.protocol import cloud_pb2 as pb

log = logging.getLogger("fedcure.cloud")

#: longest silence in the log (s) about a coalition whose ES keeps reporting the same state
LOG_EVERY_S = 15.0


def eta_s(edge_round: int, tau_e: int, estimate_s: float, elapsed_s: float = 0.0) -> float:
    """Seconds until the task's answer, from the estimator's latency ``estimate_s`` (T̂_m, the
    whole task): what is left of it after ``elapsed_s``, but never less than its share for the
    edge rounds not started yet (``edge_round`` is 0-based; ``tau_e``: all done → 0)."""
    if tau_e < 1 or not estimate_s > 0 or edge_round >= tau_e:
        return 0.0
    later = estimate_s * max(tau_e - edge_round - 1, 0) / tau_e
    return max(estimate_s - max(elapsed_s, 0.0), later)


def current_estimate(t_hat_s: Sequence[float], coalition: int, dispatched_s: float) -> float:
    """The T̂ (seconds) a task's ETA counts from: coalition's entry of ``t_hat_s`` (every
    coalition's estimate now) where it is a positive number, else ``dispatched_s`` (the estimate
    the task was sent with)."""
    if 0 <= coalition < len(t_hat_s):
        now = float(t_hat_s[coalition])
        if now > 0 and math.isfinite(now):
            return now
    return float(dispatched_s)


@dataclass
class Report:
    """One coalition's latest progress report."""

    task_id: str
    coalition: int
    edge_round: int
    tau_e: int
    waiting: tuple[int, ...]
    elapsed_s: float
    estimate_s: float
    received_at: float  # clock() when it came


@dataclass(frozen=True)
class ProgressRow:
    """Where one coalition's task stands as of a moment: ``waiting``: ids of the clients still
    training; ``elapsed_s`` and ``eta_s`` as of then; ``age_s``: how old the report is."""

    coalition: int
    edge_round: int
    tau_e: int
    waiting: tuple[int, ...]
    elapsed_s: float
    eta_s: float
    age_s: float


class ProgressBoard:
    """The latest report per coalition, logged and shown in ``Monitor.Status``."""

    def __init__(self, log_every_s: float = LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log_every_s = float(log_every_s)
        self._clock = clock
        self._reports: dict[int, Report] = {}
        self._logged: dict[int, tuple[str, int, float]] = {}  # task, edge round, when

    def update(self, report: Report) -> bool:
        """Keep ``report``; log it when its edge round is new or the last line about this
        coalition is ``log_every_s`` old. Returns whether it was logged."""
        self._reports[report.coalition] = report
        last = self._logged.get(report.coalition)
        now = report.received_at
        if (last is not None and last[0] == report.task_id and last[1] == report.edge_round
                and now - last[2] < self.log_every_s):
            return False
        self._logged[report.coalition] = (report.task_id, report.edge_round, now)
        log.info("%s", describe(report))
        return True

    def now(self) -> float:
        """The board's clock (seconds; ``Report.received_at`` is on it)."""
        return self._clock()

    def forget(self, coalition: int) -> None:
        """Drop coalition's last progress report (its task ended or was given up)."""
        self._reports.pop(coalition, None)

    def snapshot(self, live: Callable[[str], bool],
                 estimates: Sequence[float] = ()) -> tuple[ProgressRow, ...]:
        """The reports of tasks still in flight (``live(task_id)``), ages and ETAs as of now;
        ``estimates``: every coalition's T̂ now (seconds), which the ETAs count from
        (:func:`current_estimate`; a coalition without one: its report's estimate)."""
        now = self._clock()
        out = []
        for r in sorted(list(self._reports.values()), key=lambda r: r.coalition):
            if not live(r.task_id):
                continue
            age = max(0.0, now - r.received_at)
            estimate = current_estimate(estimates, r.coalition, r.estimate_s)
            out.append(ProgressRow(
                coalition=r.coalition, edge_round=r.edge_round, tau_e=r.tau_e,
                waiting=r.waiting, elapsed_s=r.elapsed_s + age,
                eta_s=eta_s(r.edge_round, r.tau_e, estimate, r.elapsed_s + age), age_s=age))
        return tuple(out)


def describe(r: Report) -> str:
    """One log line for a report."""
    if r.edge_round >= r.tau_e:
        where = f"all {r.tau_e} edge rounds done, submitting"
    else:
        where = (f"edge round {r.edge_round + 1}/{r.tau_e}, "
                 + (f"waiting for clients {list(r.waiting)}" if r.waiting
                    else "aggregating"))
    eta = eta_s(r.edge_round, r.tau_e, r.estimate_s, r.elapsed_s)
    over = r.elapsed_s - r.estimate_s
    # past T̂ the ETA is only the estimate's share for the rounds left: say the task is late
    late = f", {over:.0f} s past it" if r.estimate_s > 0 and over >= 1.0 else ""
    return (f"coalition {r.coalition}: task {r.task_id} {where}, {r.elapsed_s:.0f} s in, "
            f"ETA ~{eta:.0f} s (estimate T^ {r.estimate_s:.0f} s{late})")


def progress_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Serves ``fedcure.v1.EdgeLink/Progress`` with ``servicer.Progress`` (next to the codec's
    EdgeLink handler, which serves the other EdgeLink methods)."""
    return grpc.method_handlers_generic_handler("fedcure.v1.EdgeLink", {
        "Progress": grpc.unary_unary_rpc_method_handler(
            servicer.Progress, request_deserializer=pb.ProgressRequest.FromString,
            response_serializer=pb.ProgressReply.SerializeToString),
    })


__all__ = ["LOG_EVERY_S", "ProgressBoard", "ProgressRow", "Report", "current_estimate",
           "describe", "eta_s", "progress_handler"]
