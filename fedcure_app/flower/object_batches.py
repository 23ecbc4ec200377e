"""A message's content objects in one request per hop between a SuperNode and its SuperLink.

Flower 1.41 moves a message as a header plus content objects, and its SuperNode pulls and pushes
each object with a request of its own (``/v1/fleet/pull-object``, ``/v1/fleet/push-object``):
about six per message each way for a packed model. Every request costs the SuperLink its whole
HTTP stack (uvicorn, Starlette's middlewares, the protobuf translation, checking the node's
signature), 10 ms or more of CPU on a small machine, and an edge serves dozens of clients.

This module adds two Fleet routes to the edge's SuperLink, behind all of Flower's middlewares
(the node's signature is checked once for the batch):

- ``POST /v1/fleet/fedcure-pull-objects``: an :data:`ObjectBatch` of serialized
  ``PullObjectRequest`` s, answered by an :data:`ObjectBatchReply` of serialized
  ``PullObjectResponse`` s in the same order;
- ``POST /v1/fleet/fedcure-push-objects``: the same with ``PushObjectRequest`` /
  ``PushObjectResponse``.

Each inner request goes through Flower's own handler (``fleet_handlers.pull_object`` /
``push_object``, looked up at call time, so the held pulls' bookkeeping sees every object), and
must name the batch's node, the one whose signature was checked. A pull reply stops adding
contents past :data:`MAX_REPLY_BYTES` and answers the rest "not available yet", which the
SuperNode, as for any object not there yet, asks for again.

The SuperNode side (:func:`install_client`) changes no Flower logic: its Fleet client answers a
``PullObject`` for an object the SuperNode is pulling from one batch request for all of that
message's objects, and its pushes of a reply's objects are collected and sent in one batch. A
SuperLink without the routes (a stock one) answers 404: the client then says so once and goes
on one request per object, as Flower does. Only the pinned Flower range is patched.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, Callable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

log = logging.getLogger("fedcure.flower.object_batches")

PULL_PATH = "/v1/fleet/fedcure-pull-objects"
PUSH_PATH = "/v1/fleet/fedcure-push-objects"
#: contents one pull reply carries at most (bytes); the rest are answered "not available yet"
MAX_REPLY_BYTES = 64 * 2**20


def _wire_schema() -> tuple[type, type]:
    """``ObjectBatch {uint64 node_id = 1; repeated bytes requests = 2;}`` and
    ``ObjectBatchReply {repeated bytes replies = 1;}`` (package ``fedcure.batch``)."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="fedcure/object_batches.proto",
                                               package="fedcure.batch", syntax="proto3")
    batch = proto.message_type.add(name="ObjectBatch")
    batch.field.add(name="node_id", number=1, type=f.TYPE_UINT64, label=f.LABEL_OPTIONAL)
    batch.field.add(name="requests", number=2, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    reply = proto.message_type.add(name="ObjectBatchReply")
    reply.field.add(name="replies", number=1, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("fedcure.batch.ObjectBatch")),
            message_factory.GetMessageClass(
                pool.FindMessageTypeByName("fedcure.batch.ObjectBatchReply")))


ObjectBatch, ObjectBatchReply = _wire_schema()


# --------------------------------------------------------------------------- the SuperLink's side


class ForeignNode(ValueError):
    """An inner request names another node than the one that signed the batch."""


def _inner(batch: Any, request_type: type) -> list[Any]:
    requests = []
    for raw in batch.requests:
        request = request_type()
        request.ParseFromString(raw)
        if request.node.node_id != batch.node_id:
            raise ForeignNode(f"a batch of node {batch.node_id} names node "
                              f"{request.node.node_id}")
        requests.append(request)
    return requests


_first = threading.Event()


def _first_batch(node_id: int) -> None:
    if not _first.is_set():
        _first.set()
        log.info("object batches in use (the first from node %d)", node_id)


