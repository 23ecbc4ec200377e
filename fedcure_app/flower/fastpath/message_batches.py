"""A Flower message in two requests between a SuperNode and the edge's SuperLink.

Per message, Flower 1.41's SuperNode asks its SuperLink five times, even with the object
batches of :mod:`fedcure_app.flower.fastpath.object_batches`: ``PullMessages`` (held at the edge's
SuperLink until a message comes), one batch of the message's objects,
``ConfirmMessageReceived``, and for the reply ``PushMessages`` and one batch of the reply's
objects. Each request costs the SuperNode an ECDSA signature and the SuperLink a signature check
and its whole HTTP stack. The edge's SuperLink (:mod:`fedcure_app.flower.fastpath.message_routes`)
takes two instead:

- ``POST /v1/fleet/fedcure-pull-message``: Flower's own ``PullMessagesRequest`` (so Flower's
  node authentication checks it unchanged), answered by a :data:`MessagePullReply`: the
  serialized ``PullMessagesResponse``, the contents of the message's objects (up to
  :data:`~fedcure_app.flower.fastpath.object_batches.MAX_REPLY_BYTES`; an object left out is pulled
  as before), and the ids of the messages the SuperLink confirmed received itself (those whose
  every object came along);
- ``POST /v1/fleet/fedcure-push-message``: a :data:`MessagePush` (the node's id, the serialized
  ``PushMessagesRequest`` and the ``PushObjectRequest`` s of every object of the reply),
  answered by a :data:`MessagePushReply` (the ``PushMessagesResponse`` and one
  ``PushObjectResponse`` per object carried, in order).

The edge ServerApp's pull of its clients' replies takes one request the same way
(``POST`` :data:`REPLIES_PATH` on the SuperLink's Runtime API: Flower's ``PullAppMessagesRequest``,
held as ``/v1/runtime/pull-messages`` is, answered by a :data:`MessagePullReply` whose
confirmed replies the ServerApp does not confirm again; :func:`install_grid`), where Flower
asks for each reply's objects and confirmation once more per reply.

This module is the SuperNode's side (:func:`install_client`), and changes no Flower logic. Its
Fleet client sends ``PullMessages`` to the pull route and keeps the contents that came along:
Flower's ``pull_objects`` then gets those without asking, and ``ConfirmMessageReceived`` for a
message the SuperLink confirmed is answered here. ``PushMessages`` is answered provisionally
(every object of the reply's tree to push, no session) and kept for the calling thread; the
object pushes Flower's ``_push_messages`` makes right after (through
``push_object_contents_from_iterable``) are collected, and the whole reply goes as one request.
Each object's real answer is checked as Flower's push checks it (``ObjectPushError`` when not
stored), and any failure of that request is raised from the push, which ``_push_messages`` logs
as Flower's own push failure: a reply is never dropped without a word. The request goes through
Flower's HTTP retry rules (transport errors and 502/503/504 retried, 403 = the run stopped).

A SuperLink without the routes answers the pull with 404: the client says so once (INFO) and
goes on as before (object batches, or Flower's own requests). Support is decided on the pull
(a message is always pulled before its reply is pushed), so a reply is only answered
provisionally once the pull route has worked. Logs go to ``fedcure.flower.object_batches``'s
child logger, which the entry points already show. Only the pinned Flower range is patched.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, Callable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from fedcure_app.flower.fastpath.gate import report_off, version_problem
from fedcure_app.flower.fastpath.object_batches import route_unserved

log = logging.getLogger("fedcure.flower.object_batches.messages")

PULL_MESSAGE_PATH = "/v1/fleet/fedcure-pull-message"
PUSH_MESSAGE_PATH = "/v1/fleet/fedcure-push-message"
#: the edge ServerApp's pull of replies with their objects (the SuperLink's Runtime API)
REPLIES_PATH = "/v1/runtime/fedcure-pull-replies"
#: what Flower's ``_push_messages`` must still do for a provisional push answer to be safe
PUSH_STEPS = ("send(message, object_tree, clientapp_runtime)",
              "push_object_contents_from_iterable(")


def _wire_schema() -> tuple[type, type, type]:
    """``MessagePullReply {bytes pull_response = 1; repeated string object_ids = 2;
    repeated bytes object_contents = 3; repeated string confirmed = 4;}``,
    ``MessagePush {uint64 node_id = 1; bytes push_request = 2; repeated bytes object_pushes =
    3;}`` and ``MessagePushReply {bytes push_response = 1; repeated bytes object_replies = 2;}``
    (package ``fedcure.batch``)."""
    f = descriptor_pb2.FieldDescriptorProto
    one, many = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    proto = descriptor_pb2.FileDescriptorProto(name="fedcure/message_batches.proto",
                                               package="fedcure.batch", syntax="proto3")
    fields = {
        "MessagePullReply": (("pull_response", f.TYPE_BYTES, one),
                             ("object_ids", f.TYPE_STRING, many),
                             ("object_contents", f.TYPE_BYTES, many),
                             ("confirmed", f.TYPE_STRING, many)),
        "MessagePush": (("node_id", f.TYPE_UINT64, one), ("push_request", f.TYPE_BYTES, one),
                        ("object_pushes", f.TYPE_BYTES, many)),
        "MessagePushReply": (("push_response", f.TYPE_BYTES, one),
                             ("object_replies", f.TYPE_BYTES, many)),
    }
    for name, spec in fields.items():
        message = proto.message_type.add(name=name)
        for number, (field, kind, label) in enumerate(spec, start=1):
            message.field.add(name=field, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"fedcure.batch.{n}"))
                 for n in fields)  # type: ignore[return-value]


MessagePullReply, MessagePush, MessagePushReply = _wire_schema()


def send_message(client: Any, path: str, request: Any, reply_type: type) -> Any:
    """POST ``request`` to ``path`` through ``client`` (a Flower ``ProtobufClient``: its signing
    and version interceptors apply) and parse the answer as ``reply_type``."""
    api, action = path.split("/")[2], path.rsplit("/", 1)[1].removeprefix("fedcure-")
    return client._unary_unary(path=path, rpc_method=f"/fedcure.batch.{api.title()}/{action}",
                               request=request, response_type=reply_type)


class MessageBatcher:
    """What the SuperNode's client keeps between Flower's calls: the contents and confirmations
    the last pull brought, the reply a thread is pushing and the object pushes it collects.
    (The edge ServerApp's client keeps the same for its pulls of replies,
    :func:`install_grid`: ``pull_path`` :data:`REPLIES_PATH`, ``pull_response`` Flower's
    ``PullAppMessagesResponse``.)

    ``enabled`` is None until the pull route answered (then True) or was not found (False).
    ``send(client, path, request, reply_type)`` sends one request and raises on any failure;
    ``invoke(fn)`` runs the push request (Flower's HTTP retry invoker; once by default)."""

    def __init__(self, send: Callable[[Any, str, Any, type], Any] = send_message,
                 invoke: Callable[[Callable[[], Any]], Any] | None = None, *,
                 pull_path: str = PULL_MESSAGE_PATH, pull_response: type | None = None) -> None:
        self._send = send
        self._invoke = invoke or (lambda fn: fn())
        self.pull_path = pull_path
        self._pull_response = pull_response
        self._lock = threading.Lock()
        self._ready: dict[str, bytes] = {}
        self._confirmed: set[str] = set()
        self._local = threading.local()
        self._used: set[str] = set()
        self.enabled: bool | None = None

    # ----------------------------------------------------------------------------- pulls

    def pull(self, client: Any, request: Any) -> Any:
        """Flower's ``PullMessagesResponse`` for ``request`` through the pull route, keeping
        what came along; None when the route is not served (then pull as Flower does)."""
        from flwr.proto.fleet_pb2 import PullMessagesResponse

        if self.enabled is False:
            return None
        try:
            reply = self._send(client, self.pull_path, request, MessagePullReply)
        except Exception as err:
            if route_unserved(err):
                self._not_served()
                return None
            raise  # as Flower's own pull fails (its retry invoker decides)
        if len(reply.object_ids) != len(reply.object_contents):
            raise ValueError(f"{len(reply.object_ids)} object ids for "
                             f"{len(reply.object_contents)} contents")
        self.enabled = True
        self._first("PullMessages, its objects and ConfirmMessageReceived", self.pull_path)
        with self._lock:
            self._ready = dict(zip(reply.object_ids, reply.object_contents))
            self._confirmed = set(reply.confirmed)
        return (self._pull_response or PullMessagesResponse).FromString(reply.pull_response)

    def take(self, object_ids: Iterable[str]) -> dict[str, bytes]:
        """The contents of ``object_ids`` the last pull brought, handed out once (the rest stay
        for the pull's other messages until the next pull; one the SuperNode has already is
        never asked for)."""
        with self._lock:
            return {oid: self._ready.pop(oid) for oid in object_ids if oid in self._ready}

    def confirmed(self, message_id: str) -> bool:
        """True (once) when the SuperLink confirmed ``message_id`` received itself."""
        with self._lock:
            if message_id in self._confirmed:
                self._confirmed.discard(message_id)
                return True
            return False

    # ----------------------------------------------------------------------------- pushes

    def provisional(self, client: Any, request: Any) -> Any:
        """A provisional ``PushMessagesResponse`` for ``request`` (every object of its trees to
        push, no session), the request kept for the calling thread's object pushes; None when
        the pull route is not known to work (then push as Flower does)."""
        from flwr.proto.fleet_pb2 import PushMessagesResponse
        from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

        if self.enabled is not True:
            return None
        if getattr(self._local, "pending", None) is not None:
            log.warning("a reply held for its objects was never sent; the next one replaces it")
        self._local.pending = (client, request)
        ids = list(dict.fromkeys(t.object_id for tree in request.message_object_trees
                                 for t in iterate_object_tree(tree)))
        return PushMessagesResponse(objects_to_push=ids, session_id="")

    def pending(self) -> tuple[Any, Any] | None:
        """The calling thread's provisionally answered ``(client, PushMessagesRequest)``, taken
        (None when there is none)."""
        pending = getattr(self._local, "pending", None)
        self._local.pending = None
        return pending

    @contextlib.contextmanager
    def collecting(self) -> Iterator[list[Any]]:
        """While the calling thread pushes a reply's objects: its ``PushObject`` s land here."""
        pushes: list[Any] = []
        self._local.pushes = pushes
        try:
            yield pushes
        finally:
            self._local.pushes = None

    def collect(self, request: Any) -> bool:
        """Keep ``request`` for the calling thread's reply; False when it is not collecting."""
        pushes = getattr(self._local, "pushes", None)
        if pushes is None:
            return False
        pushes.append(request)
        return True

    def push(self, client: Any, request: Any, objects: list[Any]) -> None:
        """Send ``request`` (a ``PushMessagesRequest``) and ``objects`` (its
        ``PushObjectRequest`` s) as one request; raise as Flower's push would when anything
        failed (``ObjectPushError`` for an object not stored)."""
        from flwr.proto.fleet_pb2 import PushMessagesResponse

        message = MessagePush(node_id=request.node.node_id,
                              push_request=request.SerializeToString(),
                              object_pushes=[o.SerializeToString() for o in objects])
        try:
            reply = self._invoke(lambda: self._send(client, PUSH_MESSAGE_PATH, message,
                                                    MessagePushReply))
        except Exception as err:
            if not route_unserved(err):
                raise  # _push_messages logs it: "Failed to send message"
            self._not_served()
            return self._push_alone(client, request, objects)
        if len(reply.object_replies) != len(objects):
            raise ValueError(f"{len(reply.object_replies)} answers to {len(objects)} objects")
        self._first("PushMessages and its objects", PUSH_MESSAGE_PATH)
        response = PushMessagesResponse.FromString(reply.push_response)
        self._check(request, objects, response, list(reply.object_replies))
        return None

    def _push_alone(self, client: Any, request: Any, objects: list[Any]) -> None:
        """The route is gone: the message, then each object the SuperLink asks for, as
        Flower pushes them (through the client's base class)."""
        response = client.fedcure_push_messages_alone(request)
        wanted = set(response.objects_to_push)
        sent = [o for o in objects if o.object_id in wanted]
        replies = []
        for obj in sent:
            obj.session_id = response.session_id
            replies.append(client.fedcure_push_object_alone(obj).SerializeToString())
        self._check(request, sent, response, replies)

    @staticmethod
    def _check(request: Any, objects: list[Any], response: Any, replies: list[bytes]) -> None:
        from flwr.proto.message_pb2 import PushObjectResponse
        from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

        for obj, raw in zip(objects, replies):
            if not PushObjectResponse.FromString(raw).stored:
                raise ObjectPushError(obj.object_id, obj.run_id, response.session_id)
        carried = {o.object_id for o in objects}
        missing = [oid for oid in response.objects_to_push if oid not in carried]
        if missing:  # the SuperLink waits for an object that was not sent: the reply is lost
            run_id = request.messages_list[0].metadata.run_id if request.messages_list else 0
            raise ObjectPushError(missing[0], run_id, response.session_id)

    # ----------------------------------------------------------------------------- state

    def _not_served(self) -> None:
        if self.enabled is not False:
            log.info("%s is not served: messages, their objects and confirmations go as before",
                     self.pull_path)
        self.enabled = False

    def _first(self, what: str, path: str) -> None:
        """Log the first use of each route in this process (what the launch tests look for)."""
        with self._lock:
            if path in self._used:
                return
            self._used.add(path)
        log.info("message batches in use: %s in one request (%s)", what, path)


def message_client(base: type, batcher: MessageBatcher) -> type:
    """``base`` (Flower's ``FleetHttpClient``, or a subclass of it) whose message pulls,
    confirmations and pushes go through ``batcher``."""
    from flwr.proto.message_pb2 import PushObjectResponse

    class MessageBatchingClient(reply_client(base, batcher)):  # type: ignore[misc]
        def PushMessages(self, request: Any) -> Any:  # noqa: N802 - Flower's name
            reply = batcher.provisional(self, request)
            return super().PushMessages(request) if reply is None else reply

        def PushObject(self, request: Any) -> Any:  # noqa: N802
            if batcher.collect(request):
                return PushObjectResponse(stored=True)  # checked when the reply is sent
            return super().PushObject(request)

        def fedcure_push_messages_alone(self, request: Any) -> Any:
            return super().PushMessages(request)

        def fedcure_push_object_alone(self, request: Any) -> Any:
            return super().PushObject(request)

    name = base.__name__.removeprefix("Batching")
    MessageBatchingClient.__name__ = MessageBatchingClient.__qualname__ = f"MessageBatching{name}"
    return MessageBatchingClient


def prefetched_pulls(pull_objects: Callable[..., Any],
                     batcher: MessageBatcher) -> Callable[..., Any]:
    """Flower's ``pull_objects``, given the contents the message's pull brought without
    asking; only the rest are pulled (through ``pull_objects``)."""

    @functools.wraps(pull_objects)
    def pulls(object_ids: list[str], pull_object_fn: Callable[[str], bytes],
              **kwargs: Any) -> dict[str, bytes]:
        got = batcher.take(object_ids)
        rest = [oid for oid in object_ids if oid not in got]
        if rest:
            got.update(pull_objects(rest, pull_object_fn, **kwargs))
        return got

    return pulls


def message_pushes(push_contents: Callable[..., Any],
                   batcher: MessageBatcher) -> Callable[..., Any]:
    """Flower's ``push_object_contents_from_iterable``: after a provisionally answered
    ``PushMessages`` of this thread, the objects go with that message in one request; else
    through ``push_contents``."""

    @functools.wraps(push_contents)
    def pushes(object_contents: Iterable[tuple[str, bytes]],
               push_object_fn: Callable[[str, bytes], None], **kwargs: Any) -> None:
        pending = batcher.pending()
        if pending is None:
            return push_contents(object_contents, push_object_fn, **kwargs)
        with batcher.collecting() as collected:
            for oid, content in object_contents:
                push_object_fn(oid, content)  # Flower's: builds the request, our client keeps it
        client, request = pending
        batcher.push(client, request, collected)
        return None

    return pushes


def reply_client(base: type, batcher: MessageBatcher) -> type:
    """``base`` (Flower's ``RuntimeHttpClient`` or ``FleetHttpClient``, or a subclass) whose
    pulls of messages and their confirmations go through ``batcher`` (the edge ServerApp's
    pulls of replies; :func:`message_client` adds a SuperNode's pushes)."""
    from flwr.proto.message_pb2 import ConfirmMessageReceivedResponse

    class ReplyBatchingClient(base):  # type: ignore[misc, valid-type]
        def PullMessages(self, request: Any) -> Any:  # noqa: N802 - Flower's name
            reply = batcher.pull(self, request)
            return super().PullMessages(request) if reply is None else reply

        def ConfirmMessageReceived(self, request: Any) -> Any:  # noqa: N802
            if batcher.confirmed(request.message_object_id):
                return ConfirmMessageReceivedResponse()  # the SuperLink confirmed it itself
            return super().ConfirmMessageReceived(request)

    name = base.__name__.removeprefix("Batching")
    ReplyBatchingClient.__name__ = ReplyBatchingClient.__qualname__ = f"ReplyBatching{name}"
    return ReplyBatchingClient


def install_grid(grid: Any, http_grid: ModuleType | None = None) -> MessageBatcher | None:
    """Have the edge ServerApp run in this process pull its clients' replies, their objects
    and confirmations in one request per pull (:data:`REPLIES_PATH` on its SuperLink; Flower's
    ``http_grid``: its ``pull_objects`` and Runtime API client, the grid's own client too if it
    is connected already), after :func:`fedcure_app.flower.fastpath.object_batches.install_grid`,
    whose batches stay the path for what the route leaves out; None (logged) when Flower differs."""
    if http_grid is None:
        from flwr.superlink.grid import http_grid  # type: ignore[no-redef]

    base = getattr(http_grid, "RuntimeHttpClient", None)
    problem = version_problem(patch="message_batches")
    for owner, names in ((http_grid, ("pull_objects", "RuntimeHttpClient")),
                         (base, ("PullMessages", "ConfirmMessageReceived", "_unary_unary"))):
        missing = [n for n in names if not callable(getattr(owner, n, None))]
        if missing and not problem:
            problem = f"{getattr(owner, '__name__', owner)} has no {', '.join(missing)}"
    if problem:
        report_off(log, "replies go as before (a pull, then objects and a confirmation per "
                   "reply): %s", problem)
        return None
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse

    batcher = MessageBatcher(pull_path=REPLIES_PATH, pull_response=PullAppMessagesResponse)
    http_grid.RuntimeHttpClient = reply_client(base, batcher)
    http_grid.pull_objects = prefetched_pulls(http_grid.pull_objects, batcher)
    client = getattr(grid, "_client", None)
    if isinstance(client, base):  # connected already: the same object, batching from now on
        client.__class__ = http_grid.RuntimeHttpClient
    return batcher


def check_flower(start: ModuleType, connection: ModuleType) -> list[str]:
    """Why the SuperNode's messages cannot go two requests each (empty when they can)."""

    outside = version_problem(patch="message_batches")
    problems = [] if outside is None else [outside]
    for module, name in ((start, "pull_objects"), (start, "push_object_contents_from_iterable"),
                         (start, "_push_messages"), (connection, "FleetHttpClient")):
        if not callable(getattr(module, name, None)):
            problems.append(f"{getattr(module, '__name__', module)} has no {name}")
    base = getattr(connection, "FleetHttpClient", None)
    for name in ("PullMessages", "PushMessages", "PushObject", "ConfirmMessageReceived",
                 "_unary_unary"):
        if base is not None and not callable(getattr(base, name, None)):
            problems.append(f"FleetHttpClient has no {name}")
    try:
        source = inspect.getsource(getattr(start, "_push_messages"))
    except (AttributeError, OSError, TypeError):
        source = None
    if source is not None and not all(step in source for step in PUSH_STEPS):
        problems.append("_push_messages no longer sends a reply and then pushes its objects")
    return problems


def install_client(start: ModuleType | None = None,
                   connection: ModuleType | None = None) -> MessageBatcher | None:
    """Have the SuperNode run in this process pull and push each message in one request
    (Flower's ``start_client_internal`` and ``fleet_http_connection`` modules; after
    :func:`fedcure_app.flower.fastpath.object_batches.install_client`, whose batches stay the path
    for what the routes leave out); None (logged) when Flower differs."""
    if start is None:
        from flwr.supernode import start_client_internal as start  # type: ignore[no-redef]
    if connection is None:
        from flwr.supernode import fleet_http_connection as connection  # type: ignore[no-redef]
    problems = check_flower(start, connection)
    if problems:
        report_off(log, "messages go as before (five requests each): %s", "; ".join(problems))
        return None
    from flwr.supercore.retry import make_simple_http_retry_invoker

    batcher = MessageBatcher(send_message, make_simple_http_retry_invoker().invoke)
    connection.FleetHttpClient = message_client(connection.FleetHttpClient, batcher)
    start.pull_objects = prefetched_pulls(start.pull_objects, batcher)
    start.push_object_contents_from_iterable = message_pushes(
        start.push_object_contents_from_iterable, batcher)
    return batcher


__all__ = ["MessageBatcher", "MessagePullReply", "MessagePush", "MessagePushReply",
           "PULL_MESSAGE_PATH", "PUSH_MESSAGE_PATH", "REPLIES_PATH", "check_flower",
           "install_client", "install_grid", "message_client", "message_pushes",
           "prefetched_pulls", "reply_client", "send_message"]
