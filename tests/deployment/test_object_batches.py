"""A message's objects in one request each way between a SuperNode and the edge's SuperLink
(fedcure_app/flower/fastpath/object_batches.py): the SuperLink's batch routes, and the SuperNode's
client that batches what Flower asks of it one object at a time."""

from __future__ import annotations

import contextlib
import threading

import httpx
import pytest
from flwr.proto.message_pb2 import (
    PullObjectRequest,
    PullObjectResponse,
    PushObjectRequest,
    PushObjectResponse,
)
from flwr.proto.node_pb2 import Node
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError, pull_objects
from hypothesis import given
from hypothesis import strategies as st

from fedcure_app.flower.fastpath import batch_routes as routes
from fedcure_app.flower.fastpath import object_batches as ob


def _pull(node: int, oid: str, run: int = 7) -> PullObjectRequest:
    return PullObjectRequest(node=Node(node_id=node), run_id=run, object_id=oid)


def _push(node: int, oid: str, content: bytes = b"x") -> PushObjectRequest:
    return PushObjectRequest(node=Node(node_id=node), run_id=7, object_id=oid,
                             object_content=content, session_id="s")


def _batch(node: int, requests) -> object:
    return ob.ObjectBatch(node_id=node, requests=[r.SerializeToString() for r in requests])


def _replies(reply, kind):
    out = []
    for raw in reply.replies:
        r = kind()
        r.ParseFromString(raw)
        out.append(r)
    return out


# ----------------------------------------------------------------------------- the SuperLink


class Store:
    """Flower's handlers' effect, as far as a batch sees it: objects by id, b"" = not yet."""

    def __init__(self, objects: dict[str, bytes]):
        self.objects = dict(objects)
        self.calls: list[tuple[str, object]] = []

    def pull(self, request, state=None):
        self.calls.append(("pull", state))
        content = self.objects.get(request.object_id)
        if content is None:
            return PullObjectResponse(object_found=False, object_available=False)
        return PullObjectResponse(object_found=True, object_available=content != b"",
                                  object_content=content)

    def push(self, request, state=None):
        self.calls.append(("push", state))
        self.objects[request.object_id] = request.object_content
        return PushObjectResponse(stored=True)


def test_a_pull_batch_answers_each_object_in_order_through_flowers_handler():
    store = Store({"a": b"AA", "b": b"", "c": b"C"})
    reply = routes.pull_batch(_batch(3, [_pull(3, i) for i in "abcz"]),
                              lambda r: store.pull(r, "state"))
    got = _replies(reply, PullObjectResponse)
    assert [(r.object_found, r.object_available, r.object_content) for r in got] == [
        (True, True, b"AA"), (True, False, b""), (True, True, b"C"), (False, False, b"")]
    assert store.calls == [("pull", "state")] * 4


def test_a_batch_naming_another_node_than_the_signer_is_refused_whole():
    store = Store({"a": b"A"})
    with pytest.raises(routes.ForeignNode):
        routes.pull_batch(_batch(3, [_pull(3, "a"), _pull(4, "a")]), store.pull)
    with pytest.raises(routes.ForeignNode):
        routes.push_batch(_batch(3, [_push(5, "a")]), store.push)
    assert store.objects == {"a": b"A"}


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12),
       st.integers(min_value=1, max_value=200))
def test_a_pull_reply_stops_adding_contents_past_its_cap(sizes, cap):
    objects = {f"o{i}": b"x" * n for i, n in enumerate(sizes)}
    store = Store(objects)
    got = _replies(routes.pull_batch(_batch(1, [_pull(1, k) for k in objects]), store.pull,
                                     max_bytes=cap), PullObjectResponse)
    total = 0
    for (key, content), r in zip(objects.items(), got):
        if total < cap:
            assert r.object_content == content and r.object_available == (content != b"")
            total += len(content)
        else:  # asked for again by the SuperNode, like any object not there yet
            assert (r.object_found, r.object_available, r.object_content) == (True, False, b"")


