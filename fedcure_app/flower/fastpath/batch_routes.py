"""The object-batch routes (:mod:`fedcure_app.flower.fastpath.object_batches`) on Flower's servers.

- the edge's SuperLink (Fleet API, a SuperNode's side): ``POST /v1/fleet/fedcure-pull-objects``
  and ``/v1/fleet/fedcure-push-objects``, behind all of Flower's middlewares, so the node's
  signature is checked once for the batch and every inner request must name that node;
- the Runtime API, on the edge's SuperLink (the edge ServerApp's side) and on a client's
  SuperNode (the executor's side): ``POST /v1/runtime/fedcure-pull-objects`` and
  ``/v1/runtime/fedcure-push-objects``, behind the task-token check Flower's own object routes
  have.

Each inner request goes through Flower's own handler (looked up at call time, so the held
pulls' and the reply wake-up's wrappers see every object). A pull reply stops adding contents
past :data:`~fedcure_app.flower.fastpath.object_batches.MAX_REPLY_BYTES` and answers the rest "not
available yet", which the puller, as for any object not there yet, asks for again.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable
from typing import Any, Callable

from fedcure_app.flower.fastpath.gate import report_off, version_problem
from fedcure_app.flower.fastpath.object_batches import (
    MAX_REPLY_BYTES,
    PULL_PATH,
    PUSH_PATH,
    RUNTIME_PULL_PATH,
    RUNTIME_PUSH_PATH,
    ObjectBatch,
    ObjectBatchReply,
)

log = logging.getLogger("fedcure.flower.object_batches")


class ForeignNode(ValueError):
    """An inner request names another node than the one that signed the batch."""


class BadBatch(ValueError):
    """An inner request is not the protobuf message its route takes."""


def parse_inner(raw: bytes, kind: type, what: str, node_id: int, carrier: str) -> Any:
    """``raw`` parsed as ``kind`` (:class:`BadBatch` naming ``what`` when it is not one), and
    naming node ``node_id``, the node that signed its ``carrier`` (:class:`ForeignNode`)."""
    from google.protobuf.message import DecodeError

    request = kind()
    try:
        request.ParseFromString(raw)
    except DecodeError:
        raise BadBatch(f"{what} is not a {kind.__name__}") from None
    if request.node.node_id != node_id:
        raise ForeignNode(f"{carrier} of node {node_id} names node {request.node.node_id}")
    return request


def _inner(batch: Any, request_type: type) -> list[Any]:
    return [parse_inner(raw, request_type, f"requests[{i}]", batch.node_id, "a batch")
            for i, raw in enumerate(batch.requests)]


_first: set[str] = set()
_first_lock = threading.Lock()


def log_first(key: str, logger: logging.Logger, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``key`` is used in this process (what the launch tests
    look for: the first use of each route)."""
    with _first_lock:
        if key in _first:
            return
        _first.add(key)
    logger.info(message, *args)


def _first_batch(api: str, node_id: int) -> None:
    """Log the first batch each API serves in this process."""
    log_first(f"object batches {api}", log, "object batches in use on the %s (the first from "
              "node %d)", api, node_id)


def pull_batch(batch: Any, pull: Callable[[Any], Any], max_bytes: int = MAX_REPLY_BYTES) -> Any:
    """Answer each pull of ``batch`` with ``pull(request)`` (Flower's handler), in order; past
    ``max_bytes`` of contents the rest are answered "not available yet"."""
    from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse

    reply, size = ObjectBatchReply(), 0
    for request in _inner(batch, PullObjectRequest):
        if size >= max_bytes:
            answer = PullObjectResponse(object_found=True, object_available=False)
        else:
            answer = pull(request)
            size += len(answer.object_content)
        reply.replies.append(answer.SerializeToString())
    return reply


def push_batch(batch: Any, push: Callable[[Any], Any]) -> Any:
    """Store each push of ``batch`` with ``push(request)`` (Flower's handler), in order, and
    answer each."""
    from flwr.proto.message_pb2 import PushObjectRequest

    reply = ObjectBatchReply()
    for request in _inner(batch, PushObjectRequest):
        reply.replies.append(push(request).SerializeToString())
    return reply