def pull_batch(batch: Any, state: Any, pull: Callable[..., Any],
               max_bytes: int = MAX_REPLY_BYTES) -> Any:
    """Answer each pull of ``batch`` with ``pull(request=, state=)`` (Flower's handler), in
    order; past ``max_bytes`` of contents the rest are answered "not available yet"."""
    from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse

    reply, size = ObjectBatchReply(), 0
    _first_batch(batch.node_id)
    for request in _inner(batch, PullObjectRequest):
        if size >= max_bytes:
            answer = PullObjectResponse(object_found=True, object_available=False)
        else:
            answer = pull(request=request, state=state)
            size += len(answer.object_content)
        reply.replies.append(answer.SerializeToString())
    return reply


def push_batch(batch: Any, state: Any, push: Callable[..., Any]) -> Any:
    """Store each push of ``batch`` with ``push(request=, state=)`` (Flower's handler), in
    order, and answer each."""
    from flwr.proto.message_pb2 import PushObjectRequest

    reply = ObjectBatchReply()
    for request in _inner(batch, PushObjectRequest):
        reply.replies.append(push(request=request, state=state).SerializeToString())
    return reply


def batch_router() -> Any:
    """The two routes, as a FastAPI router of Flower's protobuf routes."""
    from typing import Annotated

    from fastapi import APIRouter, Depends, HTTPException, status
    from flwr.superlink.dependencies.linkstate import get_linkstate
    from flwr.superlink.servicer.fleet import fleet_handlers
    from flwr.supercore.protobuf.routing import ProtobufRoute
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_DEPENDENCY

    router = APIRouter(route_class=ProtobufRoute)
    # real objects, not this module's postponed (string) annotations: FastAPI resolves a
    # route's annotations in the module's globals, where these names are not
    hints = {"request": Annotated[ObjectBatch, PROTOBUF_REQUEST_DEPENDENCY],
             "state": Annotated[Any, Depends(get_linkstate)], "return": ObjectBatchReply}

    def route(path: str, answer: Callable[..., Any], handler: str) -> None:
        def endpoint(request: Any, state: Any) -> Any:
            try:
                return answer(request, state, getattr(fleet_handlers, handler))
            except ForeignNode as err:
                raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED,
                                    detail=str(err)) from None

        endpoint.__name__ = endpoint.__qualname__ = "fedcure_" + handler + "s"
        endpoint.__annotations__ = dict(hints)
        router.post(path)(endpoint)

    route(PULL_PATH, pull_batch, "pull_object")
    route(PUSH_PATH, push_batch, "push_object")
    return router


def install_server() -> bool:
    """Make every SuperLink app built in this process (``flwr.superlink.main.create_app``)
    serve the two routes; False (logged) when Flower differs from what this was written for."""
    import flwr.superlink.main as main
    from flwr.supercore.protobuf import translation

    from fedcure_app.flower.object_pulls import version_problem

    problem = version_problem()
    create = getattr(main, "create_app", None)
    types = getattr(translation, "PROTOBUF_REQUEST_TYPES", None)
    if problem or not callable(create) or not isinstance(types, dict):
        log.warning("the SuperLink takes no object batches: %s",
                    problem or "Flower's app factory or request-type table is gone")
        return False
    types[("POST", PULL_PATH)] = ObjectBatch
    types[("POST", PUSH_PATH)] = ObjectBatch

    @functools.wraps(create)
    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = create(*args, **kwargs)
        app.include_router(batch_router())
        return app

    main.create_app = create_app
    return True


# --------------------------------------------------------------------------- the SuperNode's side