def test_a_batch_whose_inner_request_is_not_a_request_is_refused_naming_it():
    store = Store({"a": b"A"})
    batch = ob.ObjectBatch(node_id=3, requests=[_pull(3, "a").SerializeToString(), b"\xff\xff"])
    with pytest.raises(routes.BadBatch, match=r"requests\[1\] is not a PullObjectRequest"):
        routes.pull_batch(batch, store.pull)
    assert store.calls == []


def test_a_push_batch_stores_every_object_through_flowers_handler():
    store = Store({})
    reply = routes.push_batch(_batch(2, [_push(2, "a", b"1"), _push(2, "b", b"2")]),
                              lambda r: store.push(r, "st"))
    assert [r.stored for r in _replies(reply, PushObjectResponse)] == [True, True]
    assert store.objects == {"a": b"1", "b": b"2"}


@contextlib.contextmanager
def _served(router, paths, overrides):
    """A FastAPI app behind Flower's protobuf translation serving ``router``; yields a function
    that POSTs a batch (or raw bytes) to a path and returns the HTTP response."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from flwr.supercore.protobuf import translation

    app = FastAPI()
    app.add_middleware(translation.ProtobufTranslationMiddleware)
    app.include_router(router)
    app.dependency_overrides.update(overrides)
    saved = dict(translation.PROTOBUF_REQUEST_TYPES)
    translation.PROTOBUF_REQUEST_TYPES.update({("POST", p): ob.ObjectBatch for p in paths})
    headers = {"content-type": "application/protobuf", "accept": "application/protobuf"}
    try:
        with TestClient(app) as http:
            def post(path, node, requests):  # requests: messages, or the body as bytes
                body = (requests if isinstance(requests, bytes)
                        else _batch(node, requests).SerializeToString())
                return http.post(path, headers=headers, content=body)

            yield post
    finally:
        translation.PROTOBUF_REQUEST_TYPES.clear()
        translation.PROTOBUF_REQUEST_TYPES.update(saved)


def test_the_routes_are_served_behind_flowers_protobuf_translation(monkeypatch):
    from flwr.superlink.dependencies.linkstate import get_linkstate
    from flwr.superlink.servicer.fleet import fleet_handlers

    store = Store({"a": b"AA"})
    monkeypatch.setattr(fleet_handlers, "pull_object",
                        lambda *, request, state: store.pull(request, state))
    monkeypatch.setattr(fleet_handlers, "push_object",
                        lambda *, request, state: store.push(request, state))
    with _served(routes.batch_router(), (ob.PULL_PATH, ob.PUSH_PATH),
                 {get_linkstate: lambda: "state"}) as post:
        r = post(ob.PUSH_PATH, 9, [_push(9, "b", b"BB")])
        assert r.status_code == 200, r.text
        r = post(ob.PULL_PATH, 9, [_pull(9, "a"), _pull(9, "b")])
        assert r.status_code == 200, r.text
        got = _replies(ob.ObjectBatchReply.FromString(r.content), PullObjectResponse)
        assert [g.object_content for g in got] == [b"AA", b"BB"]
        assert post(ob.PULL_PATH, 9, [_pull(8, "a")]).status_code == 401
        r = post(ob.PUSH_PATH, 9, [])
        assert r.status_code == 200 and not ob.ObjectBatchReply.FromString(r.content).replies
        r = post(ob.PULL_PATH, 9, ob.ObjectBatch(node_id=9, requests=[b"\xff"]).SerializeToString())
        assert r.status_code == 400 and "requests[0] is not a PullObjectRequest" in r.text
    assert store.calls == [("push", "state")] + [("pull", "state")] * 2


# ----------------------------------------------------------------------------- the SuperNode


class Link:
    """A SuperLink as the batcher's ``send`` sees it, counting requests."""

    def __init__(self, objects: dict[str, bytes], status: int | None = None):
        self.store = Store(objects)
        self.requests: list[tuple[str, int]] = []
        self.status = status

    def send(self, client, path, requests):
        self.requests.append((path, len(requests)))
        if self.status is not None:
            raise httpx.HTTPStatusError("no", request=httpx.Request("POST", "http://x"),
                                        response=httpx.Response(self.status))
        batch = _batch(requests[0].node.node_id, requests)
        if path in (ob.PULL_PATH, ob.RUNTIME_PULL_PATH):
            return list(routes.pull_batch(batch, self.store.pull).replies)
        return list(routes.push_batch(batch, self.store.push).replies)


