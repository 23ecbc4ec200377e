"""Edge answers and lost coalitions of a formed federation: :class:`Arrivals`.

Checks before any state changes (:meth:`Arrivals.check`, :meth:`~Arrivals.too_stale`), then one
arrival applied whole or not at all (:meth:`~Arrivals.arrive`), and failover: a coalition
marked lost and its slot refilled (:meth:`~Arrivals.lose`), or taken back
(:meth:`~Arrivals.take_back`). The controller's :class:`~cloud_server.formed.FormedRun` makes
one at formation and calls the methods that change state holding the controller's lock; each of
them writes the checkpoint before it returns.

Records carry the simulation engine's keys: round, time_s (wall seconds since round 0 was
dispatched), coalition, staleness, xi, latency_s (measured by the cloud), estimate_s, version,
queues, dispatched, frequencies_ghz, energy_j, accuracy, loss; plus task_id, edge_latency_s
(what the ES measured), startup_s (what the ES reported of it as start-up), observed_latency_s
(what T̂ learned: :func:`observed_latency`; nothing when warmup, one of the coalition's first
``devices.warmup_tasks`` tasks), dropped, late, warmup and applied_ghz (client id → the
frequency it last reported applying in this task, GHz). Energy per client-round is κ_n·c_n·f_n²
with the cycles c_n = seconds·f_n·10⁹ the client reported running at f_n GHz.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import decode_arrays
from fedcure_app.strategy import EdgeUpdate
from fedcure_app.tasks import ClientReport
from cloud_server import validation as door
from cloud_server.durable import Durability
from cloud_server.refusal import Reason, Refusal
from cloud_server.screening import NormScreen, distance
from cloud_server.state import Arrival, Federation, RunLog, TaskBook, TaskState

log = logging.getLogger("fedcure.cloud")

#: the least share of a measured latency that T̂ learns, whatever start-up an edge reports
MIN_OBSERVED_SHARE = 0.05


def observed_latency(latency_s: float, startup_s: float) -> float:
    """The latency T̂ learns from (seconds): the measured ``latency_s`` less the ``startup_s``
    the edge reported (clients coming online, a trainer loading), never below
    :data:`MIN_OBSERVED_SHARE` of it. A start-up that lands in a task is a one-off, not the
    coalition's speed: counted, it would inflate the prior's calibration (every coalition's
    prior is rescaled by the observed/predicted ratio) and this coalition's posterior."""
    if not latency_s > 0 or not math.isfinite(latency_s):
        raise ValueError(f"latency must be positive seconds, got {latency_s}")
    if not startup_s >= 0 or not math.isfinite(startup_s):
        raise ValueError(f"startup must be finite seconds >= 0, got {startup_s}")
    return max(latency_s - startup_s, MIN_OBSERVED_SHARE * latency_s)


def base_arrays(task: TaskState, strategy: Any) -> list[np.ndarray]:
    """The model ``task`` started from, which the norm screen measures its edge model
    against: the step bound holds for the distance from it, whatever the global model did
    meanwhile (a stale answer's distance from the current global model adds the other
    coalitions' updates). The current global model when the task is of the current version
    or no longer carries its model (an expired task restored from a checkpoint)."""
    blob = task.message.model_bytes()
    if task.dispatch.version == strategy.version or len(blob) == 0:
        return strategy.global_arrays
    return decode_arrays(blob)


class ScreenedOut(Refusal):
    """An edge model the norm screen refused: its task ends unaggregated
    (:meth:`Arrivals.refuse`), so the coalition takes the next task."""


