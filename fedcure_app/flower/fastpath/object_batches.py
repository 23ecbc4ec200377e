"""A message's content objects in one request per hop: SuperNode <-> SuperLink, executor <->
SuperNode, edge ServerApp <-> SuperLink.

Flower 1.41 moves a message as a header plus content objects, and its SuperNode (with its
SuperLink) and its ClientApp side (with the SuperNode's Runtime API) pull and push each object
with a request of its own: about six per message each way for a packed model. Every request
costs the server its whole HTTP stack (uvicorn, Starlette's middlewares, the protobuf
translation, checking the node's signature or the task's token), 10 ms or more of CPU on a
small machine, and an edge serves dozens of clients.

The servers (:mod:`fedcure_app.flower.fastpath.batch_routes`) take a batch: an :data:`ObjectBatch`
of serialized ``PullObjectRequest`` s (or ``PushObjectRequest`` s), answered by an
:data:`ObjectBatchReply` of the serialized responses in the same order. This module is the
callers' side, and changes no Flower logic: their client answers a ``PullObject`` for an object
of the message being pulled from one batch request for all of that message's objects, and
collects the pushes of a reply's objects into one batch. A server without the routes (a stock
one) answers 404: the caller then says so once and goes on one request per object, as Flower
does. Only the pinned Flower range is patched.

- the SuperNode: :func:`install_client` (its Fleet client, ``pull_objects`` and
  ``push_object_contents_from_iterable`` of ``start_client_internal``);
- the executor: :func:`install_executor` (``pull_and_inflate_object_from_tree`` and
  ``push_objects`` of ``run_clientapp``) and :func:`batching_client` for its Runtime API
  client;
- the edge ServerApp: :func:`install_grid` (``pull_objects``, ``push_objects`` and the Runtime
  API client of ``http_grid``).
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

from fedcure_app.flower.fastpath.gate import report_off, version_problem

log = logging.getLogger("fedcure.flower.object_batches")

PULL_PATH = "/v1/fleet/fedcure-pull-objects"
PUSH_PATH = "/v1/fleet/fedcure-push-objects"
RUNTIME_PULL_PATH = "/v1/runtime/fedcure-pull-objects"
RUNTIME_PUSH_PATH = "/v1/runtime/fedcure-push-objects"
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
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"fedcure.batch.{n}"))
                 for n in ("ObjectBatch", "ObjectBatchReply"))  # type: ignore[return-value]


ObjectBatch, ObjectBatchReply = _wire_schema()


# --------------------------------------------------------------------------- the SuperNode's side


class Batcher:
    """What one process's client batches: the objects it is pulling now (:meth:`wanting`),
    the pulled contents not yet handed out, and the pushes a thread is collecting
    (:meth:`collecting`). ``send(client, path, requests)`` sends one batch and returns the
    replies' bytes; it raises on any failure, after which the objects go one by one."""

    def __init__(self, send: Callable[[Any, str, list[Any]], list[bytes]],
                 paths: tuple[str, str] = (PULL_PATH, PUSH_PATH)) -> None:
        self._send = send
        self.pull_path, self.push_path = paths
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

    def pulled(self, client: Any, request: Any) -> Any:
        """The ``PullObjectResponse`` for ``request`` from a batch, or None when it is not one
        of the wanted objects or batching is off (then pull it alone)."""
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
                    replies = self._send(client, self.pull_path, inner)
                except Exception as err:  # noqa: BLE001 - any failure: Flower's own path
                    self._failed(err)
                    return None
                self._ready.update(zip(ids, replies))
            reply = PullObjectResponse.FromString(self._ready.pop(oid))
            if not (reply.object_found and not reply.object_available):
                # handed out (or not found): a later batch leaves it out; one not there yet is
                # asked for again after Flower's back-off, so it stays wanted
                self._wanted.remove(oid)
            return reply

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
            return self._send(pushes[0][0], self.push_path, [r for _, r in pushes])
        except Exception as err:  # noqa: BLE001 - any failure: Flower's own path
            self._failed(err)
            return None

    def _failed(self, err: Exception) -> None:
        if route_unserved(err):
            if self.enabled:
                log.info("%s is not served: one request per object", self.pull_path)
            self.enabled = False
        else:
            log.debug("an object batch failed (%s): one request per object", err)


