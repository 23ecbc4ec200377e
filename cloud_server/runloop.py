"""The event-loop side of a run: what the cloud waits for and when it acts.

:class:`RunLoop` drives a :class:`~cloud_server.controller.CloudController` from the gRPC
server's event loop, without knowing gRPC (it raises :class:`~cloud_server.refusal.Refusal`):

- registration: each Register waits for formation and for its edge to connect; formation runs
  once (in a worker thread) when the expected clients are in, or when the registration window
  closes with at least M clients; a failed attempt keeps the cloud registering;
- the edges' task streams (:class:`~cloud_server.edge_streams.EdgeStreams`): new tasks are
  published to them, an edge that leaves while idle is marked lost;
- Submits: checked before any state changes, then decoded, aggregated, published and evaluated
  one arrival at a time (an ``asyncio.Lock``; the CPU work in worker threads); a duplicate gets
  the same reply, one arriving while its twin is applied waits for it;
- failover: a watchdog expires tasks past their deadline (``cloud_server.failover``);
- the end: the final checkpoint and the results (worker thread), then every stream closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import report_from_proto
from cloud_server import validation as door
from cloud_server.controller import CloudController
from cloud_server.edge_streams import EdgeStreams, Stream
from cloud_server.failover import overdue
from cloud_server.refusal import Reason, Refusal
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
    """

    def __init__(self, controller: CloudController, *, register_timeout_s: float = 300.0,
                 resume: bool = False) -> None:
        if not register_timeout_s > 0:
            raise ValueError(f"register timeout must be > 0 s, got {register_timeout_s}")
        self.controller = controller
        self.register_timeout_s = float(register_timeout_s)
        self.resume = bool(resume)
        #: the run was restored from a checkpoint at start
        self.resumed = False
        #: each edge's connection and current task
        self.edges = EdgeStreams(controller.num_edges)
        self._formed = asyncio.Event()
        self._done = asyncio.Event()
        #: arrivals, losses and take-backs are applied one at a time
        self._arrival_lock = asyncio.Lock()
        self._closing = False
        self._window_closed = False
        self._started_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task] = set()

    # ================================================================== lifecycle
    def start(self) -> None:
        """Resume a checkpoint if asked, open the registration window, start the watchdog
        (on the running event loop)."""
        c, cfg = self.controller, self.controller.cfg
        self._started_at = time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(self.register_timeout_s,
                                                             self._window_expired)
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

    def _resume(self) -> None:
        """Restore the last checkpoint (start(), before serving)."""
        c = self.controller
        complete = c.resume()  # no RPC runs yet: nothing to lock against
        self.resumed = True
        self._window_closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._formed.set()
        self.edges.hold(c.live_tasks())
        if complete:
            c.end_training()
            c.result = c.write_results()
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
        if self._timer is not None:
            self._timer.cancel()
        self._end()
        self._formed.set()
        await self.edges.wake_all(connected=True)
        for t in list(self._background):
            t.cancel()

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    # ================================================================== registration
    async def register(self, entry: ClientEntry, time_remaining: float | None
                       ) -> tuple[ClientEntry, str]:
        """Record a registration, then wait for formation and for the client's edge to
        connect: the stored client and its edge's address. ``time_remaining``: seconds the
        caller still waits (None: no deadline)."""
        c = self.controller
        began = time.monotonic()
        client = c.register(entry)
        self._maybe_form()
        # wait register_timeout_s, and at least until a little after the registration window
        # closes (formation may run then)
        window_end = self._started_at + self.register_timeout_s + min(5.0, self.register_timeout_s)
        budget = max(self.register_timeout_s, window_end - began)
        if time_remaining is not None:
            budget = min(budget, max(0.0, time_remaining - 0.05))

        def left() -> float:
            return max(0.0, budget - (time.monotonic() - began))

        formed = self._formed  # a failed formation replaces the event (and sets this one)
        try:
            await asyncio.wait_for(formed.wait(), left())
        except asyncio.TimeoutError:
            raise Refusal(
                Reason.DEADLINE_EXCEEDED,
                f"coalition formation has not run yet: {len(c.clients)} of "
                f"{c.expected_clients} expected clients registered; call Register again",
            ) from None
        self._check_open()
        if c.phase == Phase.REGISTERING:  # this formation attempt failed
            raise Refusal(Reason.FAILED_PRECONDITION,
                          f"{c.formation_error}; the cloud keeps registering: call Register "
                          "again (with a corrected profile)")
        assert client.edge_id is not None and client.client_id is not None
        try:
            await asyncio.wait_for(self.edges[client.edge_id].connected.wait(), left())
        except asyncio.TimeoutError:
            raise Refusal(
                Reason.DEADLINE_EXCEEDED,
                f"client {client.name!r} belongs to edge {client.edge_id}, which has not "
                "connected to the cloud yet; call Register again",
            ) from None
        self._check_open()
        return client, c.edge_address(client.edge_id)

    def _check_open(self) -> None:
        if self._closing:
            raise Refusal(Reason.UNAVAILABLE, "the cloud is shutting down")

    def _window_expired(self) -> None:
        self._window_closed = True
        c = self.controller
        if c.phase == Phase.REGISTERING and not c.forming:
            n = len(c.clients)
            if n >= c.num_edges:
                log.warning("registration window over: forming coalitions with %d of %d "
                            "expected clients", n, c.expected_clients)
            else:
                log.warning("registration window over with %d clients; formation waits for "
                            "at least %d (one per edge)", n, c.num_edges)
        self._maybe_form()

    def _maybe_form(self) -> None:
        if self.controller.should_form(self._window_closed):
            self.controller.start_forming()
            if self._timer is not None:
                self._timer.cancel()
            self._spawn(self._run_formation())

    async def _run_formation(self) -> None:
        c = self.controller
        try:
            tasks = await asyncio.to_thread(c.form_and_build)
        except Exception as err:  # noqa: BLE001 - reported to every waiting client
            # the cloud stays up and keeps registering: a changed or new registration retries
            log.exception("coalition formation failed; still registering")
            c.formation_failed(err)
            failed, self._formed = self._formed, asyncio.Event()
            failed.set()  # wake every waiting Register: they answer FAILED_PRECONDITION
            self._maybe_form()
            return
        c.begin_training()
        self._formed.set()
        await self.edges.publish(tasks)

    # ================================================================== edge streams
    async def connect(self, m: int, address: str) -> Stream:
        """Edge m connected with its fleet ``address``: its stream (an older one ends); a lost
        coalition m is taken back."""
        c = self.controller
        c.edge_connected(m, address)
        stream = await self.edges.open(m)
        log.info("edge %d connected (%s)%s", m, address,
                 " again" if stream.slot.connects > 1 else "")
        s = c.strategy
        if s is not None and m in s.unavailable and not self.done:
            await self._take_back(m, "its edge server connected again")
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
        c.edge_left(m)
        # phase DONE shows in Monitor.Status while the results are still being written
        # (before the run ends): edges that saw it and left are not lost
        if not self._done.is_set() and c.phase != Phase.DONE:
            log.warning("edge %d disconnected", m)
            s = c.strategy
            if (s is not None and not self._closing and m not in s.in_flight
                    and m not in s.unavailable):
                self._spawn(self._lose(m, None, "its edge server disconnected while idle"))

    # ================================================================== submits
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
        if c.phase == Phase.DONE or self.done:
            return c.answer_over(task, "training is over; this model was not aggregated")
        strategy = c.strategy
        assert strategy is not None
        m = task.dispatch.coalition
        late = task.expired is not None
        if late:  # a late answer is a stale update: aggregated within the bound
            c.tally.late()
            refusal = c.too_stale(task)
            if refusal is not None:
                if m in strategy.unavailable and not self.done:
                    await self._take_back(m, "its edge server answered after the deadline")
                raise refusal
        c.check_submit(task, int(req.num_samples), float(req.latency_s), req.stats,
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
            raise

    async def _aggregate(self, task: TaskState, req: pb.SubmitRequest, model: Any,
                         received: float, late: bool) -> pb.SubmitReply:
        """Decode, aggregate (one arrival at a time), publish, evaluate: the Submit's reply."""
        c = self.controller
        t_dec = time.monotonic()
        arrays = await asyncio.to_thread(c.decode_model, task, model)
        sent = task.sent_at if task.sent_at is not None else task.dispatched_at
        latency = max(received - sent, 1e-6)
        reports = [report_from_proto(s) for s in req.stats]
        async with self._arrival_lock:
            if self.done or c.phase == Phase.DONE:
                return pb.SubmitReply(accepted=False, version=c.strategy.version,
                                      detail="training is over; not aggregated")
            t_agg = time.monotonic()
            try:
                arrival = await asyncio.to_thread(
                    c.arrive, task, arrays, latency, float(req.latency_s),
                    int(req.num_samples), reports, list(req.dropped_client_ids), late,
                    float(req.startup_s))
            except ValueError as err:  # the strategy refused the arrival
                raise Refusal(Reason.FAILED_PRECONDITION,
                              f"task {task.task_id}: {err}") from None
            except (Refusal, asyncio.CancelledError):
                raise
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
            if c.should_evaluate(arrival):
                acc, loss = await asyncio.to_thread(c.evaluate)
                c.record_evaluation(rec, acc, loss)
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
                c.end_training()
                self._spawn(self._finish())
            return reply

    # ================================================================== failures
    async def _watchdog(self) -> None:
        """Expire tasks past their deadline (see ``cloud_server.failover``)."""
        c = self.controller
        period = max(0.05, min(1.0, c.cfg.reliability.deadline_min_s / 4))
        while not self._closing and not self.done:
            await asyncio.sleep(period)
            s = c.strategy
            if s is None or c.phase != Phase.TRAINING:
                continue
            now = time.monotonic()
            for m, d in list(s.in_flight.items()):
                task = self.edges[m].current
                if (task is None or task.dispatch is not d or task.pending is not None
                        or task.reply is not None):
                    continue
                if overdue(task.dispatched_at, task.deadline_s, now):
                    await self._lose(m, task, f"no answer within its {task.deadline_s:.1f} s "
                                              "deadline")

    async def _lose(self, m: int, task: TaskState | None, why: str) -> None:
        """Mark coalition m unavailable (its task, if any, expires) and refill the slot."""
        c = self.controller
        async with self._arrival_lock:
            s = c.strategy
            if s is None or self.done or m in s.unavailable:
                return
            if task is not None and (s.in_flight.get(m) is not task.dispatch
                                     or task.pending is not None or task.reply is not None):
                return  # answered meanwhile
            if task is None and m in s.in_flight:
                return  # it got a task meanwhile: the deadline decides
            new = await asyncio.to_thread(c.lose, m, task, why)
            if task is not None:
                self.edges.drop(m, task)
            log.warning("coalition %d marked unavailable: %s%s", m, why,
                        f"; dispatched {[t.dispatch.coalition for t in new]} instead"
                        if new else "")
            await self.edges.publish(new)

    async def _take_back(self, m: int, why: str) -> None:
        """Let coalition m be scheduled again and fill free slots."""
        c = self.controller
        async with self._arrival_lock:
            s = c.strategy
            if s is None or self.done or m not in s.unavailable:
                return
            new = await asyncio.to_thread(c.take_back, m, why)
            log.info("coalition %d available again: %s", m, why)
            await self.edges.publish(new)

    # ================================================================== the end
    async def _finish(self) -> None:
        c = self.controller
        await asyncio.to_thread(c.finish)
        self._end()
        await self.edges.wake_all()
        log.info("training over after %d rounds%s", len(c.records),
                 f"; results in {c.results.out_dir}" if c.results.out_dir else "")


__all__ = ["RunLoop"]
