"""``EdgeLink`` of the cloud's servicer: Members, the Connect task stream and Submit (part of
:class:`cloud_server.service.CloudService`; see that module for the protocol)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import numpy as np

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import (
    CodecError, WithModel, check_like, decode_arrays, report_from_proto, unwrap,
)
from cloud_server import validation as door
from cloud_server.errors import CloudError
from cloud_server.refusal import Refusal
from cloud_server.state import Phase, TaskState

log = logging.getLogger("fedcure.cloud")

PHASE_DONE = Phase.DONE


class EdgeLinkHandlers(pb_grpc.EdgeLinkServicer):
    """The EdgeLink RPCs of a :class:`CloudService` (its state, controller and helpers)."""

    # of CloudService: edges, strategy, tasks, phase, done, failure, cfg, evaluator, the
    # controller's find_task/check_submit/too_stale/arrive/evaluate/members, and the servicer's
    # check_edge, _abort, _publish, _take_back, _lose, _spawn, _finish
    edges: dict[int, Any]
    _done: Any
    _loop: Any
    _arrival_lock: Any
    _closing: bool

    async def Members(self, request: pb.MembersRequest, context: grpc.aio.ServicerContext
                      ) -> pb.MembersReply:
        """The clients of ES ``edge_id`` with their SuperNode keys (none before formation)."""
        try:
            m = self.check_edge(request.token, request.edge_id, context)
        except CloudError as err:
            await self._abort(context, err)
            raise  # unreachable: abort raises
        return pb.MembersReply(members=[
            pb.Member(client_id=c.client_id, client_name=c.name,
                      supernode_public_key=c.supernode_key) for c in self.members(m)])

    async def Connect(self, request: pb.ConnectRequest, context: grpc.aio.ServicerContext):
        """ES ``edge_id`` connects with its fleet address: a stream of its coalition's tasks
        (its unanswered task again after a reconnection; a newer Connect ends this one)."""
        try:
            m = self.check_edge(request.token, request.edge_id, context)
            try:
                address = door.check_address(request.address)
            except door.Refused as err:
                raise CloudError(grpc.StatusCode.INVALID_ARGUMENT, f"edge {m}: {err}") from None
        except CloudError as err:
            await self._abort(context, err)
            return
        assert self._done is not None
        edge = self.edges[m]
        edge.generation += 1
        edge.connects += 1
        gen = edge.generation
        edge.address = self.edge_addresses[m] = address
        edge.connected.set()
        log.info("edge %d connected (%s)%s", m, edge.address,
                 " again" if edge.connects > 1 else "")
        async with edge.cond:
            edge.cond.notify_all()  # a previous stream of this edge ends
        if self.strategy is not None and m in self.strategy.unavailable and not self.done:
            await self._take_back(m, "its edge server connected again")
        last: TaskState | None = None
        try:
            while True:
                done = self._done

                def ready() -> bool:
                    cur = edge.current
                    return (done.is_set() or edge.generation != gen
                            or (cur is not None and cur is not last and cur.reply is None
                                and cur.expired is None))

                async with edge.cond:
                    await edge.cond.wait_for(ready)
                if edge.generation != gen:
                    await context.abort(grpc.StatusCode.ABORTED,
                                        f"edge {m} connected again; this stream is replaced")
                    return
                if self._done.is_set():
                    if self.phase == PHASE_DONE:
                        log.info("edge %d: stream closed (training over)", m)
                        return
                    if self.failure is not None:
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.failure)
                    await context.abort(grpc.StatusCode.UNAVAILABLE,
                                        "the cloud is shutting down")
                    return
                task = edge.current
                assert task is not None
                if task.sent_at is None:
                    task.sent_at = time.monotonic()
                last = task
                yield task.message
        finally:
            if edge.generation == gen:
                edge.connected.clear()
                # phase DONE shows in Monitor.Status while the results are still being
                # written (before _done is set): edges that saw it and left are not lost
                if not self._done.is_set() and self.phase != PHASE_DONE:
                    log.warning("edge %d disconnected", m)
                    s = self.strategy
                    if (s is not None and not self._closing and m not in s.in_flight
                            and m not in s.unavailable):
                        self._spawn(self._lose(m, None, "its edge server disconnected while idle"))

    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext
                     ) -> pb.SubmitReply:
        """An ES's answer to a task: checked, then aggregated once (see :meth:`submit`)."""
        try:
            return await self.submit(request, context)
        except (CloudError, Refusal) as err:
            await self._abort(context, err)
            raise

    async def submit(self, request: pb.SubmitRequest | WithModel, context: Any = None
                     ) -> pb.SubmitReply:
        """Check and apply one Submit (the model beside the message, ``WithModel``); a duplicate
        of an answered task gets the same reply. Raises :class:`Refusal`/:class:`CloudError`."""
        received = time.monotonic()
        req, model = unwrap(request)
        self.check_edge(req.token, req.edge_id, context)
        task = self.find_task(req.task_id, req.edge_id)
        if task.reply is not None:
            return task.reply
        if task.pending is not None:
            return await asyncio.shield(task.pending)
        if self.phase == PHASE_DONE or self.done:
            task.reply = self.over_reply("training is over; this model was not aggregated")
            return task.reply
        strategy = self.strategy
        assert strategy is not None
        m = task.dispatch.coalition
        late = task.expired is not None
        if late:  # a late answer is a stale update (issue 18): aggregated within the bound
            refusal = self.too_stale(task)
            if refusal is not None:
                if m in strategy.unavailable and not self.done:
                    await self._take_back(m, "its edge server answered after the deadline")
                raise refusal
        self.check_submit(task, int(req.num_samples), float(req.latency_s), req.stats,
                          list(req.dropped_client_ids))
        task.pending = self._loop.create_future()  # type: ignore[union-attr]
        try:
            reply = await self._aggregate(task, req, model, received, late)
            task.reply = reply
            task.message = WithModel(task.message.message, b"")  # the model is no longer needed
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
        strategy = self.strategy
        assert strategy is not None
        t_dec = time.monotonic()
        try:
            arrays = await asyncio.to_thread(_decode_checked, model, strategy.global_arrays)
        except CodecError as err:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"task {task.task_id}: {err}") from None
        sent = task.sent_at if task.sent_at is not None else task.dispatched_at
        latency = max(received - sent, 1e-6)
        reports = [report_from_proto(s) for s in req.stats]
        assert self._arrival_lock is not None
        async with self._arrival_lock:
            if self.done or self.phase == PHASE_DONE:
                return pb.SubmitReply(accepted=False, version=strategy.version,
                                      detail="training is over; not aggregated")
            t_agg = time.monotonic()
            try:
                arrival = await asyncio.to_thread(
                    self.arrive, task, arrays, latency, float(req.latency_s),
                    int(req.num_samples), reports, list(req.dropped_client_ids), late)
            except ValueError as err:  # the strategy refused the arrival
                raise CloudError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"task {task.task_id}: {err}") from None
            except (CloudError, Refusal, asyncio.CancelledError):
                raise
            except Exception as err:  # noqa: BLE001 - e.g. the checkpoint write
                log.exception("applying task %s failed; rolled back", task.task_id)
                raise CloudError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"task {task.task_id} not aggregated: applying it failed "
                    f"({type(err).__name__}: {door.clip(str(err), 120)}); nothing "
                    "changed, retry later") from None
            t_pub = time.monotonic()
            await self._publish(arrival.new)
            log.debug("submit %s: decode+check %.3f s, aggregate+dispatch %.3f s, "
                      "publish %.3f s", task.task_id, t_agg - t_dec, t_pub - t_agg,
                      time.monotonic() - t_pub)
            rec = arrival.record
            if self.evaluator is not None and (
                rec["round"] % self.cfg.run.eval_every == 0 or arrival.finished
            ):
                rec["accuracy"], rec["loss"] = await asyncio.to_thread(self.evaluate)
            log.info(
                "round %d/%d: coalition %d arrived%s (staleness %d, xi %.3f, latency "
                "%.2f s, estimate %.2f s) -> version %d, dispatched %s%s",
                rec["round"], self.cfg.run.global_rounds, rec["coalition"],
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
                self.phase = PHASE_DONE
                self._spawn(self._finish())
            return reply


def _decode_checked(blob: bytes | memoryview, reference: list[np.ndarray]) -> list[np.ndarray]:
    arrays = decode_arrays(blob)
    check_like(arrays, reference)
    return arrays


__all__ = ["EdgeLinkHandlers"]
