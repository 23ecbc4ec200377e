"""The cloud server (CS): FedCure's strategy behind gRPC (``fedcure_app/protocol/cloud.proto``).

One :class:`CloudService` holds the cloud's state and implements the three services:

``Association.Register``
    Clients announce their name, label histogram, device profile and home ES. Names map to
    stable client ids (registering a name again gives the same answer). When the expected
    clients are in, or the registration window (``register_timeout_s`` after start) has passed
    with at least M clients, the cloud runs coalition formation ONCE with the configured rule
    (``none`` keeps the home ESs; ``fedcure``/``selfish``/``pareto`` start from the home ESs;
    ``kmeans``/``meanshift`` cluster the histograms), builds the :class:`FedCureStrategy`, and
    dispatches round 0. Every waiting Register is then answered with the client's ES id and that
    ES's address, once that ES has connected. Client ids are given at formation in natural order
    of the names (``c2`` before ``c10``), so they do not depend on arrival order; clients that
    claimed a partition come first, in partition order.

``Association.Claim``
    A client without data of its own learns its stable partition index (first come, keyed by
    name), the partition count and the configuration as JSON, and computes its partition as
    ``fedcure simulate`` does; ids then equal partition indices, so both form the same coalitions.

``EdgeLink.Connect`` / ``EdgeLink.Submit``
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

Concurrency: the gRPC server is ``grpc.aio``; the service's bookkeeping runs on its event loop,
so thousands of Register calls can wait at once without a thread each. CPU work (model
decoding, formation, aggregation, evaluation, writing results) runs in worker threads; every
strategy transition holds ``self.lock`` (a ``threading.Lock``), and arrivals are processed one at
a time (an ``asyncio.Lock`` around aggregate → dispatch → evaluate).

Records (``result["records"]``) carry the engine's keys: round, time_s (wall seconds since round
0 was dispatched), coalition, staleness, xi, latency_s (measured by the cloud), estimate_s,
version, queues, dispatched, frequencies_ghz, energy_j, accuracy, loss; plus task_id,
edge_latency_s (what the ES measured) and dropped. Energy per client-round is κ_n·c_n·f_n² with
the cycles c_n = seconds·f_n·10⁹ the client reported running at f_n GHz.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.devices import DeviceProfile, PopulationArrays
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import (
    GRPC_OPTIONS,
    CodecError,
    WithModel,
    check_like,
    decode_arrays,
    edge_link_handler,
    encode_arrays,
    profile_from_proto,
    report_from_proto,
    unwrap,
)
from fedcure_app.strategy import Dispatch, EdgeUpdate, FedCureStrategy
from cloud_server import validation as door
from cloud_server.errors import CloudError
from cloud_server.identity import EdgeCredentials
from cloud_server.screening import NormScreen, distance
from fedcure_app.tasks import ClientReport, derive_seed

log = logging.getLogger("fedcure.cloud")

#: ``evaluator(arrays) -> (accuracy, loss)`` on a held-out set.
Evaluator = Callable[[list[np.ndarray]], tuple[float, float]]

PHASE_REGISTERING = pb.StatusReply.REGISTERING
PHASE_TRAINING = pb.StatusReply.TRAINING
PHASE_DONE = pb.StatusReply.DONE
# bounds on what clients and edges send: cloud_server.validation


def natural_key(name: str) -> list[Any]:
    """Sort key putting ``c2`` before ``c10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def fill_empty_coalitions(assignment: np.ndarray, num_edges: int) -> tuple[np.ndarray, list[str]]:
    """Give every empty coalition one client from the largest one (needs N ≥ M).

    Returns the new assignment and a note per move. Deterministic: the moved client is the
    highest id of the largest coalition (lowest coalition index on ties).
    """
    a = np.asarray(assignment, dtype=np.int64).copy()
    notes: list[str] = []
    if a.size < num_edges:
        raise ValueError(f"{a.size} clients cannot fill {num_edges} coalitions")
    while True:
        sizes = np.bincount(a, minlength=num_edges)
        empty = np.flatnonzero(sizes == 0)
        if empty.size == 0:
            return a, notes
        big = int(np.argmax(sizes))
        moved = int(np.flatnonzero(a == big).max())
        a[moved] = int(empty[0])
        notes.append(f"client {moved} moved from coalition {big} to empty coalition {empty[0]}")


def initial_partition(homes: Sequence[int | None], num_edges: int) -> tuple[np.ndarray, list[str]]:
    """The initial client→ES association from the clients' home ESs.

    Clients without a home ES join the ES with the fewest clients so far (lowest index on ties);
    ESs nobody calls home get one client from the largest (see :func:`fill_empty_coalitions`).
    """
    a = np.full(len(homes), -1, dtype=np.int64)
    for i, h in enumerate(homes):
        if h is not None:
            a[i] = int(h)
    sizes = np.bincount(a[a >= 0], minlength=num_edges)
    for i in np.flatnonzero(a < 0):
        e = int(np.argmin(sizes))
        a[i] = e
        sizes[e] += 1
    return fill_empty_coalitions(a, num_edges)


def form(cfg: FedCureConfig, counts: np.ndarray, initial: np.ndarray) -> tuple[np.ndarray, Any]:
    """Coalition assignment for the configured rule (as the simulation engine does)."""
    rule = cfg.method.formation
    m = cfg.federation.num_edges
    if rule == "none":
        return initial.copy(), None
    from fedcure_app.core.coalition import cluster_coalitions, form_coalitions

    if rule in ("kmeans", "meanshift"):
        return np.asarray(cluster_coalitions(counts, m, method=rule, seed=cfg.run.seed)), None
    res = form_coalitions(counts, initial, m, rule=rule, seed=cfg.run.seed)
    return np.asarray(res.assignment), res


def prior_latency(population: PopulationArrays, coalitions: list[list[int]], samples_per_round: int,
                  model_bytes: int, tau_e: int, edge_link_mbps: float) -> np.ndarray:
    """Device-profile prediction of each coalition's task latency at f_max (as
    ``engine.Federation.prior_latency``): τ_e slowest-client edge rounds + the edge↔cloud
    links."""
    per_client = population.round_seconds(samples_per_round, model_bytes, population.f_max_ghz)
    link = 2 * 8.0 * model_bytes / (edge_link_mbps * 1e6)
    return np.array([tau_e * per_client[c].max() + link for c in coalitions])


