"""The message routes (:mod:`fedcure_app.flower.fastpath.message_batches`) on the edge's SuperLink.

``POST /v1/fleet/fedcure-pull-message`` and ``/v1/fleet/fedcure-push-message``, behind all of
Flower's middlewares: the node's signature is checked once per request (the pull carries
Flower's own ``PullMessagesRequest``; the push names its node in ``node_id``, which Flower's
node authentication reads when a request has no ``node``), and every inner request must name
that node. Each step is Flower's own handler, looked up on ``fleet_handlers`` at call time, so
the held pull and the reply wake-up of :mod:`fedcure_app.flower.fastpath.held_pulls` apply: the pull
route holds like ``/v1/fleet/pull-messages`` (it waits in a worker thread: the SuperLink
names it ``threaded`` for :mod:`fedcure_app.flower.fastpath.buffered_middleware`), and every object
of a pushed reply goes through the counting ``push_object``, so the edge's held pull of replies
wakes once the reply's objects are in.

``POST /v1/runtime/fedcure-pull-replies`` (:func:`pull_replies`, behind the task's token) is the
edge ServerApp's pull of its clients' replies the same way: Flower's held Runtime pull, the
replies' objects and their confirmations in one answer (also ``threaded``).
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Callable

from fedcure_app.flower.fastpath.batch_routes import (
    BadBatch,
    ForeignNode,
    _route,
    gather_objects,
    log_first,
    parse_inner,
    serve_routes,
)
from fedcure_app.flower.fastpath.message_batches import (
    PULL_MESSAGE_PATH,
    PUSH_MESSAGE_PATH,
    REPLIES_PATH,
    MessagePullReply,
    MessagePush,
    MessagePushReply,
)
from fedcure_app.flower.fastpath.object_batches import MAX_REPLY_BYTES

log = logging.getLogger("fedcure.flower.object_batches.messages")


def _first_use(path: str, node_id: int) -> None:
    """Log the first request each route serves in this process."""
    log_first(path, log, "message batches in use: %s (the first from node %d)", path, node_id)


def _handlers(handlers: ModuleType | None) -> ModuleType:
    if handlers is not None:
        return handlers
    from flwr.superlink.servicer.fleet import fleet_handlers

    return fleet_handlers


def pull_message(request: Any, state: Any, handlers: ModuleType | None = None,
                 max_bytes: int = MAX_REPLY_BYTES) -> Any:
    """Flower's ``pull_messages`` for ``request`` (held where the SuperLink holds pulls), the
    contents of each pulled message's objects (past ``max_bytes`` of contents, or not
    available yet: left out, and pulled by the SuperNode as before), and Flower's
    ``confirm_message_received`` for each message whose every object came along.

    Confirming here loses nothing Flower would keep: its SuperLink marks a message delivered
    when it hands it to a pull (``state.get_message_ins``), so a pull reply lost on the way
    loses the message in stock Flower already (the edge's timeout covers it); what the
    confirmation adds is only that the message's objects are dropped from the SuperLink's
    store, and every one of them is in this reply."""
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, PullObjectRequest

    fleet = _handlers(handlers)
    store = getattr(state, "object_store", None)
    response = fleet.pull_messages(request=request, state=state, store=store)
    ids, contents, confirmed = gather_objects(
        ((m.metadata.message_id, m.metadata.run_id, tree)
         for m, tree in zip(response.messages_list, response.message_object_trees)),
        lambda run_id, oid: fleet.pull_object(request=PullObjectRequest(
            node=request.node, run_id=run_id, object_id=oid), state=state),
        lambda run_id, mid: fleet.confirm_message_received(
            request=ConfirmMessageReceivedRequest(node=request.node, run_id=run_id,
                                                  message_object_id=mid),
            state=state, store=store),
        max_bytes)
    return MessagePullReply(pull_response=response.SerializeToString(), object_ids=ids,
                            object_contents=contents, confirmed=confirmed)


def _parse(raw: bytes, kind: type, what: str, node_id: int) -> Any:
    return parse_inner(raw, kind, what, node_id, "a message push")


def push_message(request: Any, state: Any, handlers: ModuleType | None = None) -> Any:
    """Flower's ``push_messages`` for the carried ``PushMessagesRequest``, then its
    ``push_object`` for each carried object the SuperLink asked for (in the push's session);
    one ``PushObjectResponse`` per carried object, in order (one not asked for: stored)."""
    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.message_pb2 import PushObjectRequest, PushObjectResponse

    push = _parse(request.push_request, PushMessagesRequest, "push_request", request.node_id)
    objects = [_parse(raw, PushObjectRequest, f"object_pushes[{i}]", request.node_id)
               for i, raw in enumerate(request.object_pushes)]
    fleet = _handlers(handlers)
    response = fleet.push_messages(request=push, state=state)
    wanted = set(response.objects_to_push)
    reply = MessagePushReply(push_response=response.SerializeToString())
    for obj in objects:
        if obj.object_id in wanted:
            obj.session_id = response.session_id
            answer = fleet.push_object(request=obj, state=state)
        else:
            answer = PushObjectResponse(stored=True)  # the SuperLink has it
        reply.object_replies.append(answer.SerializeToString())
    return reply


def _answer(path: str, node_id: int, serve: Callable[[], Any]) -> Any:
    from fastapi import HTTPException, status

    _first_use(path, node_id)
    try:
        return serve()
    except ForeignNode as err:
        raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail=str(err)) from None
    except BadBatch as err:
        raise HTTPException(status_code=status.HTTP_400_BAD_REQUEST, detail=str(err)) from None


def message_router() -> Any:
    """The SuperLink's two message routes, as a FastAPI router of Flower's protobuf routes."""
    from typing import Annotated

    from fastapi import APIRouter, Depends
    from flwr.proto.fleet_pb2 import PullMessagesRequest
    from flwr.superlink.dependencies.linkstate import get_linkstate
    from flwr.supercore.protobuf.routing import ProtobufRoute
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_DEPENDENCY

    router = APIRouter(route_class=ProtobufRoute)
    state_hint = Annotated[Any, Depends(get_linkstate)]

    def pulls(request: Any, state: Any) -> Any:
        return _answer(PULL_MESSAGE_PATH, request.node.node_id,
                       lambda: pull_message(request, state))

    def pushes(request: Any, state: Any) -> Any:
        return _answer(PUSH_MESSAGE_PATH, request.node_id, lambda: push_message(request, state))

    _route(router, PULL_MESSAGE_PATH, pulls,
           {"request": Annotated[PullMessagesRequest, PROTOBUF_REQUEST_DEPENDENCY],
            "state": state_hint, "return": MessagePullReply})
    _route(router, PUSH_MESSAGE_PATH, pushes,
           {"request": Annotated[MessagePush, PROTOBUF_REQUEST_DEPENDENCY],
            "state": state_hint, "return": MessagePushReply})
    return router


def pull_replies(request: Any, state: Any, handlers: Any, task: Any,
                 max_bytes: int = MAX_REPLY_BYTES) -> Any:
    """The edge ServerApp's pull of replies: Flower's Runtime ``pull_messages`` (held where the
    SuperLink holds pulls), the contents of each reply's objects and the confirmation of each
    reply whose every object came along, as :func:`pull_message` does for a SuperNode. Flower's
    SuperLink deletes a reply from its state when a pull hands it out, so here too a lost
    answer loses nothing Flower would have kept."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, PullObjectRequest
    from flwr.proto.node_pb2 import Node

    response = handlers.pull_messages(request, state, task)
    node = Node(node_id=SUPERLINK_NODE_ID)
    ids, contents, confirmed = gather_objects(
        ((m.metadata.message_id, task.run_id, tree)
         for m, tree in zip(response.messages_list, response.message_object_trees)),
        lambda run_id, oid: handlers.pull_object(
            PullObjectRequest(node=node, run_id=run_id, object_id=oid), state, task),
        lambda run_id, mid: handlers.confirm_message_received(ConfirmMessageReceivedRequest(
            node=node, run_id=run_id, message_object_id=mid), state, task),
        max_bytes)
    return MessagePullReply(pull_response=response.SerializeToString(), object_ids=ids,
                            object_contents=contents, confirmed=confirmed)


def _serve_replies(request: Any, state: Any, handlers: Any, task: Any) -> Any:
    from flwr.common.constant import SUPERLINK_NODE_ID

    _first_use(REPLIES_PATH, SUPERLINK_NODE_ID)  # the edge ServerApp's node
    return pull_replies(request, state, handlers, task)


def replies_router() -> Any:
    """The SuperLink's Runtime API route of :func:`pull_replies` (behind the task's token)."""
    from typing import Annotated

    from fastapi import APIRouter
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.dependencies.runtime import (
        RuntimeHandlersDependency,
        RuntimeStateDependency,
        TaskDependency,
    )
    from flwr.supercore.protobuf.routing import ProtobufRoute
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_DEPENDENCY

    router = APIRouter(route_class=ProtobufRoute)

    def pulls(request: Any, state: Any, handlers: Any, task: Any) -> Any:
        return _serve_replies(request, state, handlers, task)

    _route(router, REPLIES_PATH, pulls,
           {"request": Annotated[PullAppMessagesRequest, PROTOBUF_REQUEST_DEPENDENCY],
            "state": RuntimeStateDependency, "handlers": RuntimeHandlersDependency,
            "task": TaskDependency, "return": MessagePullReply})
    return router


def fast_routes() -> dict[str, Any]:
    """The three routes for :class:`~fedcure_app.flower.fastpath.fast_routes.FastRoutes`: Flower's
    own checks (the node's signature, the task's token) and handlers, without its HTTP stack."""
    from flwr.proto.fleet_pb2 import PullMessagesRequest
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.constant import TASK_TOKEN_HEADER
    from flwr.supercore.dependencies.runtime import get_runtime_handlers, get_runtime_state
    from flwr.supercore.dependencies.task import authenticate_task
    from flwr.superlink.dependencies.linkstate import get_linkstate
    from flwr.superlink.routers.fleet.node_auth import authenticate_node

    from fedcure_app.flower.fastpath.fast_routes import Route

    def pull(request: Any, message: Any) -> Any:
        authenticate_node(request)
        return _answer(PULL_MESSAGE_PATH, message.node.node_id,
                       lambda: pull_message(message, get_linkstate(request)))

    def push(request: Any, message: Any) -> Any:
        authenticate_node(request)
        return _answer(PUSH_MESSAGE_PATH, message.node_id,
                       lambda: push_message(message, get_linkstate(request)))

    def replies(request: Any, message: Any) -> Any:
        state = get_runtime_state(request)
        task = authenticate_task(request, request.headers.get(TASK_TOKEN_HEADER), state)
        return _serve_replies(message, state, get_runtime_handlers(request), task)

    return {PULL_MESSAGE_PATH: Route(PullMessagesRequest, pull, threaded=True),
            PUSH_MESSAGE_PATH: Route(MessagePush, push),
            REPLIES_PATH: Route(PullAppMessagesRequest, replies, threaded=True)}


def install_server() -> bool:
    """Make every SuperLink app built in this process (``flwr.superlink.main.create_app``)
    serve the message routes; False (logged) when Flower differs from what this was written
    for."""
    import flwr.superlink.main as main
    from flwr.proto.fleet_pb2 import PullMessagesRequest
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest

    from fedcure_app.flower.fastpath import fast_routes as fast

    return serve_routes(main, {PULL_MESSAGE_PATH: PullMessagesRequest,
                               PUSH_MESSAGE_PATH: MessagePush,
                               REPLIES_PATH: PullAppMessagesRequest},
                        [message_router, replies_router], "message batches",
                        patch="message_batches") and fast.install(
        main, fast_routes, "message batches")


__all__ = ["fast_routes", "install_server", "message_router", "pull_message", "pull_replies",
           "push_message", "replies_router"]
