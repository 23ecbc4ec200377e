"""The edge ServerApp's pull of its clients' replies in one request (message_batches.install_grid,
message_routes.pull_replies), driven by Flower's own ``HttpGrid.pull_messages``; and what every
pull route sends with the messages it pulled (batch_routes.gather_objects)."""

from __future__ import annotations

import logging
import time
import types

import httpx
import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, Metadata, RecordDict
from flwr.app.message import remove_content_from_message
from flwr.common.serde import message_to_proto
from flwr.proto.message_pb2 import ConfirmMessageReceivedResponse, PullObjectResponse
from flwr.proto.runtime_pb2 import PullAppMessagesResponse
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    iterate_object_tree,
)
from flwr.supercore.run import Run
from flwr.superlink.grid import http_grid
from hypothesis import given
from hypothesis import strategies as st

from fedcure_app.flower.fastpath import message_batches as mb
from fedcure_app.flower.fastpath import message_routes as routes
from fedcure_app.flower.fastpath.batch_routes import gather_objects

RUN = 7
TASK = types.SimpleNamespace(run_id=RUN, task_id=3)


def _reply(size: int, node: int) -> Message:
    md = Metadata(run_id=RUN, message_id="", src_node_id=node, dst_node_id=1, group_id="1",
                  reply_to_message_id=f"instruction-{node}", created_at=time.time(), ttl=3600.0,
                  message_type="train")
    msg = Message(RecordDict({"a": ArrayRecord([np.arange(size, dtype=np.float32)]),
                              "c": ConfigRecord({"n": node})}), metadata=md)
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


class Link:
    """The edge's SuperLink as far as replies go: Flower's Runtime handlers over in-memory
    replies and objects, and the requests the ServerApp makes of it."""

    def __init__(self, status: int | None = None):
        self.replies: dict[str, Message] = {}  # by message id
        self.objects: dict[str, bytes] = {}
        self.unavailable: set[str] = set()  # objects not landed yet (the first look)
        self.confirmed: list[str] = []
        self.requests: list[str] = []
        self.status = status
        self.handlers = types.SimpleNamespace(pull_messages=self.pull_messages,
                                              pull_object=self.pull_object,
                                              confirm_message_received=self.confirm)

    def put(self, msg: Message) -> str:
        self.replies[msg.object_id] = msg
        self.objects.update({o: v.deflate() for o, v in get_all_nested_objects(msg).items()})
        return msg.object_id

    def pull_messages(self, request, state, task):
        assert task is TASK
        got = [self.replies.pop(i) for i in request.message_ids if i in self.replies]
        return PullAppMessagesResponse(
            messages_list=[message_to_proto(remove_content_from_message(m)) for m in got],
            message_object_trees=[get_object_tree(m) for m in got])

    def pull_object(self, request, state, task):
        if request.object_id in self.unavailable:
            self.unavailable.discard(request.object_id)
            return PullObjectResponse(object_found=True, object_available=False)
        content = self.objects.get(request.object_id)
        return PullObjectResponse(object_found=content is not None,
                                  object_available=content is not None,
                                  object_content=content or b"")

    def confirm(self, request, state, task):
        self.confirmed.append(request.message_object_id)
        return ConfirmMessageReceivedResponse()


class StockClient:
    """Flower's ``RuntimeHttpClient`` over a :class:`Link`: one request per call."""

    def __init__(self, link: Link):
        self.link = link

    def PullMessages(self, request):  # noqa: N802 - Flower's names
        self.link.requests.append("PullMessages")
        return self.link.pull_messages(request, None, TASK)

    def PullObject(self, request):  # noqa: N802
        self.link.requests.append("PullObject")
        return self.link.pull_object(request, None, TASK)

    def ConfirmMessageReceived(self, request):  # noqa: N802
        self.link.requests.append("ConfirmMessageReceived")
        return self.link.confirm(request, None, TASK)

    def _unary_unary(self, *, path, rpc_method, request, response_type):
        self.link.requests.append(path)
        assert rpc_method == "/fedcure.batch.Runtime/pull-replies"
        if self.link.status is not None:
            raise httpx.HTTPStatusError("no", request=httpx.Request("POST", "http://x"),
                                        response=httpx.Response(self.link.status))
        got = routes.pull_replies(request, None, self.link.handlers, TASK)
        return response_type.FromString(got.SerializeToString())


@pytest.fixture
def grid(monkeypatch):
    """Flower's ``HttpGrid`` connected to a :class:`Link`, with the reply pulls installed."""
    monkeypatch.setattr(http_grid, "RuntimeHttpClient", StockClient)
    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)
    link = Link()
    g = http_grid.HttpGrid(token="t")
    g.set_run(Run.create_empty(run_id=RUN))
    g._client = StockClient(link)
    assert mb.install_grid(g, http_grid) is not None
    assert type(g._client).__name__ == "ReplyBatchingStockClient"
    return g, link