class OneByOne:
    """Flower's Fleet client as far as objects go: one request per object."""

    def __init__(self, link: Link):
        self.link = link

    def PullObject(self, request):  # noqa: N802
        self.link.requests.append(("pull-object", 1))
        return self.link.store.pull(request)

    def PushObject(self, request):  # noqa: N802
        self.link.requests.append(("push-object", 1))
        return self.link.store.push(request)


def _client(link: Link):
    batcher = ob.Batcher(link.send)
    return batcher, ob.batching_client(OneByOne, batcher)(link)


def _pull_all(batcher, client, ids, **kw):
    def fn(oid):
        r = client.PullObject(_pull(4, oid))
        if not r.object_found:
            raise RuntimeError(oid)
        if not r.object_available:
            from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError
            raise ObjectUnavailableError(oid)
        return r.object_content

    return ob.batched_pulls(pull_objects, batcher)(ids, fn, initial_backoff=0.001,
                                                    backoff_cap=0.002, **kw)


def test_a_messages_objects_come_in_one_request():
    objects = {f"o{i}": bytes([i]) * 3 for i in range(6)}
    link = Link(objects)
    batcher, client = _client(link)
    assert _pull_all(batcher, client, list(objects)) == objects
    assert link.requests == [(ob.PULL_PATH, 6)]


def test_objects_not_there_yet_are_asked_for_again_in_a_batch_of_the_missing_ones():
    link = Link({"a": b"A", "b": b""})
    batcher, client = _client(link)
    done = {}
    t = threading.Thread(target=lambda: done.update(_pull_all(batcher, client, ["a", "b"])))
    t.start()
    while len(link.requests) < 2:
        pass
    link.store.objects["b"] = b"B"
    t.join(10)
    assert done == {"a": b"A", "b": b"B"}
    assert link.requests[0] == (ob.PULL_PATH, 2)
    assert all(r == (ob.PULL_PATH, 1) for r in link.requests[1:])


def test_a_superlink_without_batches_is_asked_one_object_at_a_time_from_then_on():
    link = Link({"a": b"A", "b": b"B"}, status=404)
    batcher, client = _client(link)
    assert _pull_all(batcher, client, ["a", "b"]) == {"a": b"A", "b": b"B"}
    assert not batcher.enabled
    assert sorted(link.requests) == [(ob.PULL_PATH, 2), ("pull-object", 1), ("pull-object", 1)]
    link.requests.clear()
    assert _pull_all(batcher, client, ["a"]) == {"a": b"A"}
    assert link.requests == [("pull-object", 1)]


def test_a_failed_batch_that_is_not_a_404_keeps_batching_on():
    link = Link({"a": b"A"}, status=503)
    batcher, client = _client(link)
    assert _pull_all(batcher, client, ["a"]) == {"a": b"A"}
    assert batcher.enabled


def test_an_object_outside_the_pull_in_progress_goes_alone():
    link = Link({"a": b"A"})
    _, client = _client(link)
    assert client.PullObject(_pull(4, "a")).object_content == b"A"
    assert link.requests == [("pull-object", 1)]


def _pushes(batcher, client, contents, push_contents=None):
    def one_by_one(object_contents, push_object_fn, **kw):
        for oid, content in object_contents:
            push_object_fn(oid, content)

    def fn(oid, content):
        if not client.PushObject(_push(4, oid, content)).stored:
            raise ObjectPushError(oid, 7, "s")

    ob.batched_pushes(push_contents or one_by_one, batcher)(iter(contents), fn)


def test_a_replys_objects_go_in_one_request():
    link = Link({})
    batcher, client = _client(link)
    _pushes(batcher, client, [("a", b"1"), ("b", b"2"), ("c", b"3")])
    assert link.requests == [(ob.PUSH_PATH, 3)]
    assert link.store.objects == {"a": b"1", "b": b"2", "c": b"3"}


def test_pushes_go_one_by_one_when_the_batch_fails():
    link = Link({}, status=404)
    batcher, client = _client(link)
    _pushes(batcher, client, [("a", b"1"), ("b", b"2")])
    assert link.requests == [(ob.PUSH_PATH, 2), ("push-object", 1), ("push-object", 1)]
    assert link.store.objects == {"a": b"1", "b": b"2"}


