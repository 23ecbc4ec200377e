"""Bad input gets a clear gRPC status and changes nothing (a live cloud on 127.0.0.1)."""

from __future__ import annotations

import math
import os

import grpc
import numpy as np
import pytest

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import decode_arrays, encode_arrays
from tests.deployment.fakes import FakeEdge, channel, make_cfg
from tests.deployment.reliability import (
    code_of,
    federation,
    one_hot,
    raw,
    register_all,
    request,
    start,
    state_of,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def like(task: pb.Task, value: float = 1.0) -> list[np.ndarray]:
    return [np.full_like(a, value) for a in decode_arrays(task.model)]


def test_bad_models_are_refused_and_change_nothing(cleanup):
    server, (e0, e1) = federation(cleanup)
    task = e0.next_task()
    before = state_of(server)
    good = like(task)
    bad = {
        "shape": [np.ones((3, 2), np.float32), good[1]],
        "dtype": [good[0].astype(np.float64), good[1]],
        "count": good[:1],
        "extra tensor": good + [np.ones(2, np.float32)],
        "nan": [good[0], np.array([1, np.nan, 1], np.float32)],
        "inf": [np.full_like(good[0], np.inf), good[1]],
    }
    for name, arrays in bad.items():
        assert code_of(lambda: e0.submit(task, arrays)) == INVALID, name
        assert state_of(server) == before, name
    for blob in (b"", b"garbage", os.urandom(64), encode_arrays(good)[:-3]):
        assert code_of(lambda: e0.submit(task, model=blob)) == INVALID
    assert state_of(server) == before
    # the task is still expected: a good model for it is aggregated once
    assert e0.submit(task, good).accepted
    assert state_of(server)["version"] == before["version"] + 1


def test_a_model_far_outside_the_others_is_refused(cleanup):
    server, fakes = federation(cleanup, **{"max-concurrent": 2})
    # build a history of accepted distances (values near the global model)
    for i in range(4):
        e = fakes[i % 2]
        assert e.submit(e.next_task(), value=0.5 + 0.01 * i).accepted
    e = fakes[0]
    task = e.next_task()
    before = state_of(server)

    def unchanged_but_the_task() -> dict:
        # a screened-out model ends its task (the edge takes the next one, from the
        # current version); nothing else changes
        now = state_of(server)
        assert now.pop("in_flight")[0] == (now["version"], now["round"])
        return now

    before.pop("in_flight")
    # inside the step bound (200), far past 10× the median
    with pytest.raises(grpc.RpcError) as err:
        e.submit(task, value=50.0)
    assert err.value.code() == INVALID and "median" in err.value.details()
    assert unchanged_but_the_task() == before
    assert [f["kind"] for f in server.service.controller.faults] == ["refused"]
    task = e.next_task()
    with pytest.raises(grpc.RpcError) as err:
        e.submit(task, value=1e4)
    assert err.value.code() == INVALID and "step bound" in err.value.details()
    assert unchanged_but_the_task() == before
    assert e.submit(e.next_task(), value=0.6).accepted


def test_oversized_messages_are_refused(cleanup):
    cfg = make_cfg(2, 1, **{"global-rounds": 10})
    big = [np.zeros((64, 64), np.float32)]  # 16 KiB model
    server = start(cfg, expected=2, max_message_bytes=32 * 1024, initial=big)
    cleanup.append(server)
    edge = FakeEdge(server.address, 0)
    cleanup.append(edge)
    register_all(server.address, [request(f"c{i}", one_hot(i), home=0) for i in range(2)])
    task = edge.next_task()
    before = state_of(server)
    huge = [np.zeros((128, 128), np.float32)]  # 64 KiB > the 32 KiB limit
    assert code_of(lambda: edge.submit(task, huge)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert state_of(server) == before
    assert edge.submit(task, [np.ones((64, 64), np.float32)]).accepted


def test_unknown_answered_and_misaddressed_submits(cleanup):
    server, (e0, e1) = federation(cleanup)
    t0 = e0.next_task()
    e1.next_task()
    before = state_of(server)
    assert code_of(lambda: e0.submit(t0, task_id="r9-c0-v9")) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: e0.submit(t0, task_id="")) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: e1.submit(t0)) == INVALID  # edge 1 answering edge 0's task
    assert code_of(lambda: e0.submit(t0, edge_id=7)) == INVALID  # no such edge
    assert code_of(lambda: e0.submit(t0, samples=0)) == INVALID
    assert code_of(lambda: e0.submit(t0, samples=-5)) == INVALID
    assert state_of(server) == before
    first = e0.submit(t0)
    assert first.accepted
    after = state_of(server)
    # duplicates are idempotent: the same reply, no second aggregation
    for _ in range(3):
        assert e0.submit(t0) == first
        assert e0.submit(t0, value=7.0) == first
    assert state_of(server) == after


def _submit_with(edge: FakeEdge, task: pb.Task, **fields) -> pb.SubmitReply:
    req = pb.SubmitRequest(task_id=task.task_id, edge_id=edge.edge_id, num_samples=10,
                           model=encode_arrays(like(task)), latency_s=0.1)
    for k, v in fields.items():
        if isinstance(v, list):
            getattr(req, k).extend(v)
        else:
            setattr(req, k, v)
    return edge.stub.Submit(req, timeout=10)


