"""A Flower message in two requests between a SuperNode and the edge's SuperLink
(fedcure_app/flower/fastpath/message_batches.py, message_routes.py): the SuperLink's message routes,
and the SuperNode's client driven by Flower's own pull and push steps."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import types

import httpx
import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, Metadata, RecordDict
from flwr.app.message import remove_content_from_message
from flwr.common.serde import message_to_proto
from flwr.proto.fleet_pb2 import (PullMessagesRequest, PullMessagesResponse, PushMessagesRequest,
                                  PushMessagesResponse)
from flwr.proto.message_pb2 import (ConfirmMessageReceivedResponse, PullObjectResponse,
                                    PushObjectRequest, PushObjectResponse)
from flwr.proto.node_pb2 import Node
from flwr.supercore.inflatable.inflatable_object import (get_all_nested_objects, get_object_tree,
                                                         iterate_object_tree)
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

from fedcure_app.flower.fastpath import batch_routes
from fedcure_app.flower.fastpath import message_batches as mb
from fedcure_app.flower.fastpath import message_routes as routes
from fedcure_app.flower.fastpath import object_batches as ob

NODE = 9
#: Flower's Fleet handlers the message routes call
HANDLERS = ("pull_messages", "pull_object", "confirm_message_received", "push_messages",
            "push_object")


def _message(size: int = 3, reply_to: str = "") -> Message:
    md = Metadata(run_id=7, message_id="", src_node_id=1, dst_node_id=NODE, group_id="1",
                  reply_to_message_id=reply_to, created_at=time.time(), ttl=3600.0,
                  message_type="train")
    msg = Message(RecordDict({"a": ArrayRecord([np.arange(size, dtype=np.float32)]),
                              "c": ConfigRecord({"x": size})}), metadata=md)
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


def _objects(msg: Message) -> dict[str, bytes]:
    return {oid: obj.deflate() for oid, obj in get_all_nested_objects(msg).items()}


class Link:
    """A SuperLink's Fleet handlers over in-memory messages and objects (b"" = not there yet),
    and the requests a SuperNode makes of it."""

    def __init__(self, status: int | None = None):
        self.queue: list[Message] = []  # messages for the node
        self.objects: dict[str, bytes] = {}
        self.confirmed: list[str] = []  # message ids
        self.pushed: list[tuple[str, str]] = []  # (object id, session id)
        self.stored, self.unavailable_once, self.status = True, set(), status
        self.requests: list[str] = []  # paths (or Flower's call's name) asked
        self.handlers = types.SimpleNamespace(**{n: getattr(self, n) for n in HANDLERS})

    def put(self, msg: Message) -> None:
        self.queue.append(msg)
        self.objects.update(_objects(msg))

    def pull_messages(self, request, state, store):
        if not self.queue:
            return PullMessagesResponse()
        msg = self.queue.pop(0)
        return PullMessagesResponse(messages_list=[message_to_proto(remove_content_from_message(
            msg))], message_object_trees=[get_object_tree(msg)])

    def pull_object(self, request, state):
        content = self.objects.get(request.object_id)
        if request.object_id in self.unavailable_once:  # lands right after this look
            self.unavailable_once.discard(request.object_id)
            content = b""
        return PullObjectResponse(object_found=content is not None, object_content=content,
                                  object_available=bool(content))

    def confirm_message_received(self, request, state, store):
        self.confirmed.append(request.message_object_id)
        return ConfirmMessageReceivedResponse()

    def push_messages(self, request, state):
        wanted = [t.object_id for t in iterate_object_tree(request.message_object_trees[0])
                  if t.object_id not in self.objects]
        return PushMessagesResponse(objects_to_push=wanted, session_id="sess-1")

    def push_object(self, request, state):
        self.pushed.append((request.object_id, request.session_id))
        self.objects.update({request.object_id: request.object_content} if self.stored else {})
        return PushObjectResponse(stored=self.stored)

    # the wire, as the SuperNode's batcher sees it
    def send(self, client, path, request, reply_type):
        self.requests.append(path)
        if self.status is not None:
            raise httpx.HTTPStatusError("no", request=httpx.Request("POST", "http://x"),
                                        response=httpx.Response(self.status))
        if path == mb.PULL_MESSAGE_PATH:
            return routes.pull_message(request, None, handlers=self.handlers)
        return routes.push_message(request, None, handlers=self.handlers)


def stock_client(link: Link) -> type:
    """Flower's ``FleetHttpClient`` as far as this link goes: one request per call (the node's
    registration, activation and heartbeats answered here)."""

    def call(name, handler, **kw):
        def method(self, request):
            link.requests.append(name)
            return handler(request=request, state=None, **kw)

        return method

    ok = lambda self, request: types.SimpleNamespace(node_id=NODE, success=True)  # noqa: E731
    return type("Stock", (), {
        "__init__": lambda self, *a, **k: None, "__enter__": lambda self: self,
        "__exit__": lambda self, *exc: None,
        "from_server_address": classmethod(lambda cls, *a, **k: cls()),
        **dict.fromkeys(("RegisterNode", "ActivateNode", "SendNodeHeartbeat", "DeactivateNode",
                         "UnregisterNode"), ok),
        "PullMessages": call("pull-messages", link.pull_messages, store=None),
        "PullObject": call("pull-object", link.pull_object),
        "ConfirmMessageReceived": call("confirm", link.confirm_message_received, store=None),
        "PushMessages": call("push-messages", link.push_messages),
        "PushObject": call("push-object", link.push_object)})


def node_state() -> types.SimpleNamespace:
    """The parts of Flower's NodeState the SuperNode's pull and push steps use."""
    state = types.SimpleNamespace(replies=[])
    state.__dict__.update(
        get_run=lambda run_id: types.SimpleNamespace(primary_task_type="", fab_hash="h"),
        create_task=lambda **_: 1, store_message=lambda message: None,
        delete_messages=lambda **_: None, finish_task=lambda *_a, **_k: None,
        get_messages_legacy=lambda is_reply: state.replies,
        get_message_processing_duration=lambda message_id: 0.1)
    return state


@contextlib.contextmanager
def supernode(monkeypatch, link: Link, *, object_batches: bool = False):
    """Flower's SuperNode connection and loop steps with the message batches installed over
    ``link`` (and the object batches under them when asked); yields the connection's callables
    (``conn``), the ``batcher``, a NodeState (``state``) and Flower's object ``store``."""
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode import fleet_http_connection as connection
    from flwr.supernode import start_client_internal as start

    monkeypatch.setattr(connection, "FleetHttpClient", stock_client(link))
    monkeypatch.setattr(start, "pull_objects", inflatable_utils.pull_objects)
    monkeypatch.setattr(start, "push_object_contents_from_iterable",
                        inflatable_utils.push_object_contents_from_iterable)
    if object_batches:
        def batches(client, path, requests):
            link.requests.append(path)
            batch = ob.ObjectBatch(node_id=NODE, requests=[r.SerializeToString() for r in requests])
            if path == ob.PULL_PATH:
                return batch_routes.pull_batch(batch, lambda r: link.pull_object(r, None)).replies
            return batch_routes.push_batch(batch, lambda r: link.push_object(r, None)).replies

        objects = ob.Batcher(batches)
        connection.FleetHttpClient = ob.batching_client(connection.FleetHttpClient, objects)
        start.pull_objects = ob.batched_pulls(start.pull_objects, objects)
        start.push_object_contents_from_iterable = ob.batched_pushes(
            start.push_object_contents_from_iterable, objects)
    batcher = mb.MessageBatcher(link.send)
    connection.FleetHttpClient = mb.message_client(connection.FleetHttpClient, batcher)
    start.pull_objects = mb.prefetched_pulls(start.pull_objects, batcher)
    start.push_object_contents_from_iterable = mb.message_pushes(
        start.push_object_contents_from_iterable, batcher)
    with connection.http_request_response("127.0.0.1:9", insecure=True) as conn:
        yield types.SimpleNamespace(conn=conn, batcher=batcher, state=node_state(),
                                    store=ObjectStoreFactory().store())


