"""The Submit pipeline on the event loop: edge answers, losses and take-backs, one at a time.

:class:`ArrivalPipeline` checks a Submit before any state changes, then decodes, aggregates,
publishes and evaluates it holding one ``asyncio.Lock`` (the CPU work in worker threads); a
duplicate gets the same reply, one arriving while its twin is applied waits for it. A coalition
marked lost (:meth:`~ArrivalPipeline.lose`) or taken back (:meth:`~ArrivalPipeline.take_back`)
goes through the same lock, so the strategy sees one change at a time. Used by
:class:`~cloud_server.runloop.RunLoop`; raises :class:`~cloud_server.refusal.Refusal`, never a
gRPC error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import report_from_proto
from cloud_server import validation as door
from cloud_server.arrivals import ScreenedOut
from cloud_server.checkpoint import DiskFull
from cloud_server.controller import CloudController
from cloud_server.edge_streams import EdgeStreams
from cloud_server.fedeval import FederatedEvaluations
from cloud_server.refusal import Reason, Refusal
from cloud_server.state import Phase, TaskState

log = logging.getLogger("fedcure.cloud")


class ArrivalPipeline:
    """Applies the run's arrivals, losses and take-backs one at a time.

    Parameters
    ----------
    controller:
        The run's state and transitions.
    edges:
        The edges' task streams: new tasks are published to them.
    spawn:
        Runs a coroutine in the background of the run.
    on_finished:
        Called (spawned) once the last global round is on disk: writes the results.
    evaluations:
        The run's federated evaluations (None: central or none): one starts after every
        ``eval_every``-th round and the last.
    """

    def __init__(self, controller: CloudController, edges: EdgeStreams, *,
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 on_finished: Callable[[], Coroutine[Any, Any, None]],
                 evaluations: FederatedEvaluations | None = None) -> None:
        self.controller = controller
        self.edges = edges
        self._spawn = spawn
        self._on_finished = on_finished
        self.evaluations = evaluations
        #: the last round is aggregated: no Submit, loss or take-back changes the run any more
        #: (phase DONE follows once the final model's federated evaluation is in)
        self.over = False
        #: arrivals, losses and take-backs are applied one at a time
        self._lock = asyncio.Lock()

    @property
    def done(self) -> bool:
        """The run is over (results written) or the cloud is closing."""
        return self.controller.ended

    async def submit(self, req: pb.SubmitRequest, model: Any, received: float
                     ) -> pb.SubmitReply:
        """Check and apply one Submit (``model``: its encoded edge model; ``received``:
        monotonic seconds it came); a duplicate of an answered task gets the same reply."""
        c = self.controller
        task = c.find_task(req.task_id, req.edge_id)
        if task.reply is not None:
            return task.reply
        if task.pending is not None:
            return await asyncio.shield(task.pending)
        if c.phase == Phase.DONE or self.done or self.over:
            return c.answer_over(task, "training is over; this model was not aggregated")
        strategy, formed = c.strategy, c.formed
        assert strategy is not None and formed is not None
        m = task.dispatch.coalition
        late = task.expired is not None
        if late:  # a late answer is a stale update: aggregated within the bound
            c.tally.late()
            refusal = formed.too_stale(task)
            if refusal is not None:
                if m in strategy.unavailable and not self.done:
                    await self.take_back(m, "its edge server answered after the deadline")
                raise refusal
        formed.check_submit(task, int(req.num_samples), float(req.latency_s), req.stats,
                       list(req.dropped_client_ids), float(req.startup_s))
        task.pending = asyncio.get_running_loop().create_future()
        try:
            reply = await self._aggregate(task, req, model, received, late)
            task.reply = reply
            task.release_model()  # the model is no longer needed
            task.pending.set_result(reply)
            return reply
        except BaseException as err:
            fut, task.pending = task.pending, None
            if fut is not None and not fut.done():
                if isinstance(err, Exception):
                    fut.set_exception(err)
                    fut.exception()  # mark retrieved: a waiting duplicate re-raises it
                else:
                    fut.cancel()
            if isinstance(err, ScreenedOut) and not late:
                await self._refused(m, task, err)
            raise

    async def _refused(self, m: int, task: TaskState, err: Refusal) -> None:
        """Coalition m's edge model was refused by the norm screen: its
        task is over, nothing was aggregated, and the coalition may be scheduled again (its
        edge takes the next task), so one bad update never stalls the coalition until the
        deadline nor leaves it out of the run."""
        c = self.controller
        async with self._lock:
            s = c.strategy
            if (s is None or self.done or self.over or s.in_flight.get(m) is not task.dispatch
                    or task.pending is not None or task.reply is not None):
                return
            new = await asyncio.to_thread(c.formed.refuse, m, task,
                                          f"its edge model was refused ({err})")
            self.edges.drop(m, task)
            log.warning("task %s of coalition %d refused; its edge takes the next task%s",
                        task.task_id, m, f"; dispatched {[t.dispatch.coalition for t in new]}"
                        if new else "")
            await self.edges.publish(new)

    async def _aggregate(self, task: TaskState, req: pb.SubmitRequest, model: Any,
                         received: float, late: bool) -> pb.SubmitReply:
        """Decode, aggregate (one arrival at a time), publish, evaluate: the Submit's reply."""
        c = self.controller
        t_dec = time.monotonic()
        arrays = await asyncio.to_thread(c.formed.decode_model, task, model)
        sent = task.sent_at if task.sent_at is not None else task.dispatched_at
        latency = max(received - sent, 1e-6)
        reports = [report_from_proto(s) for s in req.stats]
        async with self._lock:
            if self.done or c.phase == Phase.DONE or self.over:
                return pb.SubmitReply(accepted=False, version=c.strategy.version,
                                      detail="training is over; not aggregated")
            t_agg = time.monotonic()
            try:
                arrival = await asyncio.to_thread(
                    c.formed.arrive, task, arrays, latency, float(req.latency_s),
                    int(req.num_samples), reports, list(req.dropped_client_ids), late,
                    float(req.startup_s))
            except ValueError as err:  # the strategy refused the arrival
                raise Refusal(Reason.FAILED_PRECONDITION,
                              f"task {task.task_id}: {err}") from None
            except (Refusal, asyncio.CancelledError):
                raise
            except DiskFull as err:  # logged once by Durability.save; the edge asks again
                raise Refusal(
                    Reason.RESOURCE_EXHAUSTED,
                    f"cloud disk full: task {task.task_id} not aggregated "
                    f"({str(err.strerror)[:200]}); nothing changed, retry when space "
                    "returns") from None
            except Exception as err:  # noqa: BLE001 - e.g. the checkpoint write
                log.exception("applying task %s failed; rolled back", task.task_id)
                raise Refusal(
                    Reason.UNAVAILABLE,
                    f"task {task.task_id} not aggregated: applying it failed "
                    f"({type(err).__name__}: {door.clip(str(err), 120)}); nothing "
                    "changed, retry later") from None
            t_pub = time.monotonic()
            await self.edges.publish(arrival.new)
            log.debug("submit %s: decode+check %.3f s, aggregate+dispatch %.3f s, "
                      "publish %.3f s", task.task_id, t_agg - t_dec, t_pub - t_agg,
                      time.monotonic() - t_pub)
            rec = arrival.record
            if c.formed.should_evaluate(arrival):
                acc, loss, per_class = await asyncio.to_thread(c.formed.evaluate)
                c.formed.record_evaluation(rec, acc, loss, per_class)
            elif self.evaluations is not None and self.evaluations.due(rec["round"],
                                                                       arrival.finished):
                await self.evaluations.start(rec)  # its answers land on rec as they come
            log.info(
                "round %d/%d: coalition %d arrived%s (staleness %d, xi %.3f, latency "
                "%.2f s, estimate %.2f s) -> version %d, dispatched %s%s",
                rec["round"], c.cfg.run.global_rounds, rec["coalition"],
                " LATE" if late else "",
                rec["staleness"], rec["xi"], rec["latency_s"], rec["estimate_s"],
                rec["version"], rec["dispatched"],
                "" if rec["accuracy"] is None else
                f", accuracy {100 * rec['accuracy']:.2f}%",
            )
            reply = task.reply
            assert reply is not None
            if arrival.finished:
                # the last update is on disk: answer now, write the results after
                self.over = True
                if self.evaluations is None:  # else once the final evaluation is in
                    c.end_training()
                self._spawn(self._on_finished())
            return reply

    async def lose(self, m: int, task: TaskState | None, why: str) -> None:
        """Mark coalition m unavailable (its task, if any, expires) and refill the slot."""
        c = self.controller
        async with self._lock:
            s = c.strategy
            if s is None or self.done or self.over or m in s.unavailable:
                return
            if task is not None and (s.in_flight.get(m) is not task.dispatch
                                     or task.pending is not None or task.reply is not None):
                return  # answered meanwhile
            if task is None and m in s.in_flight:
                return  # it got a task meanwhile: the deadline decides
            new = await asyncio.to_thread(c.formed.lose, m, task, why)
            if task is not None:
                self.edges.drop(m, task)
            log.warning("coalition %d marked unavailable: %s%s", m, why,
                        f"; dispatched {[t.dispatch.coalition for t in new]} instead"
                        if new else "")
            await self.edges.publish(new)

    async def take_back(self, m: int, why: str) -> None:
        """Let coalition m be scheduled again and fill free slots."""
        c = self.controller
        async with self._lock:
            s = c.strategy
            if s is None or self.done or self.over or m not in s.unavailable:
                return
            new = await asyncio.to_thread(c.formed.take_back, m, why)
            log.info("coalition %d available again: %s", m, why)
            await self.edges.publish(new)


__all__ = ["ArrivalPipeline"]