class Batcher:
    """What a SuperNode's Fleet client batches: the objects it is pulling now (:meth:`wanting`),
    the pulled contents not yet handed out, and the pushes a thread is collecting
    (:meth:`collecting`). ``send(client, path, requests)`` sends one batch and returns the
    replies' bytes; it raises on any failure, after which the objects go one by one."""

    def __init__(self, send: Callable[[Any, str, list[Any]], list[bytes]]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._wanted: list[str] = []
        self._ready: dict[str, bytes] = {}
        self._local = threading.local()
        self.enabled = True

    @contextlib.contextmanager
    def wanting(self, object_ids: Iterable[str]) -> Iterator[None]:
        """While the SuperNode pulls ``object_ids``: a pull of one of them fetches all."""
        ids = list(object_ids)
        with self._lock:
            self._wanted.extend(i for i in ids if i not in self._wanted)
        try:
            yield
        finally:
            with self._lock:
                gone = set(ids)
                self._wanted = [i for i in self._wanted if i not in gone]
                for i in gone:
                    self._ready.pop(i, None)

    def pulled(self, client: Any, request: Any) -> bytes | None:
        """The serialized ``PullObjectResponse`` for ``request`` from a batch, or None when
        it is not one of the wanted objects or batching is off (then pull it alone)."""
        from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse

        with self._lock:
            oid = request.object_id
            if oid not in self._ready:
                if not self.enabled or oid not in self._wanted:
                    return None
                ids = [i for i in self._wanted if i not in self._ready]
                inner = [PullObjectRequest(node=request.node, run_id=request.run_id,
                                           object_id=i) for i in ids]
                try:
                    replies = self._send(client, PULL_PATH, inner)
                except Exception as err:  # noqa: BLE001 - any failure: Flower's own path
                    self._failed(err)
                    return None
                self._ready.update(zip(ids, replies))
            raw = self._ready.pop(oid)
            reply = PullObjectResponse.FromString(raw)
            if reply.object_found and not reply.object_available:
                return raw  # asked for again after Flower's back-off: still wanted
            self._wanted.remove(oid)  # handed out (or not found): a later batch leaves it out
            return raw

    @contextlib.contextmanager
    def collecting(self) -> Iterator[list[tuple[Any, Any]]]:
        """While the calling thread pushes: its ``PushObject`` calls are collected here."""
        pushes: list[tuple[Any, Any]] = []
        self._local.pushes = pushes
        try:
            yield pushes
        finally:
            self._local.pushes = None

    def collect(self, client: Any, request: Any) -> bool:
        """Keep ``request`` for the calling thread's batch; False when it is not collecting."""
        pushes = getattr(self._local, "pushes", None)
        if pushes is None:
            return False
        pushes.append((client, request))
        return True

    def push(self, pushes: list[tuple[Any, Any]]) -> list[bytes] | None:
        """Send the collected pushes in one batch: the serialized ``PushObjectResponse`` s, or
        None when the batch failed (then push them alone)."""
        if not pushes:
            return []
        try:
            return self._send(pushes[0][0], PUSH_PATH, [r for _, r in pushes])
        except Exception as err:  # noqa: BLE001 - any failure: Flower's own path
            self._failed(err)
            return None

    def _failed(self, err: Exception) -> None:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (404, 405):
            if self.enabled:
                log.info("the SuperLink takes no object batches: one request per object")
            self.enabled = False
        else:
            log.debug("an object batch failed (%s): one request per object", err)


def send_batch(client: Any, path: str, requests: list[Any]) -> list[bytes]:
    """POST ``requests`` (protobuf messages of one node) as one :data:`ObjectBatch` through
    ``client`` (a Flower ``ProtobufClient``: its signing and version interceptors apply)."""
    batch = ObjectBatch(node_id=requests[0].node.node_id,
                        requests=[r.SerializeToString() for r in requests])
    reply = client._unary_unary(path=path, rpc_method=f"/fedcure.batch.Fleet{path}",
                                request=batch, response_type=ObjectBatchReply)
    if len(reply.replies) != len(requests):
        raise ValueError(f"{len(reply.replies)} replies to {len(requests)} requests")
    return list(reply.replies)


def batching_client(base: type, batcher: Batcher) -> type:
    """``base`` (Flower's ``FleetHttpClient``) whose object pulls and pushes go through
    ``batcher``."""
    from flwr.proto.message_pb2 import PullObjectResponse, PushObjectResponse

    class BatchingFleetClient(base):  # type: ignore[misc, valid-type]
        def PullObject(self, request: Any) -> Any:  # noqa: N802 - Flower's name
            raw = batcher.pulled(self, request)
            if raw is None:
                return super().PullObject(request)
            reply = PullObjectResponse()
            reply.ParseFromString(raw)
            return reply

        def PushObject(self, request: Any) -> Any:  # noqa: N802 - Flower's name
            if batcher.collect(self, request):
                return PushObjectResponse(stored=True)  # checked when the batch is sent
            return super().PushObject(request)

    BatchingFleetClient.__name__ = BatchingFleetClient.__qualname__ = f"Batching{base.__name__}"
    return BatchingFleetClient


def batched_pulls(pull_objects: Callable[..., Any], batcher: Batcher) -> Callable[..., Any]:
    """Flower's ``pull_objects`` with its objects wanted from one batch."""

    @functools.wraps(pull_objects)
    def pulls(object_ids: list[str], pull_object_fn: Callable[[str], bytes], **kwargs: Any) -> Any:
        with batcher.wanting(object_ids):
            return pull_objects(object_ids, pull_object_fn, **kwargs)

    return pulls


def batched_pushes(push_contents: Callable[..., Any], batcher: Batcher) -> Callable[..., Any]:
    """Flower's ``push_object_contents_from_iterable`` sending its objects in one batch (one
    by one through ``push_contents`` when the batch fails)."""
    from flwr.proto.message_pb2 import PushObjectResponse
    from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

    @functools.wraps(push_contents)
    def pushes(object_contents: Iterable[tuple[str, bytes]],
               push_object_fn: Callable[[str, bytes], None], **kwargs: Any) -> None:
        if not batcher.enabled:
            return push_contents(object_contents, push_object_fn, **kwargs)
        contents = list(object_contents)
        with batcher.collecting() as collected:
            for oid, content in contents:
                push_object_fn(oid, content)
        replies = batcher.push(collected)
        if replies is None:
            return push_contents(contents, push_object_fn, **kwargs)
        for (_, request), raw in zip(collected, replies):
            reply = PushObjectResponse()
            reply.ParseFromString(raw)
            if not reply.stored:
                raise ObjectPushError(request.object_id, request.run_id, request.session_id)
        return None

    return pushes


def install_client(start: ModuleType | None = None,
                   connection: ModuleType | None = None) -> Batcher | None:
    """Batch the object pulls and pushes of the SuperNode run in this process (Flower's
    ``start_client_internal`` and ``fleet_http_connection`` modules); None (logged) when
    Flower differs from what this was written for."""
    if start is None:
        from flwr.supernode import start_client_internal as start  # type: ignore[no-redef]
    if connection is None:
        from flwr.supernode import fleet_http_connection as connection  # type: ignore[no-redef]
    from fedcure_app.flower.object_pulls import version_problem

    missing = [name for mod, name in ((start, "pull_objects"),
                                      (start, "push_object_contents_from_iterable"),
                                      (connection, "FleetHttpClient"))
               if not hasattr(mod, name)]
    problem = version_problem() or (f"Flower has no {', '.join(missing)}" if missing else "")
    if problem:
        log.warning("object pulls and pushes go one by one: %s", problem)
        return None
    batcher = Batcher(send_batch)
    connection.FleetHttpClient = batching_client(connection.FleetHttpClient, batcher)
    start.pull_objects = batched_pulls(start.pull_objects, batcher)
    start.push_object_contents_from_iterable = batched_pushes(
        start.push_object_contents_from_iterable, batcher)
    return batcher


__all__ = ["Batcher", "MAX_REPLY_BYTES", "ObjectBatch", "ObjectBatchReply", "PULL_PATH",
           "PUSH_PATH", "batch_router", "batched_pulls", "batched_pushes", "batching_client",
           "install_client", "install_server", "pull_batch", "push_batch", "send_batch"]