def _pull_and_store(node) -> int | None:
    from flwr.supernode import start_client_internal as start

    _, receive, _, get_run, get_fab, pull_object, _, confirm = node.conn
    return start._pull_and_store_message(node.state, node.store, {}, receive, get_run, get_fab,
                                         pull_object, confirm, None)


def _push_request(msg: Message, tree_of: Message | None = None) -> PushMessagesRequest:
    return PushMessagesRequest(node=Node(node_id=NODE), messages_list=[message_to_proto(
        remove_content_from_message(msg))], message_object_trees=[get_object_tree(tree_of or msg)])


def _pulled_id(response: PullMessagesResponse) -> str:
    return response.messages_list[0].metadata.message_id


def _object_pushes(msg: Message) -> list[PushObjectRequest]:
    return [PushObjectRequest(node=Node(node_id=NODE), run_id=7, object_id=oid,
                              object_content=c) for oid, c in _objects(msg).items()]


def _round(node, msg: Message, pulled=lambda: None) -> Message:
    """Flower's SuperNode ``node`` pulls ``msg`` (and stores it: checked) and pushes a reply
    to it; the reply. ``node.after_pull`` is ``pulled()`` in between."""
    from flwr.supernode import start_client_internal as start

    assert _pull_and_store(node) == 7
    assert all(node.store.get(oid) == c for oid, c in _objects(msg).items())
    node.after_pull = pulled()
    reply = _message(size=5, reply_to=msg.metadata.message_id)
    node.store.preregister(7, get_object_tree(reply))
    for oid, content in _objects(reply).items():
        node.store.put(oid, content)
    node.state.replies = [reply]
    start._push_messages(node.state, node.store, node.conn[2], node.conn[6])
    return reply