def test_an_object_the_superlink_did_not_store_fails_the_push():
    link = Link({})
    link.store.push = lambda request, state=None: PushObjectResponse(stored=False)
    batcher, client = _client(link)
    with pytest.raises(ObjectPushError):
        _pushes(batcher, client, [("a", b"1")])


def test_a_flower_without_a_patched_name_is_left_alone_with_one_warning(caplog):
    import types

    start = types.SimpleNamespace(pull_objects=pull_objects)  # no push function
    connection = types.SimpleNamespace(FleetHttpClient=OneByOne)
    with caplog.at_level("WARNING", logger="fedcure.flower.object_batches"):
        assert ob.install_client(start, connection) is None
    assert "push_object_contents_from_iterable" in caplog.text
    assert start.pull_objects is pull_objects and connection.FleetHttpClient is OneByOne


def test_the_patch_fits_the_installed_flower(monkeypatch):
    from flwr.supernode import fleet_http_connection, start_client_internal

    for mod, name in ((fleet_http_connection, "FleetHttpClient"),
                      (start_client_internal, "pull_objects"),
                      (start_client_internal, "push_object_contents_from_iterable")):
        monkeypatch.setattr(mod, name, getattr(mod, name))
    batcher = ob.install_client()
    assert batcher is not None
    assert fleet_http_connection.FleetHttpClient.__name__ == "BatchingFleetHttpClient"


# ----------------------------------------------------------------------------- the executor


class Deflatable:
    def __init__(self, content: bytes):
        self.content = content

    def deflate(self) -> bytes:
        return self.content


def _push_objects_one_by_one(objects, push_object_fn, *, object_ids_to_push=None,
                             keep_objects=False):
    for oid in list(objects):
        if object_ids_to_push is None or oid in object_ids_to_push:
            push_object_fn(oid, objects[oid].deflate())
            if not keep_objects:
                del objects[oid]


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("status", [None, 404])
def test_a_dict_of_objects_is_pushed_like_flowers_push_objects(keep, status):
    """Only the objects the server asked for, in one batch (one by one when it fails); the
    pushed ones leave the dict unless kept, exactly as Flower's own push."""
    link = Link({}, status=status)
    batcher, client = _client(link)
    objects = {k: Deflatable(k.encode() * 2) for k in "abc"}

    def fn(oid, content):
        client.PushObject(_push(4, oid, content))

    ob.batched_object_pushes(_push_objects_one_by_one, batcher)(
        objects, fn, object_ids_to_push={"a", "c"}, keep_objects=keep)
    assert link.store.objects == {"a": b"aa", "c": b"cc"}
    assert sorted(objects) == (["a", "b", "c"] if keep else ["b"])
    assert link.requests[0] == (ob.PUSH_PATH, 2)
    assert len(link.requests) == (1 if status is None else 3)


def test_a_message_tree_is_pulled_in_one_batch():
    from flwr.proto.message_pb2 import ObjectTree

    tree = ObjectTree(object_id="m", children=[ObjectTree(object_id="r", children=[
        ObjectTree(object_id="a"), ObjectTree(object_id="b")])])
    objects = {k: k.encode() for k in "mrab"}
    link = Link(objects)
    batcher, client = _client(link)

    def pull_tree(object_tree, pull_object_fn, confirm_fn, **kw):
        from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

        ids = [t.object_id for t in iterate_object_tree(object_tree)]
        return {i: pull_object_fn(i) for i in ids}

    got = ob.batched_tree_pulls(pull_tree, batcher)(
        tree, lambda oid: client.PullObject(_pull(4, oid)).object_content, None)
    assert got == objects
    assert link.requests == [(ob.PULL_PATH, 4)]