def test_a_pull_brings_every_reply_with_its_objects_and_confirmation(grid):
    g, link = grid
    sent = [_reply(3 + n, n) for n in range(4)]
    ids = [link.put(m) for m in sent]
    got = {m.metadata.message_id: m for m in g.pull_messages(ids)}
    assert link.requests == [mb.REPLIES_PATH]  # one request for four replies
    assert sorted(link.confirmed) == sorted(ids)
    for m in sent:
        np.testing.assert_array_equal(got[m.object_id].content["a"].to_numpy_ndarrays()[0],
                                      m.content["a"].to_numpy_ndarrays()[0])


def test_a_reply_whose_objects_had_not_landed_is_completed_and_confirmed_by_the_serverapp(grid):
    g, link = grid
    late, whole = _reply(5, 1), _reply(6, 2)
    ids = [link.put(late), link.put(whole)]
    array_id = next(t.object_id for t in iterate_object_tree(get_object_tree(late))
                    if t.object_id != late.object_id)
    link.unavailable.add(array_id)
    got = {m.metadata.message_id: m for m in g.pull_messages(ids)}
    assert link.requests[0] == mb.REPLIES_PATH
    assert link.requests.count("ConfirmMessageReceived") == 1  # only the late reply's
    assert "PullObject" in link.requests and "PullMessages" not in link.requests
    assert sorted(link.confirmed) == sorted(ids)
    np.testing.assert_array_equal(got[late.object_id].content["a"].to_numpy_ndarrays()[0],
                                  np.arange(5, dtype=np.float32))


def test_a_superlink_without_the_route_is_asked_flowers_way_from_then_on(grid, caplog):
    g, link = grid
    link.status = 404
    with caplog.at_level(logging.INFO, "fedcure.flower.object_batches.messages"):
        for n in range(2):
            ids = [link.put(_reply(3, 10 * n + k)) for k in range(2)]
            assert len(list(g.pull_messages(ids))) == 2
    assert link.requests.count(mb.REPLIES_PATH) == 1
    assert link.requests.count("PullMessages") == 2
    assert link.requests.count("ConfirmMessageReceived") == 4
    assert caplog.text.count("is not served") == 1


