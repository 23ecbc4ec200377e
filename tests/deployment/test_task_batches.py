"""A ClientApp task in two requests between the executor and its SuperNode
(fedcure_app/flower/fastpath/task_batches.py): the SuperNode's routes over Flower's own handlers and
node state, and the executor's side that reads the input and sends the reply and status."""

from __future__ import annotations

import contextlib
import hashlib
import logging

import httpx
import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.constant import SubStatus
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    AcquireTaskResponse,
    PullTaskInputResponse,
)
from flwr.supercore.constant import TaskType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcure_app.flower.fastpath import task_batches as tb

NODE, RUN, SERIES = 5, 11, 3


def _node_state(message: Message) -> tuple[object, int]:
    """Flower's in-memory node state holding ``message`` (and its objects) as the SuperNode's
    ``_pull_and_store_message`` leaves it: run, FAB, context, a pending ClientApp task."""
    from flwr.supercore.fab import Fab
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supernode.nodestate import NodeStateFactory

    state = NodeStateFactory(ObjectStoreFactory()).state()
    state.set_node_id(NODE)
    fab = Fab(hashlib.sha256(b"fab-bytes").hexdigest(), b"fab-bytes", {})
    run = Run.create_empty(run_id=RUN)
    run.fab_hash, run.series_id = fab.hash_str, SERIES
    state.store_run(run)
    state.store_fab(fab)
    state.set_run_series_context(SERIES, Context(run_id=RUN, node_id=NODE, node_config={},
                                                 state=RecordDict(), run_config={}))
    task_id = state.create_task(task_type=TaskType.CLIENT_APP, run_id=RUN,
                                fab_hash=fab.hash_str)
    message.metadata.__dict__["_message_id"] = message.object_id
    tree = get_object_tree(message)
    state.object_store.preregister(RUN, tree)
    for oid, obj in get_all_nested_objects(message).items():
        state.object_store.put(oid, obj.deflate())
    state.store_message(message)
    return state, task_id


@pytest.fixture(autouse=True)
def _task_identity():
    """Flower's per-process task identity (a ServerApp's while messages are made here);
    :func:`task_batches.inputs` sets the ClientApp's, as Flower's ``pull_task_input`` does."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _instruction(arrays: list[np.ndarray]) -> Message:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN, 1
    content = RecordDict({"arrays": ArrayRecord([a for a in arrays]),
                          "config": MetricRecord({"lr": 0.1})})
    return Message(content, dst_node_id=NODE, message_type="train", group_id="r0-c0-v0/e0")


def _handlers():
    from flwr.supernode.servicer.runtime import runtime_handlers

    return runtime_handlers


def _acquire(state) -> object:
    return tb.acquire_with_input(
        AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]), state, _handlers())


class TaskClient:
    """The task's Runtime API client as :func:`task_batches.inputs` and ``finish`` use it,
    over the same node state and Flower's handlers, counting requests."""

    def __init__(self, state, token: str):
        self.state, self.task = state, state.get_task_by_token(token)
        self.calls: list[str] = []

    def PullObject(self, request):  # noqa: N802 - Flower's name
        self.calls.append("PullObject")
        return _handlers().pull_object(request, self.state, self.task)

    def ConfirmMessageReceived(self, request):  # noqa: N802
        self.calls.append("ConfirmMessageReceived")
        return _handlers().confirm_message_received(request, self.state, self.task)

    def _unary_unary(self, *, path, rpc_method, request, response_type):
        self.calls.append(path)
        assert path == tb.OUTPUT_PATH and rpc_method == tb.OUTPUT_METHOD
        got = tb.push_output(tb.TaskOutput.FromString(request.SerializeToString()),
                             self.state, _handlers(), self.task)
        return response_type.FromString(got.SerializeToString())