# ------------------------------------------------------------------- the SuperNode, end to end


def test_a_message_and_its_reply_take_one_request_each_and_no_confirmation(monkeypatch):
    link, msg = Link(), _message()
    link.put(msg)
    with supernode(monkeypatch, link) as node:
        reply = _round(node, msg, pulled=lambda: link.requests.copy())
    assert node.after_pull == [mb.PULL_MESSAGE_PATH]  # no object pull, no confirmation
    assert link.confirmed == [msg.metadata.message_id]  # the SuperLink confirmed it
    assert link.requests == [mb.PULL_MESSAGE_PATH, mb.PUSH_MESSAGE_PATH]
    assert sorted(link.pushed) == sorted((oid, "sess-1") for oid in _objects(reply))
    assert all(link.objects[oid] == c for oid, c in _objects(reply).items())


def test_an_object_not_there_yet_is_pulled_as_before_and_the_supernode_confirms(monkeypatch):
    link, msg = Link(), _message()
    link.put(msg)
    late = sorted(_objects(msg))[0]
    link.unavailable_once.add(late)  # announced, not landed when the SuperLink looked
    with supernode(monkeypatch, link) as node:
        assert _pull_and_store(node) == 7
    assert link.requests == [mb.PULL_MESSAGE_PATH, "pull-object", "confirm"]
    assert link.confirmed == [msg.metadata.message_id]  # once: by the SuperNode
    assert all(node.store.get(oid) == c for oid, c in _objects(msg).items())


def test_a_pull_reply_stops_adding_contents_past_its_cap_and_then_does_not_confirm():
    link, msg = Link(), _message()
    link.put(msg)
    reply = routes.pull_message(PullMessagesRequest(node=Node(node_id=NODE)), None,
                                handlers=link.handlers, max_bytes=1)
    assert len(reply.object_ids) == 1 and not reply.confirmed and not link.confirmed
    assert _pulled_id(PullMessagesResponse.FromString(reply.pull_response)) == msg.object_id


def test_a_superlink_without_the_routes_gets_todays_requests_from_then_on(monkeypatch, caplog):
    link = Link(status=404)
    with caplog.at_level(logging.INFO, logger="fedcure.flower.object_batches.messages"):
        with supernode(monkeypatch, link, object_batches=True) as node:
            for size in (2, 3):
                link.put(msg := _message(size=size))
                _round(node, msg)
    assert node.batcher.enabled is False
    today = ["pull-messages", ob.PULL_PATH, "confirm", "push-messages", ob.PUSH_PATH]
    assert link.requests == [mb.PULL_MESSAGE_PATH, *today, *today]  # asked once only
    assert caplog.text.count("is not served") == 1