def test_unknown_clients_and_bad_stats_are_refused(cleanup):
    server, (e0, e1) = federation(cleanup)
    task = e0.next_task()
    member = task.client_ids[0]
    before = state_of(server)
    bad = [
        {"stats": [pb.ClientStat(client_id=99, samples=5, seconds=1, f_applied_ghz=1)]},
        {"stats": [pb.ClientStat(client_id=e1_id, samples=5, seconds=1, f_applied_ghz=1)
                   for e1_id in [1]]},  # client 1 belongs to edge 1
        {"dropped_client_ids": [42]},
        {"stats": [pb.ClientStat(client_id=member, samples=5, seconds=math.nan,
                                 f_applied_ghz=1)]},
        {"stats": [pb.ClientStat(client_id=member, samples=5, seconds=1,
                                 f_applied_ghz=math.inf)]},
        {"stats": [pb.ClientStat(client_id=member, samples=-1, seconds=1, f_applied_ghz=1)]},
        {"stats": [pb.ClientStat(client_id=member, samples=5, seconds=-1, f_applied_ghz=1)]},
        {"latency_s": math.nan},
        {"latency_s": -1.0},
    ]
    for fields in bad:
        assert code_of(lambda: _submit_with(e0, task, **fields)) == INVALID, fields
        assert state_of(server) == before, fields
    assert _submit_with(e0, task, stats=[pb.ClientStat(client_id=member, samples=5, seconds=1,
                                                       f_applied_ghz=1)]).accepted


def test_bad_registrations_and_connects_are_refused(cleanup):
    cfg = make_cfg(3, 2)
    server = start(cfg, expected=3)
    cleanup.append(server)
    ch = channel(server.address)
    cleanup.append(ch)
    assoc = pb_grpc.AssociationStub(ch)
    bad = [
        request("a", [5, -1, 0, 0]),          # negative
        request("b", []),                      # empty
        request("c", [5, 5, 5]),               # wrong length (4 classes)
        request("d", [5, 5, 5, 5, 5]),
        request("e", [0, 0, 0, 0]),            # no samples
        request("f", [5, 5, 5, 5], home=2),    # no such edge
        request("g", [5, 5, 5, 5], home=-1),
        request("", [5, 5, 5, 5]),             # no name
        pb.RegisterRequest(client_name="h", label_counts=[1, 1, 1, 1]),  # no device
    ]
    for req in bad:
        assert code_of(lambda: assoc.Register(req, timeout=5)) == INVALID, req
    assert state_of(server) == {"phase": pb.StatusReply.REGISTERING, "clients": []}
    edge = pb_grpc.EdgeLinkStub(ch)
    for req in (pb.ConnectRequest(edge_id=2, address="x:1"),
                pb.ConnectRequest(edge_id=-1, address="x:1"),
                pb.ConnectRequest(edge_id=0, address="  ")):
        assert code_of(lambda: next(iter(edge.Connect(req, timeout=5)))) == INVALID
    assert not any(e.connected.is_set() for e in server.service.edges.values())


def test_garbage_bytes_get_invalid_argument(cleanup):
    server, (e0, _) = federation(cleanup)
    e0.next_task()
    before = state_of(server)
    ch = channel(server.address)
    cleanup.append(ch)
    for method in ("EdgeLink/Submit", "Association/Register", "Monitor/Status"):
        for data in (b"\xff\xff\xff\xff", b"\x0a\xff", os.urandom(200)):
            with pytest.raises(grpc.RpcError) as err:
                raw(ch, method, data)
            assert err.value.code() == INVALID, (method, data)
            assert "malformed request" in err.value.details()
    stream = ch.unary_stream("/fedcure.v1.EdgeLink/Connect", request_serializer=lambda b: b,
                             response_deserializer=lambda b: b)
    assert code_of(lambda: list(stream(b"\xff\xff", timeout=5))) == INVALID
    assert state_of(server) == before


def test_submits_after_the_end_are_not_aggregated(cleanup):
    import asyncio

    server, (e0, e1) = federation(cleanup, **{"global-rounds": 1, "max-concurrent": 2})
    t0, t1 = e0.next_task(), e1.next_task()
    assert e0.submit(t0).accepted
    assert server.join(10)  # the run is over and the server has stopped
    svc = server.service.controller
    before = (svc.strategy.version, [a.copy() for a in svc.strategy.global_arrays],
              len(svc.records))
    late = pb.SubmitRequest(task_id=t1.task_id, edge_id=1, num_samples=10,
                            model=encode_arrays(like(t1)), latency_s=0.1)
    reply = asyncio.run(server.service.submit(late))
    assert not reply.accepted and "over" in reply.detail
    assert asyncio.run(server.service.submit(late)) == reply  # idempotent too
    assert (svc.strategy.version, len(svc.records)) == (before[0], before[2])
    assert all(np.array_equal(a, b) for a, b in zip(svc.strategy.global_arrays, before[1]))
