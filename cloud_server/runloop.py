"""The event-loop side of a run: what the cloud waits for and when it acts.

:class:`RunLoop` drives a :class:`~cloud_server.controller.CloudController` from the gRPC
server's event loop, without knowing gRPC (it raises :class:`~cloud_server.refusal.Refusal`):

- registration (:class:`~cloud_server.registration.RegistrationWindow`): each Register waits
  for formation and for its edge to connect; formation runs once (in a worker thread) when the
  expected clients are in, or when the registration window closes with at least M clients; a
  failed attempt keeps the cloud registering;
- the edges' task streams (:class:`~cloud_server.edge_streams.EdgeStreams`): new tasks are
  published to them, an edge that leaves while idle is marked lost;
- Submits (:class:`~cloud_server.pipeline.ArrivalPipeline`): checked before any state changes,
  then decoded, aggregated, published and evaluated one arrival at a time (an ``asyncio.Lock``;
  the CPU work in worker threads); a duplicate gets the same reply, one arriving while its twin
  is applied waits for it;
- failover: a watchdog expires tasks past their deadline (``cloud_server.failover``);
- federated evaluation (:class:`~cloud_server.fedeval.FederatedEvaluations`, when the controller
  evaluates on the clients' held-out parts): the initial model's once formation ran, then the
  pipeline's every ``eval_every`` rounds; the edges' ``Evaluated`` answers;
- the end: the final model's federated evaluation (waited for at most ``final_eval_wait_s``,
  with the run still in phase TRAINING so that clients and edges stay), the final checkpoint
  and the results (worker thread), then every stream closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fedcure_app.protocol import cloud_pb2 as pb
from cloud_server.controller import CloudController
from cloud_server.edge_streams import EdgeStreams, Stream
from cloud_server.failover import overdue
from cloud_server.fedeval import FederatedEvaluations
from cloud_server.pipeline import ArrivalPipeline
from cloud_server.refusal import Reason, Refusal
from cloud_server.registration import RegistrationWindow
from cloud_server.state import ClientEntry, Phase, TaskState

log = logging.getLogger("fedcure.cloud")


class RunLoop:
    """A run of ``controller`` on the event loop (see the module docstring).

    Parameters
    ----------
    controller:
        The run's state and transitions.
    register_timeout_s:
        Registration window from :meth:`start` (formation then runs with the clients in, given
        at least M); one Register call waits this long, and at least until shortly after the
        window closes.
    resume:
        Restore the last checkpoint of the controller's store at :meth:`start`.
    final_eval_wait_s:
        How long the end of the run waits for the edges' federated evaluations of the final
        model (seconds; edges that are not connected are not waited for).
    """

    def __init__(self, controller: CloudController, *, register_timeout_s: float = 300.0,
                 resume: bool = False, final_eval_wait_s: float = 60.0) -> None:
        if not register_timeout_s > 0:
            raise ValueError(f"register timeout must be > 0 s, got {register_timeout_s}")
        if not final_eval_wait_s >= 0:
            raise ValueError(f"final evaluation wait must be >= 0 s, got {final_eval_wait_s}")
        self.controller = controller
        self.register_timeout_s = float(register_timeout_s)
        self.resume = bool(resume)
        self.final_eval_wait_s = float(final_eval_wait_s)
        #: the run was restored from a checkpoint at start
        self.resumed = False
        #: each edge's connection and current task
        self.edges = EdgeStreams(controller.num_edges)
        self._done = asyncio.Event()
        self._closing = False
        self._background: set[asyncio.Task] = set()
        #: the registration window, the Register calls waiting and formation
        self.registration = RegistrationWindow(controller, self.edges,
                                               timeout_s=self.register_timeout_s,
                                               spawn=self._spawn,
                                               is_closing=lambda: self._closing)
        #: the global model's evaluations on the clients' held-out parts (None: central)
        self.evaluations = FederatedEvaluations(
            controller.cfg,
            make_tasks=lambda r: controller.formed.evaluation_tasks(r),
            record=lambda rec, res: controller.formed.record_federated(rec, res),
            queue=self.edges.queue_evaluations) if controller.federated_evaluation else None
        #: Submits, losses and take-backs, one at a time
        self.pipeline = ArrivalPipeline(controller, self.edges, spawn=self._spawn,
                                        on_finished=self._finish,
                                        evaluations=self.evaluations)

    # ================================================================== lifecycle
    def start(self) -> None:
        """Resume a checkpoint if asked, open the registration window, start the watchdog
        (on the running event loop)."""
        c, cfg = self.controller, self.controller.cfg
        self.registration.open()
        log.info(
            "cloud up: waiting for %d clients and %d edges (formation %s, scheduler %s, "
            "%d global rounds, registration window %.0f s)",
            c.expected_clients, c.num_edges, cfg.method.formation, cfg.method.scheduler,
            cfg.run.global_rounds, self.register_timeout_s,
        )
        if c.checkpoints is not None and c.checkpoints.exists():
            if self.resume:
                self._resume()
            else:
                log.warning("a checkpoint exists in %s but --resume was not given: starting a "
                            "fresh run that will overwrite it", c.checkpoints.dir)
        elif self.resume:
            log.info("--resume: no checkpoint in %s yet; starting a fresh run",
                     c.checkpoints.dir if c.checkpoints else "(no checkpoint folder)")
        self._spawn(self._watchdog())
        if self.evaluations is not None and not self.resumed:
            self._spawn(self._initial_evaluation())

    async def _initial_evaluation(self) -> None:
        """Once formation ran: the federated evaluation of the initial model."""
        c = self.controller
        while not self._closing:
            formed = self.registration.formed
            await formed.wait()
            if self._closing or self.done:
                return
            if c.formed is not None and c.phase == Phase.TRAINING:
                assert self.evaluations is not None
                await self.evaluations.start(None)
                return
            if formed is self.registration.formed:  # woken without formation: closing
                return

    def _resume(self) -> None:
        """Restore the last checkpoint (start(), before serving)."""
        c = self.controller
        complete = c.resume()  # no RPC runs yet: nothing to lock against
        self.resumed = True
        self.registration.skip()
        self.edges.hold(c.live_tasks())
        if complete:
            c.end_training()
            c.result = c.formed.write_results()
            self._end()
            log.info("the checkpointed run was already complete; results rewritten")

    @property
    def done(self) -> bool:
        """The run is over (results written) or the cloud is closing."""
        return self.controller.ended

    def _end(self) -> None:
        self.controller.end()
        self._done.set()

    async def wait_done(self) -> None:
        """Return once the run is over (results written) or the cloud is closing."""
        await self._done.wait()

    async def close(self) -> None:
        """End every edge stream and waiting Register call, cancel the timers (the server is
        going away). Before the end, streams and Register calls end with UNAVAILABLE."""
        self._closing = True
        if self.evaluations is not None:
            self.evaluations.close()
        self._end()
        self.registration.stop()
        await self.edges.wake_all(connected=True)
        for t in list(self._background):
            t.cancel()

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)
        t.add_done_callback(_log_failure)

    # ================================================================== registration
    async def register(self, entry: ClientEntry, time_remaining: float | None
                       ) -> tuple[ClientEntry, str]:
        """Record a registration, then wait for formation and for the client's edge to
        connect: the stored client and its edge's address (:class:`RegistrationWindow`)."""
        return await self.registration.register(entry, time_remaining)

    # ================================================================== edge streams
    async def connect(self, m: int, address: str) -> Stream:
        """Edge m connected with its fleet ``address``: its stream (an older one ends); a lost
        coalition m is taken back."""
        c = self.controller
        c.registry.edge_connected(m, address)
        stream = await self.edges.open(m)
        log.info("edge %d connected (%s)%s", m, address,
                 " again" if stream.slot.connects > 1 else "")
        s = c.strategy
        if s is not None and m in s.unavailable and not self.done:
            await self.pipeline.take_back(m, "its edge server connected again")
        return stream

    async def next_task(self, stream: Stream) -> TaskState | None:
        """The next task ``stream`` sends; None when training is over. Raises
        :class:`Refusal`: ABORTED (a newer stream of the edge), UNAVAILABLE (closing)."""
        task = await self.edges.next(stream, self._done)
        if task is not None:
            return task
        if self.controller.phase == Phase.DONE:
            log.info("edge %d: stream closed (training over)", stream.edge_id)
            return None
        raise Refusal(Reason.UNAVAILABLE, "the cloud is shutting down")

    def disconnect(self, stream: Stream) -> None:
        """``stream`` ended; an edge that leaves while idle mid-run is marked lost."""
        if not self.edges.close(stream):
            return
        c, m = self.controller, stream.edge_id
        c.registry.edge_left(m)
        # phase DONE shows in Monitor.Status while the results are still being written
        # (before the run ends): edges that saw it and left are not lost
        if not self._done.is_set() and c.phase != Phase.DONE:
            log.warning("edge %d disconnected", m)
            s = c.strategy
            if (s is not None and not self._closing and m not in s.in_flight
                    and m not in s.unavailable):
                self._spawn(self.pipeline.lose(m, None, "its edge server disconnected while idle"))

    # ================================================================== submits
    async def submit(self, req: pb.SubmitRequest, model: Any, received: float
                     ) -> pb.SubmitReply:
        """Check and apply one Submit (``model``: its encoded edge model; ``received``:
        monotonic seconds it came); a duplicate of an answered task gets the same reply
        (:class:`ArrivalPipeline`)."""
        return await self.pipeline.submit(req, model, received)

    # ================================================================== evaluations
    async def evaluated(self, m: int, req: pb.EvaluatedRequest) -> bool:
        """Edge m's answer to an evaluation task (:meth:`FederatedEvaluations.answer`);
        whether it was taken. FAILED_PRECONDITION when this cloud evaluates centrally."""
        if self.evaluations is None:
            raise Refusal(Reason.FAILED_PRECONDITION,
                          "this cloud does not evaluate on the clients' held-out parts")
        return await self.evaluations.answer(m, req)

    # ================================================================== failures
    async def _watchdog(self) -> None:
        """Expire tasks past their deadline (see ``cloud_server.failover``)."""
        c = self.controller
        period = max(0.05, min(1.0, c.cfg.reliability.deadline_min_s / 4))
        while not self._closing and not self.done:
            await asyncio.sleep(period)
            s = c.strategy
            if s is None or c.phase != Phase.TRAINING or self.pipeline.over:
                continue
            now = time.monotonic()
            for m, d in list(s.in_flight.items()):
                task = self.edges[m].current
                if (task is None or task.dispatch is not d or task.pending is not None
                        or task.reply is not None):
                    continue
                if overdue(task.dispatched_at, task.deadline_s, now):
                    await self.pipeline.lose(
                        m, task, f"no answer within its {task.deadline_s:.1f} s deadline")

    # ================================================================== the end
    async def _finish(self) -> None:
        c = self.controller
        ev = self.evaluations
        if ev is not None:  # the final model's evaluation, then phase DONE (clients leave)
            if ev.by_round:
                await ev.settle(max(ev.by_round), lambda m: m in c.roster.connected,
                                self.final_eval_wait_s)
            ev.close()
            c.end_training()
        await asyncio.to_thread(c.finish)
        self._end()
        await self.edges.wake_all()
        log.info("training over after %d rounds%s", len(c.records),
                 f"; results in {c.results.out_dir}" if c.results.out_dir else "")


def _log_failure(task: asyncio.Future) -> None:
    """Log a background task that ended with an exception (else it would vanish)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())


__all__ = ["RunLoop"]