def test_a_reply_is_not_answered_provisionally_before_the_pull_route_worked():
    link = Link()
    batcher = mb.MessageBatcher(link.send)
    client = mb.message_client(stock_client(link), batcher)()
    assert client.PushMessages(_push_request(_message())).session_id == "sess-1"
    assert link.requests == ["push-messages"]


@pytest.mark.parametrize("failure", ["an object not stored", "a server error"])
def test_a_reply_the_superlink_did_not_take_fails_the_push_loudly(monkeypatch, caplog, failure):
    link, msg = Link(), _message()
    link.put(msg)
    link.stored = failure != "an object not stored"
    fail = {"a server error": 500}.get(failure)
    with caplog.at_level(logging.ERROR), supernode(monkeypatch, link) as node:
        _round(node, msg, pulled=lambda: setattr(link, "status", fail))
    assert "Failed to send message" in caplog.text  # Flower's own push failure, logged
    assert link.requests == [mb.PULL_MESSAGE_PATH, mb.PUSH_MESSAGE_PATH]
    assert bool(link.pushed) == (fail is None)


def test_an_object_the_superlink_waits_for_but_was_not_carried_fails_the_push():
    link = Link()
    batcher = mb.MessageBatcher(link.send)
    with pytest.raises(ObjectPushError):
        batcher.push(None, _push_request(_message()), [])  # nothing carried, all wanted


# ------------------------------------------------------------------------------ the SuperLink


def test_a_push_stores_each_wanted_object_in_the_pushs_session_in_order():
    link, msg = Link(), _message()
    reply = _message(size=4)
    objects = _objects(reply)
    have = sorted(objects)[0]
    link.objects[have] = objects[have]  # the SuperLink has this one
    pushes = _object_pushes(reply)
    out = routes.push_message(mb.MessagePush(
        node_id=NODE, push_request=_push_request(msg, reply).SerializeToString(),
        object_pushes=[p.SerializeToString() for p in pushes]), None, handlers=link.handlers)
    assert len(out.object_replies) == len(pushes)
    assert all(PushObjectResponse.FromString(r).stored for r in out.object_replies)
    assert sorted(link.pushed) == sorted((oid, "sess-1") for oid in objects if oid != have)
    assert PushMessagesResponse.FromString(out.push_response).session_id == "sess-1"


def test_a_push_naming_another_node_or_undecodable_is_refused_before_anything_is_stored():
    link = Link()
    foreign = PushMessagesRequest(node=Node(node_id=NODE + 1)).SerializeToString()
    with pytest.raises(batch_routes.ForeignNode):
        routes.push_message(mb.MessagePush(node_id=NODE, push_request=foreign), None,
                            handlers=link.handlers)
    own = PushMessagesRequest(node=Node(node_id=NODE)).SerializeToString()
    with pytest.raises(batch_routes.BadBatch, match=r"object_pushes\[0\]"):
        routes.push_message(mb.MessagePush(node_id=NODE, push_request=own,
                                           object_pushes=[b"\xff\xff"]), None,
                            handlers=link.handlers)
    assert not link.pushed