arrays_st = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=4)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=arrays_st, seed=st.integers(0, 2**16))
def test_a_tasks_input_comes_whole_in_one_answer_and_the_message_is_confirmed(shapes, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    sent = _instruction(arrays)
    state, task_id = _node_state(sent)
    got = _acquire(state)
    acquired = AcquireTaskResponse.FromString(got.acquire)
    assert acquired.task.task_id == task_id and acquired.token
    assert not got.input_error and list(got.confirmed) == [sent.object_id]
    client = TaskClient(state, acquired.token)
    message, context, run, fab = tb.inputs(client, got)
    assert client.calls == []  # nothing more was asked of the SuperNode
    assert message.metadata.message_id == sent.object_id
    assert (run.run_id, fab.content, context.node_id) == (RUN, b"fab-bytes", NODE)
    for a, b in zip(arrays, message.content["arrays"].to_numpy_ndarrays()):
        np.testing.assert_array_equal(a, b)
    # confirmed on the SuperNode: the message's objects are gone from its store
    assert state.object_store.get(sent.object_id) is None


def test_no_task_is_an_acquire_answer_alone():
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate import NodeStateFactory

    got = _acquire(NodeStateFactory(ObjectStoreFactory()).state())
    assert not AcquireTaskResponse.FromString(got.acquire).token
    assert not got.task_input and not got.object_ids and not got.confirmed


def test_objects_past_the_cap_are_pulled_after_and_the_message_confirmed_then():
    sent = _instruction([np.ones((4, 4), np.float32), np.zeros(3, np.float32)])
    state, _ = _node_state(sent)
    got = tb.acquire_with_input(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]),
                                state, _handlers(), max_bytes=1)
    assert len(got.object_ids) == 1 and not got.confirmed
    token = AcquireTaskResponse.FromString(got.acquire).token
    client = TaskClient(state, token)
    message, *_ = tb.inputs(client, got)
    assert "PullObject" in client.calls and client.calls[-1] == "ConfirmMessageReceived"
    np.testing.assert_array_equal(message.content["arrays"].to_numpy_ndarrays()[0],
                                  np.ones((4, 4), np.float32))


def test_an_input_that_cannot_be_gathered_fails_the_task_with_the_reason():
    sent = _instruction([np.ones(2, np.float32)])
    state, _ = _node_state(sent)
    state.get_fab = lambda _hash: None  # the FAB went missing after the task was made
    got = _acquire(state)
    assert "FAB" in got.input_error and not got.object_ids and not got.task_input
    with pytest.raises(RuntimeError, match="could not be read"):
        tb.inputs(TaskClient(state, AcquireTaskResponse.FromString(got.acquire).token), got)


def _reply(to: Message, value: float) -> Message:
    return Message(RecordDict({"arrays": ArrayRecord([np.full(3, value, np.float32)]),
                               "metrics": MetricRecord({"loss": value})}), reply_to=to)


def test_the_reply_its_objects_and_the_status_go_in_one_request():
    sent = _instruction([np.ones(2, np.float32)])
    state, task_id = _node_state(sent)
    got = _acquire(state)
    client = TaskClient(state, AcquireTaskResponse.FromString(got.acquire).token)
    message, context, *_ = tb.inputs(client, got)
    status = tb.finish(client, True, task_id, _reply(message, 2.5), context,
                       SubStatus.COMPLETED, "")
    assert status == SubStatus.COMPLETED and client.calls == [tb.OUTPUT_PATH]
    (stored,) = state.get_messages_legacy(is_reply=True)
    assert stored.metadata.reply_to_message_id == sent.object_id
    tree = state.object_store.get_object_tree(stored.metadata.message_id)
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

    assert all(state.object_store.get(t.object_id) for t in iterate_object_tree(tree))
    assert state.get_task_by_token(AcquireTaskResponse.FromString(got.acquire).token) is None


def test_a_reply_the_supernode_did_not_store_ends_the_task_failed_saying_why(monkeypatch, caplog):
    from flwr.proto.message_pb2 import PushObjectResponse

    sent = _instruction([np.ones(2, np.float32)])
    state, task_id = _node_state(sent)
    got = _acquire(state)
    client = TaskClient(state, AcquireTaskResponse.FromString(got.acquire).token)
    message, context, *_ = tb.inputs(client, got)
    finished: list[tuple[str, str]] = []
    monkeypatch.setattr(state, "finish_task",
                        lambda task_id, sub_status, details: finished.append(
                            (sub_status, details)) or True)
    monkeypatch.setattr(_handlers(), "push_object",
                        lambda *a, **k: PushObjectResponse(stored=False))
    with caplog.at_level(logging.ERROR, "fedcure.flower.task_batches"):
        status = tb.finish(client, True, task_id, _reply(message, 1.0), context,
                           SubStatus.COMPLETED, "")
    assert status == SubStatus.FAILED
    assert finished and finished[0][0] == SubStatus.FAILED
    assert "was not stored" in finished[0][1] and "was not stored" in caplog.text


def test_a_task_without_a_reply_sends_its_status_alone():
    bundle = tb.output(None, None, SubStatus.FAILED, "trainer died")
    assert not bundle.push_messages and not bundle.object_pushes
    from flwr.proto.runtime_pb2 import PushTaskOutputRequest

    out = PushTaskOutputRequest.FromString(bundle.task_output)
    assert (out.sub_status, out.details, out.HasField("context")) == (
        SubStatus.FAILED, "trainer died", False)


class Refusing:
    """A Runtime API client whose SuperNode answers the bundle route ``status``."""

    def __init__(self, status: int):
        self.status, self.calls = status, []

    def _unary_unary(self, *, path, **_kw):
        self.calls.append(path)
        raise httpx.HTTPStatusError("no", request=httpx.Request("POST", "http://x"),
                                    response=httpx.Response(self.status))

    def AcquireTask(self, request):  # noqa: N802
        self.calls.append("AcquireTask")
        return AcquireTaskResponse()