def route_unserved(err: BaseException) -> bool:
    """True when ``err`` is an HTTP answer saying the server has no such route (404, 405): a
    Flower server without FedCure's routes, whose client then goes Flower's own way."""
    return getattr(getattr(err, "response", None), "status_code", None) in (404, 405)


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
    """``base`` (Flower's ``FleetHttpClient`` or ``RuntimeHttpClient``) whose object pulls and
    pushes go through ``batcher``."""
    from flwr.proto.message_pb2 import PushObjectResponse

    class BatchingClient(base):  # type: ignore[misc, valid-type]
        def PullObject(self, request: Any) -> Any:  # noqa: N802 - Flower's name
            reply = batcher.pulled(self, request)
            return super().PullObject(request) if reply is None else reply

        def PushObject(self, request: Any) -> Any:  # noqa: N802 - Flower's name
            if batcher.collect(self, request):
                return PushObjectResponse(stored=True)  # checked when the batch is sent
            return super().PushObject(request)

    BatchingClient.__name__ = BatchingClient.__qualname__ = f"Batching{base.__name__}"
    return BatchingClient


def batched_pulls(pull_objects: Callable[..., Any], batcher: Batcher) -> Callable[..., Any]:
    """Flower's ``pull_objects`` with its objects wanted from one batch."""

    @functools.wraps(pull_objects)
    def pulls(object_ids: list[str], pull_object_fn: Callable[[str], bytes], **kwargs: Any) -> Any:
        with batcher.wanting(object_ids):
            return pull_objects(object_ids, pull_object_fn, **kwargs)

    return pulls


def _push_in_one(contents: list[tuple[str, bytes]], push_object_fn: Callable[[str, bytes], None],
                 batcher: Batcher) -> bool:
    """Push ``contents`` through ``push_object_fn`` collected into one batch: True when the
    batch carried them (an object not stored raises ``ObjectPushError``, as Flower's push
    does), False when it failed and they are still to be pushed one by one."""
    from flwr.proto.message_pb2 import PushObjectResponse
    from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

    with batcher.collecting() as collected:
        for oid, content in contents:
            push_object_fn(oid, content)
    replies = batcher.push(collected)
    if replies is None:
        return False
    for (_, request), raw in zip(collected, replies):
        if not PushObjectResponse.FromString(raw).stored:
            raise ObjectPushError(request.object_id, request.run_id, request.session_id)
    return True


def batched_pushes(push_contents: Callable[..., Any], batcher: Batcher) -> Callable[..., Any]:
    """Flower's ``push_object_contents_from_iterable`` sending its objects in one batch (one
    by one through ``push_contents`` when the batch fails)."""

    @functools.wraps(push_contents)
    def pushes(object_contents: Iterable[tuple[str, bytes]],
               push_object_fn: Callable[[str, bytes], None], **kwargs: Any) -> None:
        if not batcher.enabled:
            return push_contents(object_contents, push_object_fn, **kwargs)
        contents = list(object_contents)
        if not _push_in_one(contents, push_object_fn, batcher):
            push_contents(contents, push_object_fn, **kwargs)
        return None

    return pushes


def batched_object_pushes(push_objects: Callable[..., Any],
                          batcher: Batcher) -> Callable[..., Any]:
    """Flower's ``push_objects`` (a dict of objects, deflated here) sending them in one batch
    (through ``push_objects`` itself when the batch fails)."""

    @functools.wraps(push_objects)
    def pushes(objects: dict[str, Any], push_object_fn: Callable[[str, bytes], None], *,
               object_ids_to_push: set[str] | None = None, keep_objects: bool = False,
               **kwargs: Any) -> None:
        if batcher.enabled:
            ids = [oid for oid in objects if object_ids_to_push is None
                   or oid in object_ids_to_push]
            if _push_in_one([(oid, objects[oid].deflate()) for oid in ids], push_object_fn,
                            batcher):
                if not keep_objects:  # as Flower's push: pushed objects leave the dict
                    for oid in ids:
                        del objects[oid]
                return None
        return push_objects(objects, push_object_fn, object_ids_to_push=object_ids_to_push,
                            keep_objects=keep_objects, **kwargs)

    return pushes


def batched_tree_pulls(pull_tree: Callable[..., Any], batcher: Batcher) -> Callable[..., Any]:
    """Flower's ``pull_and_inflate_object_from_tree`` with the tree's objects wanted from one
    batch."""
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

    @functools.wraps(pull_tree)
    def pulls(object_tree: Any, *args: Any, **kwargs: Any) -> Any:
        with batcher.wanting(t.object_id for t in iterate_object_tree(object_tree)):
            return pull_tree(object_tree, *args, **kwargs)

    return pulls