def test_the_pull_still_holds_and_answers_with_the_objects_once_they_have_landed():
    """The real held-pull wrapper of the SuperLink's handlers, through the pull route: a pull
    that finds nothing waits, and the edge's push of a message wakes it once the message's
    objects are in; the message comes back whole and confirmed."""
    from fedcure_app.flower.fastpath import held_pulls

    link, msg = Link(), _message()
    fleet = types.ModuleType("fleet_handlers")  # Flower's handlers' shapes: bound methods
    fleet.__dict__.update(link.handlers.__dict__)
    runtime = types.ModuleType("runtime_handlers")

    def runtime_pull(request, state, task):  # the edge's pull of replies: not used here
        return PullMessagesResponse()

    def runtime_push(request, state, task):
        link.queue.append(msg)
        return types.SimpleNamespace(objects_to_push=list(_objects(msg)))

    def runtime_push_object(request, state, task):
        link.objects[request.object_id] = _objects(msg)[request.object_id]

    runtime.pull_messages, runtime.push_messages = runtime_pull, runtime_push
    runtime.push_object = runtime_push_object
    assert held_pulls.install(5.0, 1.0, fleet=fleet, runtime=runtime) is not None
    out: dict = {}
    pull = threading.Thread(target=lambda: out.update(reply=routes.pull_message(
        PullMessagesRequest(node=Node(node_id=NODE)), None, handlers=fleet)))
    pull.start()
    time.sleep(0.2)
    assert pull.is_alive()  # held: nothing for the node yet
    runtime.push_messages(request=types.SimpleNamespace(messages_list=[
        types.SimpleNamespace(metadata=types.SimpleNamespace(dst_node_id=NODE))]),
        state=None, task=None)
    for oid in (oids := list(_objects(msg))):
        if oid == oids[-1]:
            time.sleep(0.2)
            assert pull.is_alive()  # the message is in, one of its objects is not
        runtime.push_object(request=types.SimpleNamespace(object_id=oid), state=None, task=None)
    pull.join(2.0)
    assert not pull.is_alive()
    reply = out["reply"]
    assert sorted(reply.object_ids) == sorted(oids)
    assert list(reply.confirmed) == [msg.metadata.message_id]


# ------------------------------------------------------------- behind Flower's HTTP middlewares