@dataclass
class _Client:
    name: str
    label_counts: np.ndarray
    profile: DeviceProfile
    home_edge: int | None
    client_id: int | None = None
    edge_id: int | None = None
    #: the client's SuperNode public key (OpenSSH text) for SuperNode authentication; "" none
    supernode_key: str = ""


@dataclass
class _Edge:
    edge_id: int
    address: str = ""
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    generation: int = 0
    current: "_Task | None" = None
    connects: int = 0


@dataclass
class _Task:
    task_id: str
    dispatch: Dispatch
    #: the Task message (model beside it: the encoded global model, shared by the version's tasks)
    message: WithModel
    dispatched_at: float
    sent_at: float | None = None
    reply: pb.SubmitReply | None = None
    pending: asyncio.Future | None = None
    #: why the task stopped being expected (its deadline passed), None while it is
    expired: str | None = None
    #: seconds after ``dispatched_at`` by which the answer must arrive
    deadline_s: float = math.inf


@dataclass
class _Arrival:
    """What a worker thread hands back from one aggregation."""

    record: dict[str, Any]
    new: list[_Task]
    finished: bool


class CloudService(pb_grpc.AssociationServicer, pb_grpc.EdgeLinkServicer, pb_grpc.MonitorServicer):
    """The cloud's state and RPC handlers (see the module docstring).

    Parameters
    ----------
    cfg:
        The configuration; ``federation.num_edges`` is M, ``run.global_rounds`` the stop.
    expected_clients:
        Formation runs as soon as this many clients are registered.
    out_dir:
        Where ``result.json``, plots and ``final_model.safetensors`` go (None: nothing written).
    register_timeout_s:
        Registration window from :meth:`start` (formation then runs with the clients in, given
        at least M); one Register call waits this long, and at least until shortly after the
        window closes (then DEADLINE_EXCEEDED: the client may call again).
    token:
        Shared secret every request must carry (empty: not checked).
    initial_arrays:
        The initial global model; default the configured dataset's CNN seeded with ``run.seed``.
    evaluator:
        ``arrays -> (accuracy, loss)`` run at start, every ``eval_every`` rounds and at the end.
    write_plots:
        Write the PNG plots with the results.
    edge_credentials:
        Per-edge tokens and/or edge client certificates binding each edge id to a credential
        (``cloud_server.identity``); None: the shared token lets a caller act as any edge.
    """

    def __init__(
        self,
        cfg: FedCureConfig,
        *,
        expected_clients: int,
        out_dir: str | Path | None = None,
        register_timeout_s: float = 300.0,
        token: str = "",
        initial_arrays: list[np.ndarray] | None = None,
        evaluator: Evaluator | None = None,
        write_plots: bool = True,
        checkpoint_dir: str | Path | None = None,
        resume: bool = False,
        edge_credentials: EdgeCredentials | None = None,
    ) -> None:
        if expected_clients < cfg.federation.num_edges:
            raise ValueError(
                f"expected_clients ({expected_clients}) < edges ({cfg.federation.num_edges}): "
                "every edge server needs at least one client"
            )
        if not register_timeout_s > 0:
            raise ValueError(f"register timeout must be > 0 s, got {register_timeout_s}")
        self.cfg = cfg
        self.num_edges = cfg.federation.num_edges
        self.expected_clients = int(expected_clients)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.register_timeout_s = float(register_timeout_s)
        self.token = token
        self.evaluator = evaluator
        self.write_plots = write_plots
        self._initial_arrays = initial_arrays

        #: guards every strategy transition (worker threads and readers)
        self.lock = threading.Lock()
        self.phase = PHASE_REGISTERING
        self.strategy: FedCureStrategy | None = None
        self.clients: dict[str, _Client] = {}
        #: client name -> claimed partition index (Association.Claim)
        self.claims: dict[str, int] = {}
        self.assignment: np.ndarray | None = None
        self.initial_assignment: np.ndarray | None = None
        self.formation: Any = None
        self.records: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.failure: str | None = None
        self.initial_accuracy: float | None = None
        self._population: PopulationArrays | None = None
        self._counts: np.ndarray | None = None
        self._jsd_pair: tuple[float, float] | None = None
        self._tasks: dict[str, _Task] = {}
        self._edges: dict[int, _Edge] = {}
        self._model_cache: tuple[int, bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._formed: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        self._arrival_lock: asyncio.Lock | None = None
        self._forming = False
        self._closing = False
        self._window_closed = False
        #: coalitions in flight, as last seen on the event loop (for Status)
        self._in_flight_view: list[int] = []
        self._started_at = 0.0
        self._t0: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task] = set()
        rel = cfg.reliability
        #: refuses edge models far outside the recently accepted ones
        self.screen = NormScreen(rel.norm_factor, rel.norm_window, rel.norm_min_history)
        #: lost edge servers, expired tasks, reconnections (JSON-safe rows)
        self.faults: list[dict[str, Any]] = []
        from cloud_server.progress import ProgressBoard

        #: the ESs' live reports inside a task (EdgeLink.Progress): logged, shown in Status
        self.progress = ProgressBoard()
        from cloud_server.checkpoint import CheckpointStore

        #: where the durable state goes (None: no checkpoints)
        self.checkpoints = CheckpointStore(checkpoint_dir) if checkpoint_dir is not None else None
        self.resume = bool(resume)
        self.resumed = False
        self.edge_credentials = edge_credentials or EdgeCredentials()
        #: conditions the user should know about (unreachable target shares), JSON-safe rows
        self.warnings: list[dict[str, Any]] = []
        #: why the last formation attempt failed (None: none failed); cleared by a new one
        self.formation_error: str | None = None
        #: registrations changed since the last failed formation (worth trying again)
        self._registrations_changed = False

    # ================================================================== lifecycle
    def start(self) -> None:
        """Bind to the running event loop and open the registration window."""
        self._loop = asyncio.get_running_loop()
        self._formed = asyncio.Event()
        self._done = asyncio.Event()
        self._arrival_lock = asyncio.Lock()
        self._edges = {m: _Edge(m) for m in range(self.num_edges)}
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
        from cloud_server.checkpoint import restore

        assert self.checkpoints is not None and self._formed is not None
        state, models = self.checkpoints.load()
        restore(self, state, models)  # no RPC runs yet: nothing to lock against
        self.resumed = True
        self.phase = PHASE_TRAINING
        self._window_closed = True
        self._forming = True
        if self._timer is not None:
            self._timer.cancel()
        self._formed.set()
        assert self.strategy is not None
        self._in_flight_view = sorted(self.strategy.in_flight)
        for t in self._tasks.values():
            if self.strategy.in_flight.get(t.dispatch.coalition) is t.dispatch:
                self._edges[t.dispatch.coalition].current = t
        self._fault("resumed", None, f"resumed from checkpoint at version "
                    f"{self.strategy.version}, round {self.strategy.round}")
        if state["phase"] == "done" or self.strategy.round >= self.cfg.run.global_rounds:
            self.phase = PHASE_DONE
            self.result = self._write_results()
            assert self._done is not None
            self._done.set()
            log.info("the checkpointed run was already complete; results rewritten")

    def _fault(self, kind: str, coalition: int | None, detail: str) -> None:
        """Record a failure event (lost ES, expired task, reconnection, resumption)."""
        t = time.monotonic() - self._t0 if self._t0 is not None else 0.0
        self.faults.append({"time_s": t, "kind": kind, "coalition": coalition,
                            "round": self.strategy.round if self.strategy else 0,
                            "detail": detail})

    def _finished_in_checkpoint(self) -> bool:
        return self.strategy is not None and self.strategy.round >= self.cfg.run.global_rounds

    def _save_checkpoint(self) -> None:
        """Write the durable state (worker thread, holding ``self.lock``)."""
        if self.checkpoints is None or self.strategy is None:
            return
        from cloud_server.checkpoint import snapshot

        state, models = snapshot(self)
        self.checkpoints.save(state, models)

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
        for e in self._edges.values():
            e.connected.set()
        await self._wake_edges()
        for t in list(self._background):
            t.cancel()

    @property
    def done(self) -> bool:
        return self._done is not None and self._done.is_set()

    # ================================================================== helpers
    def _check_token(self, token: str) -> None:
        from cloud_server.security import token_ok

        if not token_ok(self.token, token):
            raise CloudError(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing token")

    def _check_edge(self, token: str, edge_id: int, context: Any) -> int:
        """The caller may act as edge ``edge_id`` (its credential, ``cloud_server.identity``);
        returns the checked edge index."""
        from cloud_server.security import token_ok

        self.edge_credentials.check(int(edge_id), token, context,
                                    shared_ok=token_ok(self.token, token))
        return self._edge_index(edge_id)

    def _edge_index(self, edge_id: int) -> int:
        """A requested edge id, checked against the configured ESs."""
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
        for e in self._edges.values():
            async with e.cond:
                e.cond.notify_all()

    async def _abort(self, context: grpc.aio.ServicerContext, err: CloudError) -> None:
        await context.abort(err.code, err.message)

    # ================================================================== Association
    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
                       ) -> pb.RegisterReply:
        try:
            return await self._register(request, context)
        except CloudError as err:
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
            index = self._claim(name,
                                request.partition_id if request.HasField("partition_id")
                                else None)
        except CloudError as err:
            await self._abort(context, err)
            raise  # unreachable: abort raises
        return pb.ClaimReply(partition_id=index, num_partitions=self.cfg.federation.num_clients,
                             config_json=self.cfg.model_dump_json(by_alias=True))

    def _claim(self, name: str, wanted: int | None) -> int:
        n = self.cfg.federation.num_clients
        if not name:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT, "client_name is empty")
        held = self.claims.get(name)
        if held is not None:
            if wanted is not None and wanted != held:
                raise CloudError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"client {door.clip(name)} already holds partition {held}, "
                                 f"not {wanted}")
            return held
        taken = set(self.claims.values())
        if wanted is not None:
            if not 0 <= wanted < n:
                raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"partition {wanted} outside [0, {n})")
            if wanted in taken:
                raise CloudError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"partition {wanted} is already held by another client")
            index = wanted
        else:
            free = [i for i in range(n) if i not in taken]
            if not free:
                raise CloudError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"all {n} partitions are taken")
            index = free[0]
        self.claims[name] = index
        log.info("client %r claimed partition %d of %d", name, index, n)
        return index

    def _client_order(self, name: str) -> tuple[int, list[Any]]:
        """Client ids follow the claimed partition index, then the name's natural order."""
        return self.claims.get(name, self.cfg.federation.num_clients), natural_key(name)

    def _validate_registration(self, req: pb.RegisterRequest) -> _Client:
        """Every field of a Register request within bounds (``cloud_server.validation``), and
        the client's predicted edge round finite: one client can never make formation fail."""
        try:
            name = door.check_name(req.client_name)
        except door.Refused as err:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
        who = f"client {door.clip(name)}"
        c = self.cfg.federation.num_classes
        try:
            door.check_label_counts(req.label_counts, c)
            if not req.HasField("device"):
                raise door.Refused("no device profile")
            door.check_profile_size(len(req.device.cycles_per_sample))
            profile = profile_from_proto(req.device)
            door.check_profile(profile, self.cfg.data.dataset)
            door.check_key_text(req.supernode_public_key)
        except (door.Refused, CodecError) as err:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT, f"{who}: {err}") from None
        counts = np.asarray(req.label_counts, dtype=np.int64)
        home: int | None = None
        if req.HasField("home_edge"):
            home = int(req.home_edge)
            if not 0 <= home < self.num_edges:
                raise CloudError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{who}: home_edge {home} outside [0, {self.num_edges})",
                )
        key = req.supernode_public_key.strip()
        if key:
            from fedcure_app.supernode_auth import check_supernode_key

            try:
                check_supernode_key(key)
            except ValueError as err:
                raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{who}: {err}") from None
        return _Client(name, counts, profile, home, supernode_key=key)

    async def _register(self, req: pb.RegisterRequest, context: grpc.aio.ServicerContext
                        ) -> pb.RegisterReply:
        assert self._formed is not None
        self._check_token(req.token)
        entry = self._validate_registration(req)
        began = time.monotonic()
        known = self.clients.get(entry.name)
        if known is None:
            if self.phase != PHASE_REGISTERING or self._forming:
                raise CloudError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"registration is closed: coalition formation already ran with "
                    f"{len(self.clients)} clients; {door.clip(entry.name)} is not one of them",
                )
            self.clients[entry.name] = entry
            self._registrations_changed = True
            n = len(self.clients)
            if n == self.expected_clients or n <= 3 or n % max(1, self.expected_clients // 10) == 0:
                log.info("client %r registered (%d/%d)", entry.name, n, self.expected_clients)
            self._maybe_form()
        elif self.phase == PHASE_REGISTERING and not self._forming:
            # re-registration before formation: the latest histogram and profile count
            known.label_counts, known.profile, known.home_edge = (
                entry.label_counts, entry.profile, entry.home_edge)
            self._registrations_changed = True
            self._maybe_form()
        client = self.clients[entry.name]
        if entry.supernode_key and entry.supernode_key != client.supernode_key:
            # a restarted client may come with a new SuperNode key: its ES registers that one
            client.supernode_key = entry.supernode_key

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
        edge = self._edges[client.edge_id]
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
        if self.phase == PHASE_REGISTERING and not self._forming:
            n = len(self.clients)
            if n >= self.num_edges:
                log.warning("registration window over: forming coalitions with %d of %d "
                            "expected clients", n, self.expected_clients)
            else:
                log.warning("registration window over with %d clients; formation waits for "
                            "at least %d (one per edge)", n, self.num_edges)
        self._maybe_form()

    def _maybe_form(self) -> None:
        if self._forming or self.phase != PHASE_REGISTERING:
            return
        if self.formation_error is not None and not self._registrations_changed:
            return  # the same registrations would fail the same way
        n = len(self.clients)
        if n >= self.expected_clients or (self._window_closed and n >= self.num_edges):
            self._forming = True
            if self._timer is not None:
                self._timer.cancel()
            self._spawn(self._run_formation())

    async def _run_formation(self) -> None:
        assert self._formed is not None
        self._registrations_changed = False
        try:
            dispatches = await asyncio.to_thread(self._form_and_build)
        except Exception as err:  # noqa: BLE001 - reported to every waiting client
            # the cloud stays up and keeps registering: a changed or new registration retries
            log.exception("coalition formation failed; still registering")
            with self.lock:
                self.strategy = None
                self.assignment = self.initial_assignment = None
                for c in self.clients.values():
                    c.client_id = c.edge_id = None
            self.formation_error = f"coalition formation failed on the cloud: {door.clip(str(err), 200)}"
            self._fault("formation-failed", None, self.formation_error)
            self._forming = False
            failed, self._formed = self._formed, asyncio.Event()
            failed.set()  # wake every waiting Register: they answer FAILED_PRECONDITION
            self._maybe_form()
            return
        self.formation_error = None
        self._t0 = time.monotonic()
        self.phase = PHASE_TRAINING
        self._formed.set()
        await self._publish(dispatches)

    # ------------------------------------------------------------------ formation (worker thread)
    def _build_initial_arrays(self) -> list[np.ndarray]:
        if self._initial_arrays is not None:
            return [np.array(a, copy=True) for a in self._initial_arrays]
        import torch

        from fedcure_app.models import build_model, get_weights

        torch.manual_seed(self.cfg.run.seed)
        model = build_model(self.cfg.data.dataset, self.cfg.federation.num_classes)
        return get_weights(model)

    def _form_and_build(self) -> list[_Task]:
        cfg = self.cfg
        m = self.num_edges
        names = sorted(self.clients, key=self._client_order)
        clients = [self.clients[nm] for nm in names]
        counts = np.stack([c.label_counts for c in clients])
        initial, notes = initial_partition([c.home_edge for c in clients], m)
        for note in notes:
            log.warning("initial partition: %s", note)
        t = time.perf_counter()
        assignment, result = form(cfg, counts, initial)
        assignment, notes = fill_empty_coalitions(assignment, m)
        for note in notes:
            log.warning("formation left a coalition empty: %s", note)
        coalitions = [np.flatnonzero(assignment == e).tolist() for e in range(m)]
        jsd = self._jsd(counts, initial, assignment)
        log.info(
            "coalition formation (%s) over %d clients in %.2f s: sizes %s%s",
            cfg.method.formation, len(clients), time.perf_counter() - t,
            [len(c) for c in coalitions],
            f", average JSD {jsd[0]:.4f} -> {jsd[1]:.4f}" if jsd else "",
        )
        arrays = self._build_initial_arrays()
        strategy = self._install(clients, initial, assignment, result, jsd, arrays)
        self._check_reach(strategy.estimator.mean(), "the device profiles' latency prior")
        with self.lock:
            if self.evaluator is not None:
                self.initial_accuracy = float(self.evaluator(strategy.global_arrays)[0])
            dispatches = strategy.dispatch()
            tasks = [self._make_task(d) for d in dispatches]
            self._save_checkpoint()
            return tasks

    def _install(self, clients: list[_Client], initial: np.ndarray, assignment: np.ndarray,
                 result: Any, jsd: tuple[float, float] | None, arrays: list[np.ndarray]
                 ) -> FedCureStrategy:
        """Build the strategy for a formed federation (``clients`` in id order)."""
        cfg = self.cfg
        m = self.num_edges
        counts = np.stack([c.label_counts for c in clients])
        coalitions = [np.flatnonzero(assignment == e).tolist() for e in range(m)]
        model_bytes = int(sum(a.nbytes for a in arrays))
        population = PopulationArrays.from_profiles([c.profile for c in clients], cfg.data.dataset)
        spr = cfg.method.tau_c * cfg.method.batch_size
        prior = prior_latency(population, coalitions, spr, model_bytes, cfg.method.tau_e,
                              cfg.devices.edge_link_mbps)
        strategy = FedCureStrategy(
            cfg.method,
            coalitions,
            counts.sum(axis=1).astype(np.float64),
            population.cycles(spr),
            np.stack([population.f_min_ghz, population.f_max_ghz], axis=1),
            prior,
            arrays,
            max_concurrent=cfg.concurrency,
            seed=cfg.run.seed,
            calibrate_prior=cfg.devices.calibrates(deployed=True),
        )
        with self.lock:
            for i, c in enumerate(clients):
                c.client_id = i
                c.edge_id = int(assignment[i])
            self.assignment = assignment
            self.initial_assignment = initial
            self.formation = result
            self._population = population
            self._counts = counts
            self._jsd_pair = jsd
            self.strategy = strategy
        return strategy

    def _check_reach(self, latency_s: np.ndarray, source: str) -> None:
        """Warn (log and result.json ``warnings``) about every coalition whose target share
        δ_m exceeds what K concurrent slots and its latency allow (``cloud_server.reach``)."""
        from cloud_server.reach import unreachable

        s = self.strategy
        if s is None:
            return
        try:
            bad = unreachable(s.delta, latency_s, s.max_concurrent)
        except ValueError as err:  # e.g. a non-finite estimate: nothing to say
            log.debug("reachability check skipped: %s", err)
            return
        for m, delta, cap in bad:
            text = (f"coalition {m}: target share delta {delta:.3f} is out of reach: with at "
                    f"most {s.max_concurrent} coalitions in flight and its latency (from "
                    f"{source}) it can get at most {cap:.3g} of the rounds; its virtual queue "
                    "will grow without bound (not mean-rate stable)")
            log.warning("%s", text)
            self.warnings.append({"kind": "unreachable-share", "coalition": m, "delta": delta,
                                  "max_share": cap, "source": source, "detail": text})

    def _jsd(self, counts: np.ndarray, initial: np.ndarray, assignment: np.ndarray
             ) -> tuple[float, float] | None:
        try:
            from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts
        except ImportError:  # pragma: no cover - core not installed
            return None
        m = self.num_edges
        return (
            float(average_pairwise_jsd(coalition_label_counts(counts, initial, m))),
            float(average_pairwise_jsd(coalition_label_counts(counts, assignment, m))),
        )

    def _global_model_bytes(self) -> bytes:
        """The encoded global model of the current version (cached; call with the lock)."""
        assert self.strategy is not None
        v = self.strategy.version
        if self._model_cache is None or self._model_cache[0] != v:
            self._model_cache = (v, encode_arrays(self.strategy.global_arrays,
                                                  {"version": str(v)}))
        return self._model_cache[1]

    def _make_task(self, d: Dispatch, *, task_id: str | None = None,
                   model: bytes | None = None) -> _Task:
        """The task message for a dispatch (call with the lock held); registers the task.

        ``model``: the encoded model of ``d.version`` (default: the current global model).
        The deadline is ``deadline-slack`` × the estimator's ``deadline-quantile`` of the
        coalition's latency, at least ``deadline-min-s``.
        """
        cfg = self.cfg
        if task_id is None:
            task_id = base = f"r{d.round}-c{d.coalition}-v{d.version}"
            n = 1
            while task_id in self._tasks:  # the coalition was lost and sent the same round again
                n += 1
                task_id = f"{base}-{n}"
        msg = pb.Task(
            task_id=task_id,
            coalition=d.coalition,
            version=d.version,
            tau_e=cfg.method.tau_e,
            tau_c=cfg.method.tau_c,
            lr=cfg.method.lr,
            batch_size=cfg.method.batch_size,
            client_ids=list(d.clients),
            frequencies_ghz=d.frequencies_ghz,
            seed=derive_seed(cfg.run.seed, d.round, d.coalition),
            round=d.round,
            t_hat_round_s=d.t_hat_round_s,
        )
        task = _Task(task_id, d, WithModel(msg, model if model is not None
                                           else self._global_model_bytes()), time.monotonic())
        task.deadline_s = self._deadline_s(d.coalition)
        self._tasks[task_id] = task
        return task

    def _deadline_s(self, m: int) -> float:
        """How long coalition m may take before it counts as lost (seconds)."""
        from cloud_server.failover import task_deadline_s

        assert self.strategy is not None
        return task_deadline_s(self.strategy.estimator, m, self.cfg.reliability)

    async def _publish(self, tasks: list[_Task]) -> None:
        """Make new tasks visible to their edges' streams (event-loop thread)."""
        if self.strategy is not None:
            self._in_flight_view = sorted(self.strategy.in_flight)
        for t in tasks:
            self._tasks[t.task_id] = t
            edge = self._edges[t.dispatch.coalition]
            edge.current = t
            log.info("round %d: task %s -> edge %d (%d clients, version %d, T^ %.2f s)",
                     t.dispatch.round, t.task_id, t.dispatch.coalition, len(t.dispatch.clients),
                     t.dispatch.version, t.dispatch.t_hat_s)
            async with edge.cond:
                edge.cond.notify_all()

    # ================================================================== EdgeLink.Members
    async def Members(self, request: pb.MembersRequest, context: grpc.aio.ServicerContext
                      ) -> pb.MembersReply:
        """The clients of ES ``edge_id`` with their SuperNode keys (none before formation)."""
        try:
            m = self._check_edge(request.token, request.edge_id, context)
        except CloudError as err:
            await self._abort(context, err)
            raise  # unreachable: abort raises
        members = [pb.Member(client_id=c.client_id, client_name=c.name,
                             supernode_public_key=c.supernode_key)
                   for c in sorted(self.clients.values(), key=lambda c: c.client_id or 0)
                   if c.edge_id == m and c.client_id is not None]
        return pb.MembersReply(members=members)

    # ================================================================== EdgeLink.Connect
    async def Connect(self, request: pb.ConnectRequest, context: grpc.aio.ServicerContext):
        try:
            m = self._check_edge(request.token, request.edge_id, context)
            try:
                address = door.check_address(request.address)
            except door.Refused as err:
                raise CloudError(grpc.StatusCode.INVALID_ARGUMENT, f"edge {m}: {err}") from None
        except CloudError as err:
            await self._abort(context, err)
            return
        assert self._done is not None
        edge = self._edges[m]
        edge.generation += 1
        edge.connects += 1
        gen = edge.generation
        edge.address = address
        edge.connected.set()
        log.info("edge %d connected (%s)%s", m, edge.address,
                 " again" if edge.connects > 1 else "")
        async with edge.cond:
            edge.cond.notify_all()  # a previous stream of this edge ends
        if self.strategy is not None and m in self.strategy.unavailable and not self.done:
            await self._take_back(m, "its edge server connected again")
        last: _Task | None = None
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

    # ================================================================== EdgeLink.Submit
    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext
                     ) -> pb.SubmitReply:
        try:
            return await self._submit(request, context)
        except CloudError as err:
            await self._abort(context, err)
            raise

    async def _submit(self, request: pb.SubmitRequest | WithModel, context: Any = None
                      ) -> pb.SubmitReply:
        received = time.monotonic()
        req, model = unwrap(request)
        self._check_edge(req.token, req.edge_id, context)
        task = self._tasks.get(req.task_id) if door.task_id_known(req.task_id) else None
        if task is None:
            raise CloudError(grpc.StatusCode.NOT_FOUND,
                             f"unknown task id {door.clip(req.task_id)}")
        if req.edge_id != task.dispatch.coalition:
            raise CloudError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"task {task.task_id} belongs to edge {task.dispatch.coalition}, "
                f"not edge {req.edge_id}",
            )
        if task.reply is not None:
            return task.reply
        if task.pending is not None:
            return await asyncio.shield(task.pending)
        if self.phase == PHASE_DONE or self.done:
            task.reply = pb.SubmitReply(
                accepted=False, version=self.strategy.version if self.strategy else 0,
                detail="training is over; this model was not aggregated",
            )
            return task.reply
        strategy = self.strategy
        assert strategy is not None
        m = task.dispatch.coalition
        late = task.expired is not None
        if late:
            # a late answer is a stale update (issue 18): aggregated within the bound
            staleness = strategy.version - task.dispatch.version
            bound = self.cfg.reliability.late_staleness_bound
            if staleness > bound:
                if m in strategy.unavailable and not self.done:
                    await self._take_back(m, "its edge server answered after the deadline")
                raise CloudError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"task {task.task_id} expired ({task.expired}) and is {staleness} versions "
                    f"stale, beyond late-staleness-bound {bound}; not aggregated")
            members: Sequence[int] = strategy.coalitions[m]
        else:
            if strategy.in_flight.get(m) is not task.dispatch:
                raise CloudError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"task {task.task_id} is no longer expected")
            members = task.dispatch.clients
        try:
            door.check_submit(int(req.num_samples), float(req.latency_s), req.stats,
                              list(req.dropped_client_ids), members, self.cfg.method.tau_e)
        except door.Refused as err:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"task {task.task_id}: {err}") from None

        task.pending = self._loop.create_future()  # type: ignore[union-attr]
        try:
            reference = strategy.global_arrays
            t_dec = time.monotonic()
            try:
                arrays = await asyncio.to_thread(_decode_checked, model, reference)
            except CodecError as err:
                raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"task {task.task_id}: {err}") from None
            sent = task.sent_at if task.sent_at is not None else task.dispatched_at
            latency = max(received - sent, 1e-6)
            reports = [report_from_proto(s) for s in req.stats]
            assert self._arrival_lock is not None
            async with self._arrival_lock:
                if self.done or self.phase == PHASE_DONE:
                    reply = pb.SubmitReply(accepted=False, version=strategy.version,
                                           detail="training is over; not aggregated")
                else:
                    t_agg = time.monotonic()
                    try:
                        arrival = await asyncio.to_thread(
                            self._arrive, task, arrays, latency, float(req.latency_s),
                            int(req.num_samples), reports, list(req.dropped_client_ids), late)
                    except ValueError as err:  # the strategy refused the arrival
                        raise CloudError(grpc.StatusCode.FAILED_PRECONDITION,
                                         f"task {task.task_id}: {err}") from None
                    except (CloudError, asyncio.CancelledError):
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
                        acc, loss = await asyncio.to_thread(self._evaluate)
                        rec["accuracy"], rec["loss"] = acc, loss
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

    def _arrive(self, task: _Task, arrays: list[np.ndarray], latency: float, edge_latency: float,
                num_samples: int, reports: list[ClientReport], dropped: list[int],
                late: bool = False) -> _Arrival:
        """Aggregate one edge model, dispatch again, record the round, write the checkpoint
        (worker thread): all of it or, when any step fails, none (the state is rolled back)."""
        strategy = self.strategy
        assert strategy is not None and self._t0 is not None
        with self.lock:
            undo = strategy.undo_point()
            marks = (len(self.records), len(self.faults), set(self._tasks),
                     self.screen.state_dict(), self._model_cache)
            try:
                return self._apply(task, arrays, latency, edge_latency, num_samples, reports,
                                   dropped, late)
            except BaseException:
                strategy.rollback(undo)
                del self.records[marks[0]:]
                del self.faults[marks[1]:]
                for tid in set(self._tasks) - marks[2]:
                    del self._tasks[tid]
                self.screen.load_state_dict(marks[3])
                self._model_cache = marks[4]
                task.reply = None
                raise

    def _apply(self, task: _Task, arrays: list[np.ndarray], latency: float,
               edge_latency: float, num_samples: int, reports: list[ClientReport],
               dropped: list[int], late: bool) -> _Arrival:
        """:meth:`_arrive`'s steps (holding the lock; the caller rolls back on failure)."""
        strategy = self.strategy
        assert strategy is not None and self._t0 is not None and self._population is not None
        d = task.dispatch
        m = d.coalition
        kappa = self._population.kappa
        energy = 0.0
        for r in reports:
            if 0 <= r.client < kappa.size and r.f_applied_ghz > 0:
                cycles = r.seconds * r.f_applied_ghz * 1e9
                energy += float(kappa[r.client] * cycles * r.f_applied_ghz ** 2)
        if not math.isfinite(energy):
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"task {task.task_id}: the reported stats give a non-finite energy")
        t0 = time.perf_counter()
        dist = distance(arrays, strategy.global_arrays)
        refused = self.screen.check(dist)
        if refused is not None:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT, f"task {task.task_id}: {refused}")
        update = EdgeUpdate(coalition=m, base_version=d.version, arrays=arrays,
                            num_samples=num_samples, latency_s=latency)
        if late:
            staleness = strategy.version - d.version
            self._fault("late", m, f"task {task.task_id} answered after its deadline "
                                   f"({task.expired}); aggregated as a stale update "
                                   f"(staleness {staleness})")
            if m in strategy.unavailable:
                self._fault("back", m, f"coalition {m} available again: its edge server "
                                       "answered after the deadline")
                strategy.mark_available(m)
            rec = strategy.on_late_arrival(update, self.cfg.reliability.late_staleness_bound)
        else:
            rec = strategy.on_arrival(update)
        self.screen.accept(dist)
        t1 = time.perf_counter()
        finished = rec.round >= self.cfg.run.global_rounds
        new = [] if finished else [self._make_task(x) for x in strategy.dispatch()]
        log.debug("on_arrival %.3f s, dispatch + encode %.3f s", t1 - t0,
                  time.perf_counter() - t1)
        row = {
            "round": rec.round,
            "time_s": time.monotonic() - self._t0,
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
        self._save_checkpoint()
        return _Arrival(row, new, finished)

    # ================================================================== failures
    async def _watchdog(self) -> None:
        """Expire tasks past their deadline (see ``cloud_server.failover``)."""
        from cloud_server.failover import overdue

        period = max(0.05, min(1.0, self.cfg.reliability.deadline_min_s / 4))
        while not self._closing and not self.done:
            await asyncio.sleep(period)
            s = self.strategy
            if s is None or self.phase != PHASE_TRAINING:
                continue
            now = time.monotonic()
            for m, d in list(s.in_flight.items()):
                task = self._edges[m].current
                if (task is None or task.dispatch is not d or task.pending is not None
                        or task.reply is not None):
                    continue
                if overdue(task.dispatched_at, task.deadline_s, now):
                    await self._lose(m, task, f"no answer within its {task.deadline_s:.1f} s "
                                              "deadline")

    async def _lose(self, m: int, task: "_Task | None", why: str) -> None:
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

            def work() -> list[_Task]:
                # the fault is recorded before the state changes, both under the lock: a
                # reader that sees the coalition unavailable also sees why
                with self.lock:
                    fault = len(self.faults)
                    self._fault("lost", m, f"coalition {m} unavailable: {why}"
                                + (f" (task {task.task_id})" if task is not None else ""))
                    s.mark_unavailable(m)
                    if task is not None:
                        task.expired = why
                    new = [self._make_task(d) for d in s.refill()]
                    if new:
                        self.faults[fault]["detail"] += (
                            f"; dispatched {[t.dispatch.coalition for t in new]}")
                    self._save_checkpoint()
                    return new

            new = await asyncio.to_thread(work)
            edge = self._edges[m]
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

            def work() -> list[_Task]:
                with self.lock:  # fault first, then the state change (see _lose)
                    self._fault("back", m, f"coalition {m} available again: {why}")
                    s.mark_available(m)
                    new = [self._make_task(d) for d in s.refill()]
                    self._save_checkpoint()
                    return new

            new = await asyncio.to_thread(work)
            log.info("coalition %d available again: %s", m, why)
            await self._publish(new)

    def _evaluate(self) -> tuple[float, float]:
        assert self.evaluator is not None and self.strategy is not None
        with self.lock:
            arrays = [np.array(a, copy=True) for a in self.strategy.global_arrays]
        acc, loss = self.evaluator(arrays)
        return float(acc), float(loss)

    # ================================================================== the end
    async def _finish(self) -> None:
        assert self._done is not None
        self.phase = PHASE_DONE
        if self.strategy is not None and self.records:
            with self.lock:
                measured = self.strategy.estimator.mean()
            self._check_reach(measured, "the measured latencies")

        def final_checkpoint() -> None:
            with self.lock:
                self._save_checkpoint()

        try:
            await asyncio.to_thread(final_checkpoint)
        except Exception:  # noqa: BLE001
            log.exception("writing the final checkpoint failed")
        try:
            self.result = await asyncio.to_thread(self._write_results)
        except Exception:  # noqa: BLE001
            log.exception("writing the results failed")
        self._done.set()
        await self._wake_edges()
        log.info("training over after %d rounds%s", len(self.records),
                 f"; results in {self.out_dir}" if self.out_dir else "")

    def summary(self) -> dict[str, Any]:
        """The run's result dict: the engine's summary keys where they apply."""
        strategy = self.strategy
        assert strategy is not None
        with self.lock:
            records = [dict(r) for r in self.records]
            part = strategy.participation.copy()
        share = part / max(1, part.sum())
        lat = np.array([r["latency_s"] for r in records])
        from cloud_server.reach import max_shares

        try:
            with self.lock:
                reach = max_shares(strategy.estimator.mean(), strategy.max_concurrent).tolist()
        except ValueError:
            reach = None
        accs = [r["accuracy"] for r in records if r["accuracy"] is not None]
        m = self.num_edges
        assert self.assignment is not None and self.initial_assignment is not None
        coalitions = [np.flatnonzero(self.assignment == e).tolist() for e in range(m)]
        by_id = sorted(self.clients.values(), key=lambda c: c.client_id or 0)
        jsd = self._jsd_pair
        return {
            "config": self.cfg.model_dump(mode="json", by_alias=True),
            "mode": "deployment",
            "complete": len(records) >= self.cfg.run.global_rounds,
            "dataset": self.cfg.data.dataset,
            "initial_accuracy": self.initial_accuracy,
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "rounds": len(records),
            "wall_seconds": records[-1]["time_s"] if records else 0.0,
            "energy_j": float(sum(r["energy_j"] for r in records)),
            "latency_cov": float(lat.std() / lat.mean()) if lat.size and lat.mean() > 0 else 0.0,
            "coalitions": coalitions,
            "initial_jsd": jsd[0] if jsd else None,
            "formed_jsd": jsd[1] if jsd else None,
            "formation": {
                "rule": self.cfg.method.formation,
                "initial_assignment": np.asarray(self.initial_assignment).tolist(),
                "assignment": np.asarray(self.assignment).tolist(),
                "moves": getattr(self.formation, "moves", None),
                "stable": getattr(self.formation, "stable", None),
            },
            "participation": {
                "rounds": part.tolist(),
                "share": share.tolist(),
                "delta": np.asarray(strategy.delta).tolist(),
                # upper bound on each coalition's share given K and the latency estimates
                "max_share": reach,
            },
            "warnings": list(self.warnings),
            "late_rounds": sum(1 for r in records if r.get("late")),
            "clients": [
                {"id": c.client_id, "name": c.name, "edge": c.edge_id, "home_edge": c.home_edge,
                 "device": c.profile.name, "samples": int(c.label_counts.sum())}
                for c in by_id
            ],
            "edges": {str(e.edge_id): e.address for e in self._edges.values()},
            "final_version": strategy.version,
            "faults": list(self.faults),
            "checkpoints": None if self.checkpoints is None else {
                "dir": str(self.checkpoints.dir), "writes": self.checkpoints.writes,
                "seconds": self.checkpoints.seconds},
            "records": records,
        }

    def _write_results(self) -> dict[str, Any]:
        result = self.summary()
        if self.out_dir is None:
            return result
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out / "result.json")
        with self.lock:
            blob = encode_arrays(self.strategy.global_arrays,  # type: ignore[union-attr]
                                 {"version": str(self.strategy.version),  # type: ignore[union-attr]
                                  "rounds": str(len(self.records))})
        (out / "final_model.safetensors").write_bytes(blob)
        if self.write_plots:
            from fedcure_app.run_plots import write_run_plots

            try:
                write_run_plots(result, out)  # wall-clock axes; title names both rules
            except Exception:  # noqa: BLE001 - plots are a convenience
                log.exception("writing the plots failed")
        return result

    # ================================================================== Monitor
    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> pb.StatusReply:
        """Health and progress, answered WITHOUT a token (healthchecks, ``fedcure-healthcheck``):
        phase, global version and round, the configured rounds, counts of registered clients
        and connected edges, the ids of the coalitions training now and where their tasks stand
        (edge round, ids of the clients still training, seconds, ETA). No names, addresses,
        models, metrics or tokens (see ``cloud_server.security``)."""
        from cloud_server.progress import live_task

        s = self.strategy
        return pb.StatusReply(
            phase=self.phase,
            version=s.version if s else 0,
            round=s.round if s else 0,
            global_rounds=self.cfg.run.global_rounds,
            clients_registered=len(self.clients),
            expected_clients=self.expected_clients,
            edges_connected=sum(e.connected.is_set() for e in self._edges.values()),
            num_edges=self.num_edges,
            in_flight=self._in_flight_view,
            progress=self.progress.snapshot(live_task(self)),
        )