def test_the_reply_route_answers_through_flowers_handlers_behind_the_task_check(monkeypatch):
    """Served on the SuperLink's Runtime API: Flower's handlers with the state and the task its
    token names."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.dependencies import runtime as deps
    from flwr.supercore.protobuf import translation

    link = Link()
    rid = link.put(_reply(4, 2))
    app = FastAPI()
    app.add_middleware(translation.ProtobufTranslationMiddleware)
    app.include_router(routes.replies_router())
    app.dependency_overrides.update({deps.get_runtime_state: lambda: "state",
                                     deps.get_runtime_handlers: lambda: link.handlers,
                                     deps.get_task: lambda: TASK})
    monkeypatch.setitem(translation.PROTOBUF_REQUEST_TYPES, ("POST", mb.REPLIES_PATH),
                        PullAppMessagesRequest)
    with TestClient(app) as http:
        r = http.post(mb.REPLIES_PATH, content=PullAppMessagesRequest(
            message_ids=[rid]).SerializeToString(),
            headers={"content-type": "application/protobuf", "accept": "application/protobuf"})
    assert r.status_code == 200, r.text
    got = mb.MessagePullReply.FromString(r.content)
    assert list(got.confirmed) == [rid] and len(got.object_ids) == len(got.object_contents) > 1


def test_the_reply_route_is_answered_in_front_of_flowers_stack_behind_the_task_check():
    """FastRoutes serves the route with Flower's own task-token check and error answers (no
    router behind it: a request it did not serve would be a 404)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.constant import TASK_TOKEN_HEADER

    from fedcure_app.flower.fastpath.fast_routes import FastRoutes

    link = Link()
    rid = link.put(_reply(4, 2))
    state = types.SimpleNamespace(get_task_by_token=lambda t: TASK if t == "tok" else None)
    app = FastAPI()
    app.state.runtime_state_factory = types.SimpleNamespace(state=lambda: state)
    app.state.runtime_handlers = link.handlers
    app.add_middleware(FastRoutes, routes=routes.fast_routes())
    body = PullAppMessagesRequest(message_ids=[rid]).SerializeToString()
    proto = {"content-type": "application/protobuf", "accept": "application/protobuf"}
    with TestClient(app) as http:
        assert http.post(mb.REPLIES_PATH, content=body, headers=proto).status_code == 401
        assert http.post(mb.REPLIES_PATH, content=body, headers={
            **proto, TASK_TOKEN_HEADER: "stolen"}).status_code == 401
        assert http.post(mb.REPLIES_PATH, content=body, headers={
            "content-type": "text/plain", TASK_TOKEN_HEADER: "tok"}).status_code == 415
        r = http.post(mb.REPLIES_PATH, content=b"\xff", headers={**proto,
                                                                 TASK_TOKEN_HEADER: "tok"})
        assert r.status_code == 400
        assert link.replies  # nothing was pulled by a refused request
        r = http.post(mb.REPLIES_PATH, content=body, headers={**proto, TASK_TOKEN_HEADER: "tok"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/protobuf"
    assert list(mb.MessagePullReply.FromString(r.content).confirmed) == [rid]


def test_the_reply_pull_holds_until_a_reply_and_all_its_objects_are_in():
    """The real held-pull wrapper of the SuperLink's handlers, through the reply route: the
    pull waits, a client's push of its reply wakes it only once the reply's objects are in,
    and the reply comes back whole and confirmed."""
    import threading

    from flwr.proto.runtime_pb2 import PullAppMessagesRequest

    from fedcure_app.flower.fastpath import held_pulls

    link, msg = Link(), _reply(4, 2)
    objects = {o: v.deflate() for o, v in get_all_nested_objects(msg).items()}
    runtime = types.ModuleType("runtime_handlers")  # Flower's handlers' shapes
    runtime.__dict__.update(link.handlers.__dict__)

    def runtime_push(request, state, task):  # the edge's instructions: not used here
        return types.SimpleNamespace(objects_to_push=[])

    def runtime_push_object(request, state, task):
        return None

    fleet = types.ModuleType("fleet_handlers")

    def fleet_pull(request, state, store):
        return None

    def fleet_push(request, state):  # a client's reply: listed before its objects land
        link.replies[msg.object_id] = msg
        return types.SimpleNamespace(objects_to_push=list(objects))

    def fleet_push_object(request, state):
        link.objects[request.object_id] = objects[request.object_id]

    runtime.push_messages, runtime.push_object = runtime_push, runtime_push_object
    fleet.pull_messages, fleet.push_messages = fleet_pull, fleet_push
    fleet.push_object = fleet_push_object
    assert held_pulls.install(1.0, 5.0, fleet=fleet, runtime=runtime) is not None
    out: dict = {}
    pull = threading.Thread(target=lambda: out.update(reply=routes.pull_replies(
        PullAppMessagesRequest(message_ids=[msg.object_id]), None, runtime, TASK)))
    pull.start()
    time.sleep(0.2)
    assert pull.is_alive()  # held: no reply yet
    fleet.push_messages(request=types.SimpleNamespace(), state=None)
    for oid in (oids := list(objects)):
        if oid == oids[-1]:
            time.sleep(0.2)
            assert pull.is_alive()  # the reply is listed, one of its objects is not in
        fleet.push_object(request=types.SimpleNamespace(object_id=oid), state=None)
    pull.join(2.0)
    assert not pull.is_alive()
    reply = out["reply"]
    assert list(reply.confirmed) == [msg.object_id] == link.confirmed
    assert dict(zip(reply.object_ids, reply.object_contents)) == objects


# ----------------------------------------------------------------------- gather_objects


class Tree:
    def __init__(self, object_id: str, children: list[Tree] | None = None):
        self.object_id, self.children = object_id, children or []


messages_st = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=5), min_size=0,
                       max_size=5)


@given(sizes=messages_st, missing=st.sets(st.integers(0, 30)), cap=st.integers(1, 200),
       failing=st.sets(st.integers(0, 30), max_size=2))
def test_gathering_takes_objects_in_order_up_to_the_cap_and_confirms_only_whole_messages(
        sizes, missing, cap, failing):
    contents, messages, n = {}, [], 0
    for m, objects in enumerate(sizes):
        kids = []
        for size in objects:
            contents[f"o{n}"] = bytes(size)
            kids.append(Tree(f"o{n}"))
            n += 1
        messages.append((f"m{m}", m, Tree(kids[0].object_id, kids[1:])))
    asked: list[str] = []

    def pull(run_id: int, oid: str) -> PullObjectResponse:
        asked.append(oid)
        index = int(oid[1:])
        if index in failing:
            raise RuntimeError("the store broke")
        return PullObjectResponse(object_found=True, object_available=index not in missing,
                                  object_content=contents[oid])

    confirmed_calls: list[tuple[int, str]] = []
    ids, got, confirmed = gather_objects(
        messages, pull, lambda run, mid: confirmed_calls.append((run, mid)), max_bytes=cap)
    assert got == [contents[i] for i in ids]
    assert ids == [i for i in asked if int(i[1:]) not in missing | failing]
    # the cap: nothing is asked once the contents reached it
    assert sum(map(len, got[:-1])) < cap or len(got) <= 1
    for mid, run, tree in messages:
        own = [t.object_id for t in iterate_object_tree(tree)]
        whole = all(o in ids for o in own)
        assert (mid in confirmed) == whole
        assert ((run, mid) in confirmed_calls) == whole