@contextlib.contextmanager
def _served(monkeypatch, link: Link, routers, fast: bool = False):
    """Flower's Fleet middlewares (error translation, protobuf translation, node auth) around
    ``routers`` (with ``fast``: the message routes served in front of them by FastRoutes);
    yields a signing Fleet client of node NODE with the message batches."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from flwr.superlink.routers.fleet.node_auth import NodeAuthMiddleware
    from flwr.superlink.servicer.fleet import fleet_handlers
    from flwr.supercore.error.http import http_error_translator
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
    from flwr.supercore.protobuf import translation
    from flwr.supernode.fleet_http_client import FleetHttpClient
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware

    for name in HANDLERS:
        monkeypatch.setattr(fleet_handlers, name, getattr(link.handlers, name))
    for path, kind in ((mb.PULL_MESSAGE_PATH, PullMessagesRequest),
                       (mb.PUSH_MESSAGE_PATH, mb.MessagePush)):
        monkeypatch.setitem(translation.PROTOBUF_REQUEST_TYPES, ("POST", path), kind)
    private, public = generate_key_pairs()
    app = FastAPI(middleware=[Middleware(BaseHTTPMiddleware, dispatch=http_error_translator),
                              Middleware(translation.ProtobufTranslationMiddleware),
                              Middleware(NodeAuthMiddleware)])
    state = types.SimpleNamespace(object_store=None, get_node_id_by_public_key=lambda key: (
        NODE if key == public_key_to_bytes(public) else None))  # one registered node
    app.state.linkstate_factory = types.SimpleNamespace(state=lambda: state)
    for router in routers:
        app.include_router(router)
    if fast:
        from fedcure_app.flower.fastpath.fast_routes import FastRoutes

        app.add_middleware(FastRoutes, routes=routes.fast_routes())
    batcher = mb.MessageBatcher()
    client = mb.message_client(FleetHttpClient, batcher)(
        "http://testserver", interceptors=[NodeAuthHttpInterceptor(private, public)])
    with TestClient(app) as http:
        client._client.close()
        client._client = http
        yield client, batcher


@pytest.mark.parametrize("fast", [False, True], ids=["flowers-stack", "in-front-of-it"])
def test_the_routes_are_served_behind_flowers_middlewares_and_check_the_node(monkeypatch, fast):
    """Through Flower's stack, and answered in front of it (no router behind: a request the
    front did not serve would be a 404) with the same checks and errors."""
    link, msg = Link(), _message()
    link.put(msg)
    with _served(monkeypatch, link, [] if fast else [routes.message_router()],
                 fast) as (client, batcher):
        got = client.PullMessages(PullMessagesRequest(node=Node(node_id=NODE)))
        assert _pulled_id(got) == msg.metadata.message_id
        assert batcher.enabled and link.confirmed == [msg.metadata.message_id]
        assert batcher.take(_objects(msg)) == _objects(msg)
        reply = _message(size=6)
        pushes = _object_pushes(reply)
        batcher.push(client, _push_request(reply), pushes)  # authenticated on its node_id
        assert sorted(link.pushed) == sorted((p.object_id, "sess-1") for p in pushes)

        def post(message):
            return mb.send_message(client, mb.PUSH_MESSAGE_PATH, message, mb.MessagePushReply)

        foreign = PushMessagesRequest(node=Node(node_id=NODE + 1)).SerializeToString()
        for refused, status in ((mb.MessagePush(node_id=NODE, push_request=foreign), 401),
                                (mb.MessagePush(node_id=NODE + 1, push_request=foreign), 401),
                                (mb.MessagePush(node_id=NODE, push_request=b"\xff"), 400)):
            with pytest.raises(Exception) as err:  # the test client's httpx raises its own
                post(refused)
            assert err.value.response.status_code == status
        with pytest.raises(Exception) as err:  # signed by another node than it names
            client.PullMessages(PullMessagesRequest(node=Node(node_id=NODE + 1)))
        assert err.value.response.status_code == 401


def test_a_stock_superlinks_404_sends_the_pull_to_flowers_route(monkeypatch):
    from flwr.superlink.routers.fleet.router import router as fleet_router

    link, msg = Link(), _message()
    link.put(msg)
    with _served(monkeypatch, link, [fleet_router]) as (client, batcher):
        got = client.PullMessages(PullMessagesRequest(node=Node(node_id=NODE)))
    assert _pulled_id(got) == msg.metadata.message_id
    assert batcher.enabled is False and link.confirmed == []


# ----------------------------------------------------------------------- fitting Flower's code


def test_the_patch_fits_the_installed_flower(monkeypatch):
    from flwr.supernode import fleet_http_connection, start_client_internal

    for mod, name in ((fleet_http_connection, "FleetHttpClient"),
                      (start_client_internal, "pull_objects"),
                      (start_client_internal, "push_object_contents_from_iterable")):
        monkeypatch.setattr(mod, name, getattr(mod, name))
    assert mb.check_flower(start_client_internal, fleet_http_connection) == []
    assert ob.install_client() is not None and mb.install_client() is not None
    assert fleet_http_connection.FleetHttpClient.__name__ == "MessageBatchingFleetHttpClient"


def test_a_flower_whose_push_step_changed_is_left_alone_with_one_warning(caplog):
    from flwr.supernode import fleet_http_connection

    def _push_messages(state, object_store, send, push_object):  # pushes no objects after
        pass
    start = types.SimpleNamespace(pull_objects=print, push_object_contents_from_iterable=print,
                                  _push_messages=_push_messages, __name__="start")
    with caplog.at_level("WARNING", logger="fedcure.flower.object_batches.messages"):
        assert mb.install_client(start, fleet_http_connection) is None
    assert "no longer sends a reply and then pushes its objects" in caplog.text
    assert start.pull_objects is print


def test_the_servers_patch_fits_the_installed_flower(monkeypatch):
    import flwr.superlink.main as main
    from flwr.supercore import http_logging
    from flwr.supercore.protobuf import translation

    monkeypatch.setattr(main, "create_app", main.create_app)
    monkeypatch.setattr(translation, "PROTOBUF_REQUEST_TYPES",
                        types_ := dict(translation.PROTOBUF_REQUEST_TYPES))
    monkeypatch.setattr(http_logging, "ROUTINE_ACCESS_PATHS", http_logging.ROUTINE_ACCESS_PATHS)
    assert routes.install_server()
    assert types_[("POST", mb.PULL_MESSAGE_PATH)] is PullMessagesRequest
    assert types_[("POST", mb.PUSH_MESSAGE_PATH)] is mb.MessagePush
    assert {mb.PULL_MESSAGE_PATH, mb.PUSH_MESSAGE_PATH} <= http_logging.ROUTINE_ACCESS_PATHS
