"""The controller's steps for edge answers and lost coalitions (part of
:class:`cloud_server.controller.CloudController`, kept apart to stay readable).

Checks before any state changes (:meth:`ArrivalSteps.find_task`,
:meth:`~ArrivalSteps.check_submit`), then one arrival applied whole or not at all
(:meth:`~ArrivalSteps.arrive`), and failover: a coalition marked lost and its slot refilled
(:meth:`~ArrivalSteps.lose`), or taken back (:meth:`~ArrivalSteps.take_back`). Every method
here that changes state holds ``self.lock`` and writes the checkpoint before it returns.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.strategy import EdgeUpdate
from fedcure_app.tasks import ClientReport
from cloud_server import validation as door
from cloud_server.refusal import Reason, Refusal
from cloud_server.screening import distance
from cloud_server.state import Arrival, TaskState

log = logging.getLogger("fedcure.cloud")


class ArrivalSteps:
    """Submit checks, aggregation with rollback, and failover of a :class:`CloudController`."""

    # attributes of CloudController used here (and its methods fault, make_task,
    # save_checkpoint)
    cfg: Any
    lock: Any
    strategy: Any
    tasks: dict[str, TaskState]
    records: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    screen: Any
    population: Any
    t0: float | None
    _model_cache: Any

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

    def over_reply(self, detail: str) -> pb.SubmitReply:
        """The answer to a Submit after training ended (not aggregated)."""
        return pb.SubmitReply(accepted=False,
                              version=self.strategy.version if self.strategy else 0,
                              detail=detail)

    def too_stale(self, task: TaskState) -> Refusal | None:
        """For an expired task: the refusal when it is staler than ``late-staleness-bound``."""
        staleness = self.strategy.version - task.dispatch.version
        bound = self.cfg.reliability.late_staleness_bound
        if staleness <= bound:
            return None
        return Refusal(Reason.FAILED_PRECONDITION,
                       f"task {task.task_id} expired ({task.expired}) and is {staleness} "
                       f"versions stale, beyond late-staleness-bound {bound}; not aggregated")

    def check_submit(self, task: TaskState, num_samples: int, latency_s: float, stats: Any,
                     dropped: list[int]) -> None:
        """A Submit of ``task`` is expected and its numbers are within bounds (an expired
        task's answer counts as a late, stale update: see :meth:`too_stale`)."""
        m = task.dispatch.coalition
        members: Sequence[int]
        if task.expired is not None:
            members = self.strategy.coalitions[m]
        else:
            if self.strategy.in_flight.get(m) is not task.dispatch:
                raise Refusal(Reason.FAILED_PRECONDITION,
                              f"task {task.task_id} is no longer expected")
            members = task.dispatch.clients
        try:
            door.check_submit(num_samples, latency_s, stats, dropped, members,
                              self.cfg.method.tau_e)
        except door.Refused as err:
            raise Refusal(Reason.INVALID_ARGUMENT, f"task {task.task_id}: {err}") from None

    def arrive(self, task: TaskState, arrays: list[np.ndarray], latency: float,
               edge_latency: float, num_samples: int, reports: list[ClientReport],
               dropped: list[int], late: bool = False) -> Arrival:
        """Aggregate one edge model, dispatch again, record the round, write the checkpoint
        (worker thread): all of it or, when any step fails, none (the state is rolled back).

        ``latency``: seconds the cloud measured from sending the task to the answer;
        ``edge_latency``: what the edge measured. Raises ``ValueError`` when the strategy
        refuses the arrival, :class:`Refusal` for a refused model."""
        strategy = self.strategy
        assert strategy is not None and self.t0 is not None
        with self.lock:
            undo = strategy.undo_point()
            marks = (len(self.records), len(self.faults), set(self.tasks),
                     self.screen.state_dict(), self._model_cache)
            try:
                return self.apply(task, arrays, latency, edge_latency, num_samples, reports,
                                  dropped, late)
            except BaseException:
                strategy.rollback(undo)
                del self.records[marks[0]:]
                del self.faults[marks[1]:]
                for tid in set(self.tasks) - marks[2]:
                    del self.tasks[tid]
                self.screen.load_state_dict(marks[3])
                self._model_cache = marks[4]
                task.reply = None
                raise

    def apply(self, task: TaskState, arrays: list[np.ndarray], latency: float,
              edge_latency: float, num_samples: int, reports: list[ClientReport],
              dropped: list[int], late: bool) -> Arrival:
        """:meth:`arrive`'s steps (holding the lock; the caller rolls back on failure)."""
        strategy = self.strategy
        assert strategy is not None and self.t0 is not None and self.population is not None
        d = task.dispatch
        m = d.coalition
        kappa = self.population.kappa
        energy = 0.0
        for r in reports:
            if 0 <= r.client < kappa.size and r.f_applied_ghz > 0:
                cycles = r.seconds * r.f_applied_ghz * 1e9
                energy += float(kappa[r.client] * cycles * r.f_applied_ghz ** 2)
        if not math.isfinite(energy):
            raise Refusal(Reason.INVALID_ARGUMENT,
                          f"task {task.task_id}: the reported stats give a non-finite energy")
        t0 = time.perf_counter()
        dist = distance(arrays, strategy.global_arrays)
        refused = self.screen.check(dist)
        if refused is not None:
            raise Refusal(Reason.INVALID_ARGUMENT, f"task {task.task_id}: {refused}")
        update = EdgeUpdate(coalition=m, base_version=d.version, arrays=arrays,
                            num_samples=num_samples, latency_s=latency)
        if late:
            staleness = strategy.version - d.version
            self.fault("late", m, f"task {task.task_id} answered after its deadline "
                                  f"({task.expired}); aggregated as a stale update "
                                  f"(staleness {staleness})")
            if m in strategy.unavailable:
                self.fault("back", m, f"coalition {m} available again: its edge server "
                                      "answered after the deadline")
                strategy.mark_available(m)
            rec = strategy.on_late_arrival(update, self.cfg.reliability.late_staleness_bound)
        else:
            rec = strategy.on_arrival(update)
        self.screen.accept(dist)
        t1 = time.perf_counter()
        finished = rec.round >= self.cfg.run.global_rounds
        new = [] if finished else [self.make_task(x) for x in strategy.dispatch()]
        log.debug("on_arrival %.3f s, dispatch + encode %.3f s", t1 - t0,
                  time.perf_counter() - t1)
        row = {
            "round": rec.round,
            "time_s": time.monotonic() - self.t0,
            "coalition": rec.coalition,
            "staleness": rec.staleness,
            "xi": rec.xi,
            "latency_s": rec.latency_s,
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
        }
        self.records.append(row)
        # the reply promises durability: checkpoint before anyone hears of the new version
        detail = f"aggregated as round {rec.round}"
        if late:
            detail += f" (late: stale update, staleness {rec.staleness}, xi {rec.xi:.4g})"
        task.reply = pb.SubmitReply(accepted=True, version=rec.version, detail=detail)
        self.save_checkpoint()
        return Arrival(row, new, finished)

    def lose(self, m: int, task: TaskState | None, why: str) -> list[TaskState]:
        """Mark coalition m unavailable (its task, if any, expires) and refill the free slot;
        returns the new tasks (worker thread). The fault is recorded before the state changes,
        both under the lock: a reader that sees the coalition unavailable also sees why."""
        s = self.strategy
        with self.lock:
            fault = len(self.faults)
            self.fault("lost", m, f"coalition {m} unavailable: {why}"
                       + (f" (task {task.task_id})" if task is not None else ""))
            s.mark_unavailable(m)
            if task is not None:
                task.expired = why
            new = [self.make_task(d) for d in s.refill()]
            if new:
                self.faults[fault]["detail"] += (
                    f"; dispatched {[t.dispatch.coalition for t in new]}")
            self.save_checkpoint()
            return new

    def take_back(self, m: int, why: str) -> list[TaskState]:
        """Let coalition m be scheduled again and fill free slots; returns the new tasks."""
        s = self.strategy
        with self.lock:  # fault first, then the state change (see lose)
            self.fault("back", m, f"coalition {m} available again: {why}")
            s.mark_available(m)
            new = [self.make_task(d) for d in s.refill()]
            self.save_checkpoint()
            return new