class Arrivals:
    """Submit checks, aggregation with rollback, and failover of one formed federation.

    Parameters
    ----------
    cfg:
        The configuration (τ_e, ``run.global_rounds``, the reliability bounds).
    federation:
        The formed federation; its strategy is what arrivals change.
    log:
        Where rounds and faults are recorded.
    tasks:
        The task book new dispatches go to.
    screen:
        The norm screen every edge model passes before aggregation.
    durability:
        Writes the checkpoint after every change.
    """

    def __init__(self, cfg: FedCureConfig, federation: Federation, log: RunLog,
                 tasks: TaskBook, screen: NormScreen, durability: Durability) -> None:
        self.cfg = cfg
        self.fed = federation
        self.log = log
        self.tasks = tasks
        self.screen = screen
        self.durability = durability

    def too_stale(self, task: TaskState) -> Refusal | None:
        """For an expired task: the refusal when it is staler than ``late-staleness-bound``."""
        staleness = self.fed.strategy.version - task.dispatch.version
        bound = self.cfg.reliability.late_staleness_bound
        if staleness <= bound:
            return None
        return Refusal(Reason.FAILED_PRECONDITION,
                       f"task {task.task_id} expired ({task.expired}) and is {staleness} "
                       f"versions stale, beyond late-staleness-bound {bound}; not aggregated")

    def check(self, task: TaskState, num_samples: int, latency_s: float, stats: Any,
              dropped: list[int], startup_s: float = 0.0) -> None:
        """A Submit of ``task`` is expected and its numbers are within bounds (an expired
        task's answer counts as a late, stale update: see :meth:`too_stale`)."""
        strategy = self.fed.strategy
        m = task.dispatch.coalition
        members: Sequence[int]
        if task.expired is not None:
            members = strategy.coalitions[m]
        else:
            if strategy.in_flight.get(m) is not task.dispatch:
                raise Refusal(Reason.FAILED_PRECONDITION,
                              f"task {task.task_id} is no longer expected")
            members = task.dispatch.clients
        try:
            door.check_submit(num_samples, latency_s, stats, dropped, members,
                              self.cfg.method.tau_e, startup_s)
        except door.Refused as err:
            raise Refusal(Reason.INVALID_ARGUMENT, f"task {task.task_id}: {err}") from None

    def arrive(self, task: TaskState, arrays: list[np.ndarray], latency: float,
               edge_latency: float, num_samples: int, reports: list[ClientReport],
               dropped: list[int], late: bool = False, startup_s: float = 0.0) -> Arrival:
        """Aggregate one edge model, dispatch again, record the round, write the checkpoint
        (holding the lock): all of it or, when any step fails, none (the state is rolled back).

        ``latency``: seconds the cloud measured from sending the task to the answer;
        ``edge_latency``: what the edge measured; ``startup_s``: what the edge reported of it as
        start-up (left out of T̂: :func:`observed_latency`). Raises ``ValueError`` when the
        strategy refuses the arrival, :class:`Refusal` for a refused model."""
        undo = self.fed.strategy.undo_point()
        marks = (self.log.mark(), self.tasks.mark(), self.screen.state_dict())
        try:
            return self._apply(task, arrays, latency, edge_latency, num_samples, reports,
                               dropped, late, startup_s)
        except BaseException:
            self.fed.strategy.rollback(undo)
            self.log.rollback(marks[0])
            self.tasks.rollback(marks[1])
            self.screen.load_state_dict(marks[2])
            task.reply = None
            raise

    def _apply(self, task: TaskState, arrays: list[np.ndarray], latency: float,
               edge_latency: float, num_samples: int, reports: list[ClientReport],
               dropped: list[int], late: bool, startup_s: float = 0.0) -> Arrival:
        """:meth:`arrive`'s steps (the caller rolls back on failure)."""
        strategy = self.fed.strategy
        d = task.dispatch
        m = d.coalition
        kappa = self.fed.population.kappa
        energy = 0.0
        for r in reports:
            if 0 <= r.client < kappa.size and r.f_applied_ghz > 0:
                cycles = r.seconds * r.f_applied_ghz * 1e9
                energy += float(kappa[r.client] * cycles * r.f_applied_ghz ** 2)
        if not math.isfinite(energy):
            raise Refusal(Reason.INVALID_ARGUMENT,
                          f"task {task.task_id}: the reported stats give a non-finite energy")
        t0 = time.perf_counter()
        dist = distance(arrays, base_arrays(task, strategy))
        refused = self.screen.check(dist)
        if refused is not None:
            raise ScreenedOut(Reason.INVALID_ARGUMENT, f"task {task.task_id}: {refused}")
        observed = observed_latency(latency, startup_s)
        update = EdgeUpdate(coalition=m, base_version=d.version, arrays=arrays,
                            num_samples=num_samples, latency_s=observed)
        if late:
            staleness = strategy.version - d.version
            self.log.fault("late", m, f"task {task.task_id} answered after its deadline "
                                      f"({task.expired}); aggregated as a stale update "
                                      f"(staleness {staleness})", strategy.round)
            if m in strategy.unavailable:
                self.log.fault("back", m, f"coalition {m} available again: its edge server "
                                          "answered after the deadline", strategy.round)
                strategy.mark_available(m)
            rec = strategy.on_late_arrival(update, self.cfg.reliability.late_staleness_bound)
        else:
            rec = strategy.on_arrival(update)
        self.screen.accept(dist)
        t1 = time.perf_counter()
        finished = rec.round >= self.cfg.run.global_rounds
        new = [] if finished else [self.tasks.make(x, strategy) for x in strategy.dispatch()]
        log.debug("on_arrival %.3f s, dispatch + encode %.3f s", t1 - t0,
                  time.perf_counter() - t1)
        row = {
            "round": rec.round,
            "time_s": self.log.elapsed_s(),
            "coalition": rec.coalition,
            "staleness": rec.staleness,
            "xi": rec.xi,
            "latency_s": latency,
            "startup_s": startup_s,
            "observed_latency_s": observed,
            "estimate_s": rec.estimate_s,
            "version": rec.version,
            "queues": np.asarray(strategy.scheduler.queues.values).tolist(),
            "dispatched": [t.dispatch.coalition for t in new],
            "frequencies_ghz": {str(c): f for c, f in d.frequencies_ghz.items()},
            "energy_j": energy,
            "accuracy": None,
            "loss": None,
            "task_id": task.task_id,
            "edge_latency_s": edge_latency,
            "dropped": dropped,
            "late": late,
            "warmup": bool(rec.extra.get("warmup", False)),
            "applied_ghz": {str(r.client): r.f_applied_ghz for r in reports
                            if r.f_applied_ghz > 0},
        }
        self.log.records.append(row)
        # the reply promises durability: checkpoint before anyone hears of the new version
        detail = f"aggregated as round {rec.round}"
        if late:
            detail += f" (late: stale update, staleness {rec.staleness}, xi {rec.xi:.4g})"
        task.reply = pb.SubmitReply(accepted=True, version=rec.version, detail=detail)
        self.durability.save(self.fed)
        return Arrival(row, new, finished)

    def lose(self, m: int, task: TaskState | None, why: str) -> list[TaskState]:
        """Mark coalition m unavailable (its task, if any, expires) and refill the free slot;
        returns the new tasks (holding the lock). The fault is recorded before the state
        changes: a reader that sees the coalition unavailable also sees why."""
        s = self.fed.strategy
        fault = self.log.fault("lost", m, f"coalition {m} unavailable: {why}"
                               + (f" (task {task.task_id})" if task is not None else ""),
                               s.round)
        s.mark_unavailable(m)
        if task is not None:
            task.expired = why
        return self._refill(fault)

    def refuse(self, m: int, task: TaskState, why: str) -> list[TaskState]:
        """Coalition m's edge model was refused: its task ends unaggregated (an answer to it
        counts as late), the coalition stays schedulable and the free slot is refilled (queues
        unchanged); returns the new tasks (holding the lock). One ``refused`` fault."""
        s = self.fed.strategy
        fault = self.log.fault("refused", m, f"task {task.task_id} of coalition {m} ended "
                               f"unaggregated: {why}", s.round)
        if s.in_flight.get(m) is task.dispatch:
            del s.in_flight[m]
        task.expired = why
        return self._refill(fault)

    def _refill(self, fault: dict[str, Any]) -> list[TaskState]:
        """Fill the free slots (queues unchanged), name the new tasks in ``fault``, checkpoint
        (best effort); returns the new tasks."""
        s = self.fed.strategy
        new = [self.tasks.make(d, s) for d in s.refill()]
        if new:
            fault["detail"] += f"; dispatched {[t.dispatch.coalition for t in new]}"
        self.durability.save(self.fed, required=False)
        return new

    def take_back(self, m: int, why: str) -> list[TaskState]:
        """Let coalition m be scheduled again and fill free slots; returns the new tasks
        (holding the lock). The fault first, then the state change (see :meth:`lose`)."""
        s = self.fed.strategy
        self.log.fault("back", m, f"coalition {m} available again: {why}", s.round)
        s.mark_available(m)
        new = [self.tasks.make(d, s) for d in s.refill()]
        self.durability.save(self.fed, required=False)
        return new


__all__ = ["MIN_OBSERVED_SHARE", "Arrivals", "ScreenedOut", "observed_latency"]