def _answer(batch: Any, kind: str, one: Callable[[Any], Any], api: str) -> Any:
    from fastapi import HTTPException, status

    _first_batch(api, batch.node_id)
    try:
        return pull_batch(batch, one) if kind == "pull" else push_batch(batch, one)
    except ForeignNode as err:
        raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail=str(err)) from None
    except BadBatch as err:
        raise HTTPException(status_code=status.HTTP_400_BAD_REQUEST, detail=str(err)) from None


def _route(router: Any, path: str, endpoint: Callable[..., Any], hints: dict[str, Any]) -> None:
    # named by path (/v1/fleet/fedcure-pull-objects: fedcure_fleet_pull_objects), one
    # operation id each; real objects, not this module's postponed (string) annotations:
    # FastAPI resolves a route's annotations in the module's globals, where these names are not
    api, action = path.split("/")[2], path.rsplit("/", 1)[1].removeprefix("fedcure-")
    endpoint.__name__ = endpoint.__qualname__ = f"fedcure_{api}_{action.replace('-', '_')}"
    endpoint.__annotations__ = dict(hints)
    router.post(path)(endpoint)


def batch_router() -> Any:
    """The SuperLink's two Fleet routes, as a FastAPI router of Flower's protobuf routes."""
    from typing import Annotated

    from fastapi import APIRouter, Depends
    from flwr.superlink.dependencies.linkstate import get_linkstate
    from flwr.superlink.servicer.fleet import fleet_handlers
    from flwr.supercore.protobuf.routing import ProtobufRoute
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_DEPENDENCY

    router = APIRouter(route_class=ProtobufRoute)
    hints = {"request": Annotated[ObjectBatch, PROTOBUF_REQUEST_DEPENDENCY],
             "state": Annotated[Any, Depends(get_linkstate)], "return": ObjectBatchReply}

    def pulls(request: Any, state: Any) -> Any:
        return _answer(request, "pull",
                       lambda r: fleet_handlers.pull_object(request=r, state=state), "Fleet API")

    def pushes(request: Any, state: Any) -> Any:
        return _answer(request, "push",
                       lambda r: fleet_handlers.push_object(request=r, state=state), "Fleet API")

    _route(router, PULL_PATH, pulls, hints)
    _route(router, PUSH_PATH, pushes, hints)
    return router


def runtime_batch_router() -> Any:
    """The two Runtime API routes, on a SuperNode (the executor's side) or on the SuperLink
    (the edge ServerApp's side); the task's token is checked once for the batch, as Flower's
    ``TaskDependency`` checks it for one object."""
    from typing import Annotated

    from fastapi import APIRouter
    from flwr.supercore.dependencies.runtime import (
        RuntimeHandlersDependency,
        RuntimeStateDependency,
        TaskDependency,
    )
    from flwr.supercore.protobuf.routing import ProtobufRoute
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_DEPENDENCY

    router = APIRouter(route_class=ProtobufRoute)
    hints = {"request": Annotated[ObjectBatch, PROTOBUF_REQUEST_DEPENDENCY],
             "state": RuntimeStateDependency, "handlers": RuntimeHandlersDependency,
             "task": TaskDependency, "return": ObjectBatchReply}

    def pulls(request: Any, state: Any, handlers: Any, task: Any) -> Any:
        return _answer(request, "pull", lambda r: handlers.pull_object(r, state, task),
                       "Runtime API")

    def pushes(request: Any, state: Any, handlers: Any, task: Any) -> Any:
        return _answer(request, "push", lambda r: handlers.push_object(r, state, task),
                       "Runtime API")

    _route(router, RUNTIME_PULL_PATH, pulls, hints)
    _route(router, RUNTIME_PUSH_PATH, pushes, hints)
    return router


def _routine(paths: list[str]) -> None:
    """Have Flower's access-log filter take the batch routes for routine requests, as it takes
    its own pulls and pushes: a successful one is logged at DEBUG only (else the edge's
    SuperLink logs three lines per client per edge round)."""
    from flwr.supercore import http_logging

    known = getattr(http_logging, "ROUTINE_ACCESS_PATHS", None)
    if isinstance(known, (set, frozenset)):
        http_logging.ROUTINE_ACCESS_PATHS = frozenset(known) | frozenset(paths)


