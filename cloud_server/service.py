"""The cloud server's gRPC face (``fedcure_app/protocol/cloud.proto``): :class:`CloudService`,
thin handlers over a :class:`cloud_server.controller.CloudController` and the
:class:`cloud_server.runloop.RunLoop` that drives it on the event loop.

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

``EdgeLink.Connect`` / ``EdgeLink.Submit`` / ``EdgeLink.Members`` / ``EdgeLink.Progress``
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
    folder and ends every edge stream with status OK. Progress carries where a task stands
    (``cloud_server.progress``).

``EdgeLink.Evaluated``
    When the cloud evaluates the global model on the clients' held-out parts (federated
    evaluation, ``cloud_server.fedeval``: the clients train on their own data and the cloud has
    no test set), it streams evaluation tasks (``Task.evaluate``) at formation, every
    ``eval_every`` rounds and after the last; an ES answers one with its clients' sums. The
    result is the sample-weighted accuracy and loss over the clients that answered, kept on the
    round's record. FAILED_PRECONDITION on a cloud that evaluates centrally, NOT_FOUND for an
    unknown evaluation task, INVALID_ARGUMENT for another edge's task, another version, a client
    outside the coalition or inconsistent sums; ``accepted`` is False once the results are
    being written.

``Monitor.Status``
    Phase, version, round, registered clients, connected edges, coalitions in flight and where
    their tasks stand: the controller's :class:`~cloud_server.state.StatusSnapshot`, read
    without its lock.

Concurrency: the gRPC server is ``grpc.aio``; the run loop's bookkeeping runs on its event loop,
so thousands of Register calls can wait at once without a thread each. CPU work (model
decoding, formation, aggregation, evaluation, writing results) runs in worker threads; every
strategy transition holds the controller's ``lock`` (a ``threading.Lock``), and arrivals are
processed one at a time (an ``asyncio.Lock`` around aggregate → dispatch → evaluate). Each
handler parses and checks its request (the token and edge identity here, the fields at the
door), calls the controller or the run loop, and answers a
:class:`~cloud_server.refusal.Refusal` with the gRPC status code of the same name. Serving
(start-up, bind): ``cloud_server.server``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import WithModel, unwrap
from cloud_server import validation as door
from cloud_server.controller import CloudController, Evaluator
from cloud_server.edge_streams import EdgeStreams
from cloud_server.errors import CloudError
from cloud_server.identity import EdgeCredentials
from cloud_server.refusal import Reason, Refusal
from cloud_server.runloop import RunLoop
from cloud_server.security import token_ok

#: a unary handler method: ``(self, request, context) -> reply``
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


async def abort(context: grpc.aio.ServicerContext, err: CloudError | Refusal) -> None:
    """End the call with the status code of ``err`` (raises, as ``context.abort`` does)."""
    if isinstance(err, Refusal):
        err = CloudError.of(err)
    await context.abort(err.code, err.message)


def answers_refusals(handler: Handler) -> Handler:
    """A unary handler whose :class:`Refusal` or :class:`CloudError` ends the call with that
    status code."""

    @functools.wraps(handler)
    async def run(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except (CloudError, Refusal) as err:
            await abort(context, err)
            raise  # unreachable: abort raises

    return run


class CloudService:
    """The cloud's RPC handlers (Association, EdgeLink, Monitor; see the module docstring).

    It holds the run's :class:`CloudController` (``controller``, made from the parameters
    below) and the :class:`RunLoop` driving it (``run``).

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
    federated_evaluation:
        Evaluate on the clients' held-out parts (None: with ``cfg.task`` and no evaluator).
    final_eval_wait_s:
        How long the end of a federated-evaluation run waits for the final model's evaluation.
    """

    def __init__(self, cfg: FedCureConfig, *, expected_clients: int,
                 out_dir: str | Path | None = None, register_timeout_s: float = 300.0,
                 token: str = "", initial_arrays: list[np.ndarray] | None = None,
                 evaluator: Evaluator | None = None, write_plots: bool = True,
                 checkpoint_dir: str | Path | None = None, resume: bool = False,
                 edge_credentials: EdgeCredentials | None = None,
                 federated_evaluation: bool | None = None,
                 final_eval_wait_s: float = 60.0) -> None:
        self.controller = CloudController(
            cfg, expected_clients=expected_clients, out_dir=out_dir,
            initial_arrays=initial_arrays, evaluator=evaluator, write_plots=write_plots,
            checkpoint_dir=checkpoint_dir, federated_evaluation=federated_evaluation)
        self.run = RunLoop(self.controller, register_timeout_s=register_timeout_s,
                           resume=resume, final_eval_wait_s=final_eval_wait_s)
        self.token = token
        self.edge_credentials = edge_credentials or EdgeCredentials()

    # ================================================================== lifecycle
    def start(self) -> None:
        """Start the run on the running event loop (resuming a checkpoint when asked)."""
        self.run.start()

    async def wait_done(self) -> None:
        """Return once the run is over (results written) or the cloud is closing."""
        await self.run.wait_done()

    async def close(self) -> None:
        """End every edge stream and waiting Register call (the server is going away)."""
        await self.run.close()

    @property
    def done(self) -> bool:
        """The run is over (results written) or the server is closing."""
        return self.run.done

    @property
    def edges(self) -> EdgeStreams:
        """Each edge's connection and current task (the run loop's)."""
        return self.run.edges

    @property
    def resumed(self) -> bool:
        """The run was restored from a checkpoint at start."""
        return self.run.resumed

    # ================================================================== checks
    def _check_token(self, token: str) -> None:
        if not token_ok(self.token, token):
            raise CloudError(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing token")

    def _check_edge(self, token: str, edge_id: int, context: Any) -> int:
        """The caller may act as edge ``edge_id`` (its credential, ``cloud_server.identity``);
        returns the checked edge index."""
        self.edge_credentials.check(int(edge_id), token, context,
                                    shared_ok=token_ok(self.token, token))
        m = int(edge_id)
        if not 0 <= m < self.controller.num_edges:
            raise CloudError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"edge_id {m} outside [0, {self.controller.num_edges})")
        return m

    # ================================================================== Association
    @answers_refusals
    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
                       ) -> pb.RegisterReply:
        """A client joins: answered with its ids and its ES's address once formation ran and
        that ES connected (see the module docstring)."""
        self._check_token(request.token)
        try:
            entry = self.controller.registry.validate(request)
        except Refusal:
            self.run.registration.maybe_form()  # a refused client is no longer awaited
            raise
        client, address = await self.run.register(entry, context.time_remaining())
        return pb.RegisterReply(
            client_id=client.client_id, edge_id=client.edge_id, edge_address=address,
            num_clients=len(self.controller.clients), num_edges=self.controller.num_edges)

    @answers_refusals
    async def Claim(self, request: pb.ClaimRequest, context: grpc.aio.ServicerContext
                    ) -> pb.ClaimReply:
        """A client's stable partition index, the partition count and the configuration."""
        self._check_token(request.token)
        index = self.controller.registry.claim(
            request.client_name,
            request.partition_id if request.HasField("partition_id") else None)
        cfg = self.controller.cfg
        return pb.ClaimReply(partition_id=index, num_partitions=cfg.federation.num_clients,
                             config_json=cfg.model_dump_json(by_alias=True))

    @answers_refusals
    async def Withdraw(self, request: pb.WithdrawRequest, context: grpc.aio.ServicerContext
                       ) -> pb.WithdrawReply:
        """A client that claimed a place cannot take part (its data or model was refused):
        logged with its reason; formation no longer waits for it."""
        self._check_token(request.token)
        awaited = self.run.registration.withdraw(request.client_name, request.reason)
        return pb.WithdrawReply(expected_clients=awaited)

    # ================================================================== EdgeLink
    @answers_refusals
    async def Members(self, request: pb.MembersRequest, context: grpc.aio.ServicerContext
                      ) -> pb.MembersReply:
        """The clients of ES ``edge_id`` with their SuperNode keys (none before formation)."""
        m = self._check_edge(request.token, request.edge_id, context)
        return pb.MembersReply(members=[
            pb.Member(client_id=c.client_id, client_name=c.name,
                      supernode_public_key=c.supernode_key)
            for c in self.controller.registry.members(m)])

    async def Connect(self, request: pb.ConnectRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[WithModel]:
        """ES ``edge_id`` connects with its fleet address: a stream of its coalition's tasks
        (its unanswered task again after a reconnection; a newer Connect ends this one)."""
        try:
            m = self._check_edge(request.token, request.edge_id, context)
            try:
                address = door.check_address(request.address)
            except door.Refused as err:
                raise Refusal(Reason.INVALID_ARGUMENT, f"edge {m}: {err}") from None
            stream = await self.run.connect(m, address)
        except (CloudError, Refusal) as err:
            await abort(context, err)
            return
        try:
            while (task := await self.run.next_task(stream)) is not None:
                yield task.message
        except Refusal as err:
            await abort(context, err)
        finally:
            self.run.disconnect(stream)

    @answers_refusals
    async def Submit(self, request: pb.SubmitRequest | WithModel,
                     context: grpc.aio.ServicerContext) -> pb.SubmitReply:
        """An ES's answer to a task: checked, then aggregated once (see :meth:`submit`)."""
        return await self.submit(request, context)

    async def submit(self, request: pb.SubmitRequest | WithModel, context: Any = None
                     ) -> pb.SubmitReply:
        """Check and apply one Submit (the model beside the message, ``WithModel``); a duplicate
        of an answered task gets the same reply. Raises :class:`Refusal`/:class:`CloudError`."""
        received = time.monotonic()
        tally = self.controller.tally
        try:
            req, model = unwrap(request)
            self._check_edge(req.token, req.edge_id, context)
            reply = await self.run.submit(req, model, received)
        except Refusal as err:
            tally.refused(err.reason.name)
            raise
        except CloudError as err:
            tally.refused(err.code.name)
            raise
        if not reply.accepted:
            tally.refused("NOT_AGGREGATED")  # training was over when it came
        return reply

    @answers_refusals
    async def Progress(self, request: pb.ProgressRequest, context: grpc.aio.ServicerContext
                       ) -> pb.ProgressReply:
        """Where an ES's task stands (``cloud_server.progress``); ``expected`` is False once
        the task is answered, expired or the run is over."""
        m = self._check_edge(request.token, request.edge_id, context)
        expected = self.controller.report_progress(
            m, request.task_id, request.edge_round, request.tau_e,
            request.training_client_ids, request.elapsed_s)
        return pb.ProgressReply(expected=expected)

    @answers_refusals
    async def Evaluated(self, request: pb.EvaluatedRequest, context: grpc.aio.ServicerContext
                        ) -> pb.EvaluatedReply:
        """An ES's answer to an evaluation task (federated evaluation; see the module
        docstring)."""
        m = self._check_edge(request.token, request.edge_id, context)
        return pb.EvaluatedReply(accepted=await self.run.evaluated(m, request))

    # ================================================================== Monitor
    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> pb.StatusReply:
        """Health and progress, answered WITHOUT a token (healthchecks, ``fedcure-healthcheck``):
        phase, global version and round, the configured rounds, counts of registered clients
        and connected edges, the ids of the coalitions training now and where their tasks stand
        (edge round, ids of the clients still training, seconds, ETA). No names, addresses,
        models, metrics or tokens (see ``cloud_server.security``)."""
        return self.controller.status().to_proto()


__all__ = ["CloudService", "abort", "answers_refusals"]
