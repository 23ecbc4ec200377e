"""Property-based fuzzing of a LIVE cloud: random and mutated messages change nothing.

A cloud on 127.0.0.1 with two fake edges (both coalitions always in flight) and a history of
accepted updates gets random bytes and mutations (bit flips, byte edits, truncations,
insertions, splices) of templates that are invalid in ways a few edits cannot repair: models
that are NaN everywhere or far outside the accepted ones, tasks that were already answered,
registrations for new names after formation. After every message the cloud must still answer,
and its global model, version, queues, estimator, records and in-flight tasks must be exactly
as before, unless the message happened to be a wholly valid update for a task in flight
(then exactly one aggregation, reported as accepted).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import encode_arrays, profile_to_proto
from tests.deployment.fakes import SMALL_MODEL, channel
from tests.deployment.reliability import FAST, federation, raw, state_of

METHODS = ("EdgeLink/Submit", "Association/Register", "Monitor/Status", "EdgeLink/Connect")


@pytest.fixture(scope="module")
def live():
    cleanup: list = []
    server, fakes = federation(cleanup, **{"max-concurrent": 2, "deadline-min-s": 600.0})
    answered = []
    for i in range(4):  # a norm history, and answered tasks to replay
        e = fakes[i % 2]
        task = e.next_task()
        assert e.submit(task, value=0.5 + 0.01 * i).accepted
        answered.append((e.edge_id, task.task_id))
    ch = channel(server.address)
    yield server, fakes, answered, ch
    ch.close()
    for it in reversed(cleanup):
        it.close() if hasattr(it, "close") and not hasattr(it, "stop") else it.stop()


def live_tasks(server) -> list[tuple[int, str]]:
    def grab():
        s = server.service.controller.strategy
        return [(m, t.task_id) for t in list(server.service.controller.tasks.values())
                for m, d in s.in_flight.items() if t.dispatch is d]
    return server.call(grab)


def submit_bytes(task_id: str, edge: int, arrays) -> bytes:
    return pb.SubmitRequest(task_id=task_id, edge_id=edge, num_samples=10, latency_s=0.1,
                            model=encode_arrays(arrays)).SerializeToString()


def templates(server, answered) -> list[tuple[str, bytes]]:
    out = []
    for m, tid in live_tasks(server):
        nan = [np.full_like(a, np.nan) for a in SMALL_MODEL]
        huge = [np.full_like(a, 1e6) for a in SMALL_MODEL]
        out.append(("EdgeLink/Submit", submit_bytes(tid, m, nan)))
        out.append(("EdgeLink/Submit", submit_bytes(tid, m, huge)))
    for m, tid in answered:
        out.append(("EdgeLink/Submit", submit_bytes(tid, m, [np.full_like(a, 3.0)
                                                            for a in SMALL_MODEL])))
    out.append(("Association/Register", pb.RegisterRequest(
        client_name="stranger-after-formation", label_counts=[5, 5, 5, 5],
        device=profile_to_proto(FAST)).SerializeToString()))
    out.append(("Association/Register", pb.RegisterRequest(
        client_name="c0", label_counts=[5, -5, 5, 5],
        device=profile_to_proto(FAST)).SerializeToString()))
    return out


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("splice"), st.integers(0, 10_000), st.integers(0, 10_000)),
)


def mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for op, x, y in ops:
        if not b:
            b = bytearray(b"\x00")
        i = x % len(b)
        if op == "flip":
            b[i] ^= 1 << y
        elif op == "set":
            b[i] = y
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = y
        else:  # splice: repeat a slice of itself (protobuf merges repeated fields)
            j = y % len(b)
            b[i:i] = b[min(i, j):max(i, j)]
    return bytes(b)


def send(ch, method: str, data: bytes):
    """The reply bytes or the status code; never an exception other than RpcError."""
    try:
        if method == "EdgeLink/Connect":
            stream = ch.unary_stream("/fedcure.v1.EdgeLink/Connect",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
            return list(stream(data, timeout=0.3))
        return raw(ch, method, data, timeout=5)
    except grpc.RpcError as err:
        return err.code()


def check(server, ch, before, method, data, result) -> dict:
    after = state_of(server)
    # the cloud still answers
    assert isinstance(send(ch, "Monitor/Status", b""), bytes)
    keys = ("model", "version", "round", "queues", "estimator", "records", "participation",
            "screen", "in_flight")
    if all(after[k] == before[k] for k in keys):
        return after
    if method == "EdgeLink/Submit" and result == grpc.StatusCode.INVALID_ARGUMENT:
        # a coalition model the norm screen refused ends its task, nothing aggregated, and
        # the freed slot is refilled (no client stops an edge): only what is in flight moves
        assert all(after[k] == before[k] for k in keys if k != "in_flight")
        assert len(after["in_flight"]) == len(before["in_flight"])
        return after
    # only a wholly valid update for a task in flight may change the state: one aggregation
    assert method == "EdgeLink/Submit" and isinstance(result, bytes), (method, data, result)
    reply = pb.SubmitReply.FromString(result)
    assert reply.accepted and reply.version == before["version"] + 1
    assert after["version"] == before["version"] + 1
    assert after["records"] == before["records"] + 1
    # and that update was sane: no NaN/Inf and nothing like the 1e6 outlier templates got in
    arrays = server.call(lambda: [a.copy() for a in server.service.controller.strategy.global_arrays])
    assert all(np.isfinite(a).all() and np.abs(a).max() < 1e4 for a in arrays)
    return after


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(method=st.sampled_from(METHODS), data=st.binary(max_size=600))
def test_random_bytes_change_nothing(live, method, data):
    server, _, _, ch = live
    before = state_of(server)
    result = send(ch, method, data)
    check(server, ch, before, method, data, result)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pick=st.integers(0, 1_000), ops=st.lists(mutation, min_size=0, max_size=4))
def test_mutated_messages_change_nothing(live, pick, ops):
    server, _, answered, ch = live
    options = templates(server, answered)
    method, template = options[pick % len(options)]
    data = mutate(template, ops)
    before = state_of(server)
    result = send(ch, method, data)
    check(server, ch, before, method, data, result)
    refused = method == "EdgeLink/Submit" and result == grpc.StatusCode.INVALID_ARGUMENT
    if not ops and not refused:  # an unmutated template never changes anything (duplicates:
        assert state_of(server) == before  # the same reply) but a refused task's end