def test_a_connected_grids_client_batches_from_then_on(monkeypatch):
    from flwr.superlink.grid import http_grid

    for name in ("RuntimeHttpClient", "pull_objects", "push_objects"):
        monkeypatch.setattr(http_grid, name, getattr(http_grid, name))
    client = http_grid.RuntimeHttpClient("http://127.0.0.1:9")

    class Grid:
        _client = client

    assert ob.install_grid(Grid(), http_grid) is not None
    assert type(client).__name__ == "BatchingRuntimeHttpClient"
    assert http_grid.RuntimeHttpClient.__name__ == "BatchingRuntimeHttpClient"
    client.close()


def test_the_runtime_routes_check_the_task_and_answer_through_its_handlers():
    from flwr.supercore.dependencies import runtime as deps

    store = Store({"a": b"AA"})

    class Handlers:
        @staticmethod
        def pull_object(request, state, task):
            assert task == "task-7"
            return store.pull(request, state)

        @staticmethod
        def push_object(request, state, task):
            assert task == "task-7"
            return store.push(request, state)

    with _served(routes.runtime_batch_router(), (ob.RUNTIME_PULL_PATH, ob.RUNTIME_PUSH_PATH),
                 {deps.get_runtime_state: lambda: "state",
                  deps.get_runtime_handlers: lambda: Handlers,
                  deps.get_task: lambda: "task-7"}) as post:
        assert post(ob.RUNTIME_PUSH_PATH, 9, [_push(9, "b", b"BB")]).status_code == 200
        r = post(ob.RUNTIME_PULL_PATH, 9, [_pull(9, "b"), _pull(9, "a")])
        got = _replies(ob.ObjectBatchReply.FromString(r.content), PullObjectResponse)
        assert [g.object_content for g in got] == [b"BB", b"AA"]
    assert store.calls == [("push", "state"), ("pull", "state"), ("pull", "state")]


@pytest.mark.parametrize("on", ["superlink", "supernode"])
def test_the_servers_patch_fits_the_installed_flower(monkeypatch, on):
    import importlib

    from flwr.supercore.protobuf import translation

    main = importlib.import_module(f"flwr.{on}.main")
    monkeypatch.setattr(main, "create_app", main.create_app)
    monkeypatch.setattr(translation, "PROTOBUF_REQUEST_TYPES",
                        dict(translation.PROTOBUF_REQUEST_TYPES))
    from flwr.supercore import http_logging

    monkeypatch.setattr(http_logging, "ROUTINE_ACCESS_PATHS", http_logging.ROUTINE_ACCESS_PATHS)
    assert routes.install_server(on=on)
    assert ("POST", ob.RUNTIME_PULL_PATH) in translation.PROTOBUF_REQUEST_TYPES
    assert (("POST", ob.PULL_PATH) in translation.PROTOBUF_REQUEST_TYPES) == (on == "superlink")
    with pytest.raises(ValueError):
        routes.install_server(on="cloud")


def test_a_successful_batch_request_is_a_routine_access_not_logged_at_info(monkeypatch):
    """Flower's access-log filter hides its own successful pulls and pushes unless debugging;
    the batch routes join them (else the edge's SuperLink logs three lines per client per
    edge round), and a failed batch request is still logged."""
    import importlib
    import logging

    from flwr.supercore import http_logging
    from flwr.supercore.protobuf import translation

    main = importlib.import_module("flwr.superlink.main")
    monkeypatch.setattr(main, "create_app", main.create_app)
    monkeypatch.setattr(translation, "PROTOBUF_REQUEST_TYPES",
                        dict(translation.PROTOBUF_REQUEST_TYPES))
    ours = {ob.PULL_PATH, ob.PUSH_PATH, ob.RUNTIME_PULL_PATH, ob.RUNTIME_PUSH_PATH}
    monkeypatch.setattr(http_logging, "ROUTINE_ACCESS_PATHS",
                        http_logging.ROUTINE_ACCESS_PATHS - ours)  # as Flower ships it
    access = http_logging.RoutineAccessFilter(debug_enabled=False)

    def record(path: str, status: int) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                                 '%s - "%s %s HTTP/%s" %d',
                                 ("127.0.0.1:5", "POST", path, "1.1", status), None)

    assert access.filter(record(ob.PULL_PATH, 200))  # before: logged
    assert routes.install_server(on="superlink")
    for path in sorted(ours):
        assert not access.filter(record(path, 200)), path
        assert access.filter(record(path, 500)), path