def _patch_problem(what: str, needed: Iterable[tuple[ModuleType, str]]) -> bool:
    """True (and a warning that ``what`` go one by one) when Flower is outside the pinned
    range or a module lacks a name the patch replaces."""
    missing = [name for module, name in needed if not callable(getattr(module, name, None))]
    problem = version_problem(patch="object_batches") or (f"Flower has no {', '.join(missing)}" if missing else "")
    if problem:
        report_off(log, "%s go one by one: %s", what, problem)
    return bool(problem)


def install_executor(run_clientapp: ModuleType | None = None) -> Batcher | None:
    """Batch the object pulls and pushes of the ClientApp side run in this process (Flower's
    ``run_clientapp`` module's ``pull_task_input`` and ``push_message``); the caller builds its
    Runtime API client with :func:`batching_client` and the returned batcher. None (logged)
    when Flower differs from what this was written for."""
    if run_clientapp is None:
        from flwr.supernode.runtime import run_clientapp  # type: ignore[no-redef]
    if _patch_problem("the executor's object pulls and pushes",
                      ((run_clientapp, "pull_and_inflate_object_from_tree"),
                       (run_clientapp, "push_objects"))):
        return None
    batcher = Batcher(send_batch, (RUNTIME_PULL_PATH, RUNTIME_PUSH_PATH))
    run_clientapp.pull_and_inflate_object_from_tree = batched_tree_pulls(
        run_clientapp.pull_and_inflate_object_from_tree, batcher)
    run_clientapp.push_objects = batched_object_pushes(run_clientapp.push_objects, batcher)
    return batcher


def install_client(start: ModuleType | None = None,
                   connection: ModuleType | None = None) -> Batcher | None:
    """Batch the object pulls and pushes of the SuperNode run in this process (Flower's
    ``start_client_internal`` and ``fleet_http_connection`` modules); None (logged) when
    Flower differs from what this was written for."""
    if start is None:
        from flwr.supernode import start_client_internal as start  # type: ignore[no-redef]
    if connection is None:
        from flwr.supernode import fleet_http_connection as connection  # type: ignore[no-redef]
    if _patch_problem("the SuperNode's object pulls and pushes",
                      ((start, "pull_objects"), (start, "push_object_contents_from_iterable"),
                       (connection, "FleetHttpClient"))):
        return None
    batcher = Batcher(send_batch)
    connection.FleetHttpClient = batching_client(connection.FleetHttpClient, batcher)
    start.pull_objects = batched_pulls(start.pull_objects, batcher)
    start.push_object_contents_from_iterable = batched_pushes(
        start.push_object_contents_from_iterable, batcher)
    return batcher


def install_grid(grid: Any, http_grid: ModuleType | None = None) -> Batcher | None:
    """Batch the object pulls and pushes of the ServerApp run in this process through
    ``grid`` (Flower's ``HttpGrid``: its ``pull_objects`` and ``push_objects``, and its Runtime
    API client, built already or not); None (logged) when Flower differs."""
    if http_grid is None:
        from flwr.superlink.grid import http_grid  # type: ignore[no-redef]
    if _patch_problem("the ServerApp's object pulls and pushes",
                      ((http_grid, n) for n in ("pull_objects", "push_objects",
                                                "RuntimeHttpClient"))):
        return None
    batcher = Batcher(send_batch, (RUNTIME_PULL_PATH, RUNTIME_PUSH_PATH))
    base = http_grid.RuntimeHttpClient
    http_grid.RuntimeHttpClient = batching_client(base, batcher)
    http_grid.pull_objects = batched_pulls(http_grid.pull_objects, batcher)
    http_grid.push_objects = batched_object_pushes(http_grid.push_objects, batcher)
    client = getattr(grid, "_client", None)
    if isinstance(client, base):  # connected already: the same object, batching from now on
        client.__class__ = http_grid.RuntimeHttpClient
    return batcher


__all__ = ["Batcher", "MAX_REPLY_BYTES", "ObjectBatch", "ObjectBatchReply", "PULL_PATH",
           "PUSH_PATH", "RUNTIME_PULL_PATH", "RUNTIME_PUSH_PATH", "batched_object_pushes",
           "batched_pulls", "batched_pushes", "batched_tree_pulls", "batching_client",
           "install_client", "install_executor", "install_grid", "route_unserved", "send_batch"]