def _decode_checked(blob: bytes | memoryview, reference: list[np.ndarray]) -> list[np.ndarray]:
    arrays = decode_arrays(blob)
    check_like(arrays, reference)
    return arrays


# ====================================================================== server
class AddressInUse(OSError):
    """The listen address cannot be bound."""


def add_servicers(server: grpc.aio.Server, service: CloudService) -> None:
    """Serve the three services; EdgeLink with the codec's fast wire path for models."""
    pb_grpc.add_AssociationServicer_to_server(service, server)
    from cloud_server.progress import progress_handler

    server.add_generic_rpc_handlers((edge_link_handler(service), progress_handler(service)))
    pb_grpc.add_MonitorServicer_to_server(service, server)


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:PORT`` for IPv6) split and checked; raises ``ValueError``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen expects HOST:PORT (e.g. 0.0.0.0:9090), got {listen!r}")
    return host, int(port)


def _bind(server: grpc.aio.Server, listen: str,
          credentials: grpc.ServerCredentials | None = None) -> int:
    parse_listen(listen)
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise AddressInUse(
            f"cannot listen on {listen}: the port is already in use or the address is not "
            "one of this host's")
    return port


async def serve(service: CloudService, listen: str, *,
                on_bound: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None, grace_s: float = 2.0,
                credentials: grpc.ServerCredentials | None = None,
                linger_s: float = 3.0,
                max_message_bytes: int | None = None) -> dict[str, Any] | None:
    """Run ``service`` on ``listen`` (host:port) until it is done or ``stop`` is set.

    ``credentials``: TLS server credentials (``cloud_server.security``); None serves plaintext.
    ``linger_s``: after a finished run, keep answering ``Monitor.Status`` (phase DONE) this long
    so that clients polling it learn that training is over (``stop`` cuts it short).
    ``max_message_bytes``: largest request accepted (RESOURCE_EXHAUSTED above; default the
    codec's limit).
    Returns the result dict (None when stopped before the end). Raises :class:`AddressInUse`.
    """
    options = list(GRPC_OPTIONS)
    if max_message_bytes is not None:
        if max_message_bytes < 1024:
            raise ValueError(f"max message size must be >= 1 KiB, got {max_message_bytes} B")
        options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
        options.append(("grpc.max_receive_message_length", int(max_message_bytes)))
    from cloud_server.guard import MalformedRequestGuard

    server = grpc.aio.server(options=options, interceptors=[MalformedRequestGuard()])
    add_servicers(server, service)
    port = _bind(server, listen, credentials)
    service.start()
    await server.start()
    if on_bound is not None:
        on_bound(port)
    waiters = [asyncio.ensure_future(service.wait_done())]
    if stop is not None:
        waiters.append(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if linger_s > 0 and service.phase == PHASE_DONE and not (stop and stop.is_set()):
            pending = [w for w in waiters if not w.done()]  # the stop event, if any
            if pending:
                await asyncio.wait(pending, timeout=linger_s)
            else:
                await asyncio.sleep(linger_s)
    finally:
        for w in waiters:
            w.cancel()
        await service.close()
        await server.stop(grace_s)
    return service.result


class CloudServer:
    """A :class:`CloudService` served from a background thread (tests, benchmarks, notebooks).

    ``start()`` returns the bound port; ``stop()`` shuts it down; ``join(timeout)`` waits for the
    run to end on its own.
    """

    def __init__(self, service: CloudService, listen: str = "127.0.0.1:0",
                 credentials: grpc.ServerCredentials | None = None,
                 max_message_bytes: int | None = None) -> None:
        self.service = service
        self.listen = listen
        self.credentials = credentials
        self.max_message_bytes = max_message_bytes
        self.port: int | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()

    @property
    def address(self) -> str:
        host = self.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> int:
        self._thread = threading.Thread(target=self._run, name="fedcure-cloud", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the cloud server did not start")
        if self.error is not None:
            raise self.error
        assert self.port is not None
        return self.port

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def bound(port: int) -> None:
                self.port = port
                self._ready.set()

            await serve(self.service, self.listen, on_bound=bound, stop=self._stop, grace_s=0.5,
                        credentials=self.credentials, linger_s=0.0,
                        max_message_bytes=self.max_message_bytes)

        try:
            asyncio.run(main())
        except BaseException as err:  # noqa: BLE001
            self.error = err
        finally:
            self._ready.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the server thread to end (the run finished or was stopped)."""
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's event loop and return its result (for inspection)."""
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(_as_coro(fn), self._loop)
        return fut.result(10)


async def _as_coro(fn: Callable[[], Any]) -> Any:
    return fn()