def test_a_supernode_without_the_routes_is_asked_flowers_way_from_then_on(caplog):
    requests, client = tb.TaskRequests(), Refusing(404)
    with caplog.at_level(logging.INFO, "fedcure.flower.task_batches"):
        for _ in range(3):
            res, bundle = requests.acquire(client, AcquireTaskRequest())
            assert bundle is None and not res.token
    assert client.calls == [tb.INPUT_PATH, "AcquireTask", "AcquireTask", "AcquireTask"]
    assert caplog.text.count("does not serve") == 1


def test_any_other_failure_of_the_bundle_route_is_raised_and_batching_stays():
    requests = tb.TaskRequests()
    with pytest.raises(httpx.HTTPStatusError):
        requests.acquire(Refusing(503), AcquireTaskRequest())
    assert requests.enabled


@contextlib.contextmanager
def _supernode_app(monkeypatch, state, secret: bytes):
    """Flower's own SuperNode app (``create_app``) with the routes installed, over ``state``."""
    import flwr.supernode.main as main
    from fastapi.testclient import TestClient
    from flwr.supercore import http_logging
    from flwr.supercore.protobuf import translation

    monkeypatch.setattr(main, "create_app", main.create_app)
    monkeypatch.setattr(translation, "PROTOBUF_REQUEST_TYPES",
                        dict(translation.PROTOBUF_REQUEST_TYPES))
    monkeypatch.setattr(http_logging, "ROUTINE_ACCESS_PATHS", http_logging.ROUTINE_ACCESS_PATHS)
    assert tb.install_server()

    class Factory:
        def state(self):
            return state

    import inspect

    params = inspect.signature(main.create_app).parameters
    kwargs = {k: v for k, v in {"state_factory": Factory(), "superexec_auth_secret": secret,
                                "runtime_state_factory": Factory()}.items() if k in params}
    app = main.create_app(**kwargs)
    from fedcure_app.flower.fastpath.fast_routes import FastRoutes

    assert any(m.cls is FastRoutes for m in app.user_middleware)  # served in front of Flower's
    app.state.runtime_state_factory = Factory()
    with TestClient(app) as http:
        yield http


def test_the_routes_are_served_on_flowers_supernode_app_behind_its_checks(monkeypatch):
    """Only a caller holding the SuperExec secret takes a task (as with ``AcquireTask``); the
    output needs the task's token."""
    import os

    from flwr.supercore.auth.superexec import create_superexec_auth_metadata, derive_auth_secret
    from flwr.supercore.constant import TASK_TOKEN_HEADER

    sent = _instruction([np.ones(2, np.float32)])
    state, _ = _node_state(sent)
    secret = os.urandom(32)
    req = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    body = req.SerializeToString(deterministic=True)
    proto = {"content-type": "application/protobuf", "accept": "application/protobuf"}

    def signed(key: bytes, method: str = tb.INPUT_METHOD) -> dict[str, str]:
        return dict(create_superexec_auth_metadata(auth_secret=derive_auth_secret(key),
                                                   method=method, request=req))

    with _supernode_app(monkeypatch, state, secret) as http:
        assert http.post(tb.INPUT_PATH, content=body, headers=proto).status_code == 401
        assert http.post(tb.INPUT_PATH, content=body,
                         headers={**proto, **signed(os.urandom(32))}).status_code == 401
        assert http.post(tb.INPUT_PATH, content=body, headers={
            **proto, **signed(secret, "/flwr.proto.Runtime/AcquireTask")}).status_code == 401
        r = http.post(tb.INPUT_PATH, content=body, headers={**proto, **signed(secret)})
        assert r.status_code == 200, r.text
        got = tb.TaskInput.FromString(r.content)
        token = AcquireTaskResponse.FromString(got.acquire).token
        assert PullTaskInputResponse.FromString(got.task_input).run.run_id == RUN
        out = tb.output(None, None, SubStatus.COMPLETED, "").SerializeToString()
        with_token = {**proto, TASK_TOKEN_HEADER: token}
        assert http.post(tb.OUTPUT_PATH, content=out, headers=proto).status_code == 401
        bad = tb.TaskOutput(task_output=b"\xff\xff\xff").SerializeToString()
        r = http.post(tb.OUTPUT_PATH, content=bad, headers=with_token)
        assert r.status_code == 400 and "not Flower's messages" in r.text
        r = http.post(tb.OUTPUT_PATH, content=out, headers=with_token)
        assert r.status_code == 200, r.text
        # the task is over: its token takes nothing more
        assert http.post(tb.OUTPUT_PATH, content=out, headers=with_token).status_code == 401