def gather_objects(messages: Iterable[tuple[str, int, Any]], pull: Callable[[int, str], Any],
                   confirm: Callable[[int, str], None], max_bytes: int = MAX_REPLY_BYTES,
                   ) -> tuple[list[str], list[bytes], list[str]]:
    """What a pull route sends with the messages it pulled: for each ``(message_id, run_id,
    object tree)``, the contents of the tree's objects (``pull(run_id, object_id)``: Flower's
    ``PullObjectResponse``) while they add up to less than ``max_bytes``, and
    ``confirm(run_id, message_id)`` for each message whose every object came along. Returns the
    object ids, their contents and the confirmed message ids. An object not there yet, past the
    cap or whose pull fails is left out (the caller pulls it as Flower does, and confirms
    itself)."""
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

    ids: list[str] = []
    contents: list[bytes] = []
    confirmed: list[str] = []
    size = 0
    for message_id, run_id, tree in messages:
        whole = True
        for oid in dict.fromkeys(t.object_id for t in iterate_object_tree(tree)):
            if size >= max_bytes:
                whole = False
                break
            try:
                answer = pull(run_id, oid)
            except Exception as err:  # noqa: BLE001 - the caller's own pull meets it
                log.debug("objects from %s on left out of the pull: %s", oid, err)
                whole = False
                break
            if not (answer.object_found and answer.object_available):
                whole = False
                continue
            ids.append(oid)
            contents.append(answer.object_content)
            size += len(answer.object_content)
        if not whole:
            continue
        try:
            confirm(run_id, message_id)
        except Exception as err:  # noqa: BLE001 - the caller confirms itself then
            log.debug("message %s not confirmed here: %s", message_id, err)
            continue
        confirmed.append(message_id)
    return ids, contents, confirmed


def serve_routes(main: Any, types: dict[str, type], routers: list[Callable[[], Any]],
                 what: str, patch: str) -> bool:
    """Make every app ``main.create_app`` (Flower's SuperLink or SuperNode app factory) builds
    in this process serve each of ``routers()``, whose ``POST`` paths take the protobuf request
    ``types[path]``, their successful requests routine for Flower's access log; False (and a
    warning that ``what`` are not served) when Flower differs from what this was written for or
    the gate keeps the fast path's ``patch`` off."""
    from flwr.supercore.protobuf import translation

    problem = version_problem(patch=patch)
    create = getattr(main, "create_app", None)
    known = getattr(translation, "PROTOBUF_REQUEST_TYPES", None)
    if problem or not callable(create) or not isinstance(known, dict):
        report_off(log, "no %s are served: %s", what,
                   problem or "Flower's app factory or request-type table is gone")
        return False
    for path, kind in types.items():
        known[("POST", path)] = kind
    _routine(list(types))

    @functools.wraps(create)
    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = create(*args, **kwargs)
        for router in routers:
            app.include_router(router())
        return app

    main.create_app = create_app
    return True


def install_server(on: str = "superlink") -> bool:
    """Make every app built in this process serve the batch routes: ``on`` = "superlink" (the
    edge's: a SuperNode's Fleet routes and the edge ServerApp's Runtime API routes,
    ``flwr.superlink.main.create_app``) or "supernode" (a client's Runtime API, the executor's
    side, ``flwr.supernode.main.create_app``); False (logged) when Flower differs from what
    this was written for."""
    if on == "supernode":
        import flwr.supernode.main as main
    elif on == "superlink":
        import flwr.superlink.main as main  # type: ignore[no-redef]
    else:
        raise ValueError(f"on must be 'superlink' or 'supernode', got {on!r}")
    paths, routers = [RUNTIME_PULL_PATH, RUNTIME_PUSH_PATH], [runtime_batch_router]
    if on == "superlink":
        paths, routers = [*paths, PULL_PATH, PUSH_PATH], [*routers, batch_router]
    return serve_routes(main, dict.fromkeys(paths, ObjectBatch), routers, "object batches",
                        patch="object_batches")


__all__ = ["BadBatch", "ForeignNode", "batch_router", "gather_objects", "install_server",
           "log_first", "parse_inner", "pull_batch", "push_batch", "runtime_batch_router",
           "serve_routes"]
