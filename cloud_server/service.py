"""The cloud server's gRPC face (``fedcure_app/protocol/cloud.proto``): a thin servicer over
:class:`cloud_server.controller.CloudController`.

``Association.Register``
    Clients announce their name, label histogram, device profile and home ES. Names map to
    stable client ids (registering a name again gives the same answer). When the expected
    clients are in, or the registration window (``register_timeout_s`` after start) has passed
    with at least M clients, the cloud runs coalition formation ONCE with the configured rule
    (``fedcure_app.federation.form``), builds the :class:`FedCureStrategy`, and dispatches
    round 0. Every waiting Register is then answered with the client's ES id and that ES's
    address, once that ES has connected. Client ids are given at formation in natural order
    of the names (``c2`` before ``c10``), so they do not depend on arrival order; clients that
    claimed a partition come first, in partition order.

``Association.Claim``
    A client without data of its own learns its stable partition index (first come, keyed by
    name), the partition count and the configuration as JSON, and computes its partition as
    ``fedcure simulate`` does; ids then equal partition indices, so both form the same coalitions.

``EdgeLink.Connect`` / ``EdgeLink.Submit`` / ``EdgeLink.Members``
    ES m (serving coalition m) connects with its Flower SuperLink fleet address and receives a
    stream of tasks for its coalition; a reconnecting ES gets its unanswered task again, a newer
    Connect for the same ES ends the older stream (ABORTED). Submit carries the edge model: the
    cloud checks the task (NOT_FOUND when unknown, INVALID_ARGUMENT for the wrong ES, a
    malformed model or one whose tensors do not match the global model, FAILED_PRECONDITION when
    the task is no longer expected) before touching any state, then aggregates it
    (``strategy.on_arrival`` with the latency the cloud measured from sending the task to
    receiving the answer), dispatches again, evaluates every ``eval_every`` rounds when an
    evaluator is given, and records the round as the simulation engine does. A duplicate Submit of
    an answered task gets the same reply without a second aggregation. After ``global_rounds``
    rounds it writes ``result.json``, the plots and ``final_model.safetensors`` into the output
    folder and ends every edge stream with status OK.

``Monitor.Status``
    Phase, version, round, registered clients, connected edges, coalitions in flight.

Concurrency: the gRPC server is ``grpc.aio``; the servicer's bookkeeping runs on its event loop,
so thousands of Register calls can wait at once without a thread each. CPU work (model
decoding, formation, aggregation, evaluation, writing results) runs in worker threads; every
strategy transition holds the controller's ``lock`` (a ``threading.Lock``), and arrivals are
processed one at a time (an ``asyncio.Lock`` around aggregate → dispatch → evaluate). The
controller refuses with :class:`cloud_server.refusal.Refusal`; the handlers answer it with the
gRPC status code of the same name. Serving (start-up, resume, bind): ``cloud_server.server``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from cloud_server import validation as door
from cloud_server.controller import CloudController, Evaluator
from cloud_server.edge_link import EdgeLinkHandlers
from cloud_server.errors import CloudError
from cloud_server.failover import overdue
from cloud_server.identity import EdgeCredentials
from cloud_server.progress import ProgressBoard, live_task
from cloud_server.refusal import Refusal
from cloud_server.security import token_ok
from cloud_server.state import Phase, TaskState

log = logging.getLogger("fedcure.cloud")

PHASE_REGISTERING = Phase.REGISTERING
PHASE_TRAINING = Phase.TRAINING
PHASE_DONE = Phase.DONE


@dataclass
class EdgeSlot:
    """The event-loop side of edge m: its connection and the task its stream serves."""

    edge_id: int
    address: str = ""
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    generation: int = 0
    current: TaskState | None = None
    connects: int = 0


class CloudService(EdgeLinkHandlers, CloudController, pb_grpc.AssociationServicer,
                   pb_grpc.MonitorServicer):
    """The cloud's RPC handlers over its :class:`CloudController` state (module docstring).

    Parameters (besides the controller's)
    -------------------------------------
    register_timeout_s:
        Registration window from :meth:`start` (formation then runs with the clients in, given
        at least M); one Register call waits this long, and at least until shortly after the
        window closes (then DEADLINE_EXCEEDED: the client may call again).
    token:
        Shared secret every request must carry (empty: not checked).
    resume:
        Restore the last checkpoint in ``checkpoint_dir`` at :meth:`start`.
    edge_credentials:
        Per-edge tokens and/or edge client certificates binding each edge id to a credential
        (``cloud_server.identity``); None: the shared token lets a caller act as any edge.
    """

    def __init__(self, cfg: FedCureConfig, *, expected_clients: int,
                 out_dir: str | Path | None = None, register_timeout_s: float = 300.0,
                 token: str = "", initial_arrays: list[np.ndarray] | None = None,
                 evaluator: Evaluator | None = None, write_plots: bool = True,
                 checkpoint_dir: str | Path | None = None, resume: bool = False,
                 edge_credentials: EdgeCredentials | None = None) -> None:
        super().__init__(cfg, expected_clients=expected_clients, out_dir=out_dir,
                         initial_arrays=initial_arrays, evaluator=evaluator,
                         write_plots=write_plots, checkpoint_dir=checkpoint_dir)
        if not register_timeout_s > 0:
            raise ValueError(f"register timeout must be > 0 s, got {register_timeout_s}")
        self.register_timeout_s = float(register_timeout_s)
        self.token = token
        self.resume = bool(resume)
        self.resumed = False
        self.edge_credentials = edge_credentials or EdgeCredentials()
        #: the ESs' live reports inside a task (EdgeLink.Progress): logged, shown in Status
        self.progress = ProgressBoard()
        #: each edge's connection and current task (event loop), made by :meth:`start`
        self.edges: dict[int, EdgeSlot] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._formed: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        self._arrival_lock: asyncio.Lock | None = None
        self._closing = False
        self._window_closed = False
        #: coalitions in flight, as last seen on the event loop (for Status)
        self._in_flight_view: list[int] = []
        self._started_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task] = set()

    # ================================================================== lifecycle
    def start(self) -> None:
        """Bind to the running event loop, resume a checkpoint if asked, open the window."""
        self._loop = asyncio.get_running_loop()
        self._formed = asyncio.Event()
        self._done = asyncio.Event()
        self._arrival_lock = asyncio.Lock()
        self.edges = {m: EdgeSlot(m) for m in range(self.num_edges)}
        self._started_at = time.monotonic()
        self._timer = self._loop.call_later(self.register_timeout_s, self._window_expired)
        log.info(
            "cloud up: waiting for %d clients and %d edges (formation %s, scheduler %s, "
            "%d global rounds, registration window %.0f s)",
            self.expected_clients, self.num_edges, self.cfg.method.formation,
            self.cfg.method.scheduler, self.cfg.run.global_rounds, self.register_timeout_s,
        )
        if self.checkpoints is not None and self.checkpoints.exists():
            if self.resume:
                self._resume()
            else:
                log.warning("a checkpoint exists in %s but --resume was not given: starting a "
                            "fresh run that will overwrite it", self.checkpoints.dir)
        elif self.resume:
            log.info("--resume: no checkpoint in %s yet; starting a fresh run",
                     self.checkpoints.dir if self.checkpoints else "(no checkpoint folder)")
        self._spawn(self._watchdog())

    def _resume(self) -> None:
        """Restore the state of the last checkpoint (start(), before serving)."""
        assert self.checkpoints is not None and self._formed is not None
        state, models = self.checkpoints.load()
        self.from_state(state, models)  # no RPC runs yet: nothing to lock against
        for m, slot in self.edges.items():
            slot.address = self.edge_addresses[m]
        self.resumed = True
        self._window_closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._formed.set()
        assert self.strategy is not None
        self._in_flight_view = sorted(self.strategy.in_flight)
        for t in self.tasks.values():
            if self.strategy.in_flight.get(t.dispatch.coalition) is t.dispatch:
                self.edges[t.dispatch.coalition].current = t
        self.fault("resumed", None, f"resumed from checkpoint at version "
                   f"{self.strategy.version}, round {self.strategy.round}")
        if state["phase"] == "done" or self.finished():
            self.phase = PHASE_DONE
            self.result = self.write_results()
            assert self._done is not None
            self._done.set()
            log.info("the checkpointed run was already complete; results rewritten")

    async def wait_done(self) -> None:
        """Return once the run is over (results written) or has failed."""
        assert self._done is not None, "start() first"
        await self._done.wait()

    async def close(self) -> None:
        """End every edge stream and waiting Register call, cancel the timers (the server is
        going away). Before the end, streams and Register calls end with UNAVAILABLE."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self._done is not None:
            self._done.set()
        if self._formed is not None:
            self._formed.set()
        for e in self.edges.values():
            e.connected.set()
        await self._wake_edges()
        for t in list(self._background):
            t.cancel()

    @property
    def done(self) -> bool:
        """The run is over (results written) or the server is closing."""
        return self._done is not None and self._done.is_set()

    # ================================================================== helpers
    def _check_token(self, token: str) -> None:
        if not token_ok(self.token, token):
            raise CloudError(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing token")

    def check_edge(self, token: str, edge_id: int, context: Any) -> int:
        """The caller may act as edge ``edge_id`` (its credential, ``cloud_server.identity``);
        returns the checked edge index."""
        self.edge_credentials.check(int(edge_id), token, context,
                                    shared_ok=token_ok(self.token, token))
        m = int(edge_id)
        if not 0 <= m < self.num_edges:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"edge_id {m} outside [0, {self.num_edges})")
        return m

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    async def _wake_edges(self) -> None:
        for e in self.edges.values():
            async with e.cond:
                e.cond.notify_all()

    @staticmethod
    async def _abort(context: grpc.aio.ServicerContext, err: CloudError | Refusal) -> None:
        if isinstance(err, Refusal):
            err = CloudError.of(err)
        await context.abort(err.code, err.message)

    # ================================================================== Association
    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
                       ) -> pb.RegisterReply:
        """A client joins: answered with its ids and its ES's address once formation ran and
        that ES connected (see the module docstring)."""
        try:
            return await self._register(request, context)
        except (CloudError, Refusal) as err:
            await self._abort(context, err)
            raise  # unreachable: abort raises

    async def Claim(self, request: pb.ClaimRequest, context: grpc.aio.ServicerContext
                    ) -> pb.ClaimReply:
        """A client's stable partition index, the partition count and the configuration."""
        try:
            self._check_token(request.token)
            try:
                name = door.check_name(request.client_name)
            except door.Refused as err:
                raise CloudError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
            index = self.claim(name, request.partition_id if request.HasField("partition_id")
                               else None)
        except (CloudError, Refusal) as err:
            await self._abort(context, err)
            raise  # unreachable: abort raises
        return pb.ClaimReply(partition_id=index, num_partitions=self.cfg.federation.num_clients,
                             config_json=self.cfg.model_dump_json(by_alias=True))

    async def _register(self, req: pb.RegisterRequest, context: grpc.aio.ServicerContext
                        ) -> pb.RegisterReply:
        assert self._formed is not None
        self._check_token(req.token)
        began = time.monotonic()
        client = self.register(self.validate_registration(req))
        self._maybe_form()
        # wait register_timeout_s, and at least until a little after the registration window
        # closes (formation may run then)
        window_end = self._started_at + self.register_timeout_s + min(5.0, self.register_timeout_s)
        budget = max(self.register_timeout_s, window_end - began)
        remaining = context.time_remaining()
        if remaining is not None:
            budget = min(budget, max(0.0, remaining - 0.05))

        def left() -> float:
            return max(0.0, budget - (time.monotonic() - began))

        formed = self._formed  # a failed formation replaces the event (and sets this one)
        try:
            await asyncio.wait_for(formed.wait(), left())
        except asyncio.TimeoutError:
            raise CloudError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"coalition formation has not run yet: {len(self.clients)} of "
                f"{self.expected_clients} expected clients registered; call Register again",
            ) from None
        if self._closing:
            raise CloudError(grpc.StatusCode.UNAVAILABLE, "the cloud is shutting down")
        if self.failure is not None:
            raise CloudError(grpc.StatusCode.FAILED_PRECONDITION, self.failure)
        if self.phase == PHASE_REGISTERING:  # this formation attempt failed
            raise CloudError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{self.formation_error}; the cloud keeps registering: call "
                             "Register again (with a corrected profile)")
        assert client.edge_id is not None and client.client_id is not None
        edge = self.edges[client.edge_id]
        try:
            await asyncio.wait_for(edge.connected.wait(), left())
        except asyncio.TimeoutError:
            raise CloudError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"client {client.name!r} belongs to edge {client.edge_id}, which has not "
                "connected to the cloud yet; call Register again",
            ) from None
        if self._closing:
            raise CloudError(grpc.StatusCode.UNAVAILABLE, "the cloud is shutting down")
        return pb.RegisterReply(
            client_id=client.client_id, edge_id=client.edge_id, edge_address=edge.address,
            num_clients=len(self.clients), num_edges=self.num_edges,
        )

    def _window_expired(self) -> None:
        self._window_closed = True
        if self.phase == PHASE_REGISTERING and not self.forming:
            n = len(self.clients)
            if n >= self.num_edges:
                log.warning("registration window over: forming coalitions with %d of %d "
                            "expected clients", n, self.expected_clients)
            else:
                log.warning("registration window over with %d clients; formation waits for "
                            "at least %d (one per edge)", n, self.num_edges)
        self._maybe_form()

    def _maybe_form(self) -> None:
        if self.should_form(self._window_closed):
            self.forming = True
            if self._timer is not None:
                self._timer.cancel()
            self._spawn(self._run_formation())

    async def _run_formation(self) -> None:
        assert self._formed is not None
        try:
            tasks = await asyncio.to_thread(self.form_and_build)
        except Exception as err:  # noqa: BLE001 - reported to every waiting client
            # the cloud stays up and keeps registering: a changed or new registration retries
            log.exception("coalition formation failed; still registering")
            self.formation_failed(err)
            failed, self._formed = self._formed, asyncio.Event()
            failed.set()  # wake every waiting Register: they answer FAILED_PRECONDITION
            self._maybe_form()
            return
        self.begin_training()
        self._formed.set()
        await self._publish(tasks)

    async def _publish(self, tasks: list[TaskState]) -> None:
        """Make new tasks visible to their edges' streams (event-loop thread)."""
        if self.strategy is not None:
            self._in_flight_view = sorted(self.strategy.in_flight)
        for t in tasks:
            self.tasks[t.task_id] = t
            edge = self.edges[t.dispatch.coalition]
            edge.current = t
            log.info("round %d: task %s -> edge %d (%d clients, version %d, T^ %.2f s)",
                     t.dispatch.round, t.task_id, t.dispatch.coalition, len(t.dispatch.clients),
                     t.dispatch.version, t.dispatch.t_hat_s)
            async with edge.cond:
                edge.cond.notify_all()

    # ================================================================== failures
    async def _watchdog(self) -> None:
        """Expire tasks past their deadline (see ``cloud_server.failover``)."""
        period = max(0.05, min(1.0, self.cfg.reliability.deadline_min_s / 4))
        while not self._closing and not self.done:
            await asyncio.sleep(period)
            s = self.strategy
            if s is None or self.phase != PHASE_TRAINING:
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
        assert self._arrival_lock is not None
        async with self._arrival_lock:
            s = self.strategy
            if s is None or self.done or m in s.unavailable:
                return
            if task is not None and (s.in_flight.get(m) is not task.dispatch
                                     or task.pending is not None or task.reply is not None):
                return  # answered meanwhile
            if task is None and m in s.in_flight:
                return  # it got a task meanwhile: the deadline decides
            new = await asyncio.to_thread(self.lose, m, task, why)
            edge = self.edges[m]
            if task is not None and edge.current is task:
                edge.current = None
            log.warning("coalition %d marked unavailable: %s%s", m, why,
                        f"; dispatched {[t.dispatch.coalition for t in new]} instead"
                        if new else "")
            await self._publish(new)

    async def _take_back(self, m: int, why: str) -> None:
        """Let coalition m be scheduled again and fill free slots."""
        assert self._arrival_lock is not None
        async with self._arrival_lock:
            s = self.strategy
            if s is None or self.done or m not in s.unavailable:
                return
            new = await asyncio.to_thread(self.take_back, m, why)
            log.info("coalition %d available again: %s", m, why)
            await self._publish(new)

    # ================================================================== the end
    async def _finish(self) -> None:
        assert self._done is not None
        self.phase = PHASE_DONE
        if self.strategy is not None and self.records:
            with self.lock:
                measured = self.strategy.estimator.mean()
            self.check_reach(measured, "the measured latencies")

        def final_checkpoint() -> None:
            with self.lock:
                self.save_checkpoint()

        try:
            await asyncio.to_thread(final_checkpoint)
        except Exception:  # noqa: BLE001
            log.exception("writing the final checkpoint failed")
        try:
            self.result = await asyncio.to_thread(self.write_results)
        except Exception:  # noqa: BLE001
            log.exception("writing the results failed")
        self._done.set()
        await self._wake_edges()
        log.info("training over after %d rounds%s", len(self.records),
                 f"; results in {self.out_dir}" if self.out_dir else "")

    # ================================================================== Monitor
    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> pb.StatusReply:
        """Health and progress, answered WITHOUT a token (healthchecks, ``fedcure-healthcheck``):
        phase, global version and round, the configured rounds, counts of registered clients
        and connected edges, the ids of the coalitions training now and where their tasks stand
        (edge round, ids of the clients still training, seconds, ETA). No names, addresses,
        models, metrics or tokens (see ``cloud_server.security``)."""
        s = self.strategy
        return pb.StatusReply(
            phase=int(self.phase),
            version=s.version if s else 0,
            round=s.round if s else 0,
            global_rounds=self.cfg.run.global_rounds,
            clients_registered=len(self.clients),
            expected_clients=self.expected_clients,
            edges_connected=sum(e.connected.is_set() for e in self.edges.values()),
            num_edges=self.num_edges,
            in_flight=self._in_flight_view,
            progress=self.progress.snapshot(live_task(self)),
        )


__all__ = ["CloudService", "EdgeSlot", "PHASE_DONE", "PHASE_REGISTERING", "PHASE_TRAINING"]
