"""Hostile input against a live cloud (issue 14): one client or edge cannot stop or corrupt the
federation. Each test sends real gRPC calls to a cloud on 127.0.0.1 and checks the status code,
that the cloud still answers, and that nothing changed: global model, version, queues, records,
in-flight tasks and the checkpoint on disk."""

from __future__ import annotations

import hashlib
import json
import random
import struct
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_server.server import CloudServer
from cloud_server.service import CloudService
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import decode_arrays, encode_arrays
from tests.deployment.fakes import SMALL_MODEL, FakeEdge, channel, make_cfg
from tests.deployment.reliability import (
    one_hot,
    register_all,
    request,
    start,
    state_of,
    wait_until,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT


# ------------------------------------------------------------------------------ helpers
def live(cleanup: list, tmp_path: Path, clients: int = 4, edges: int = 2, **flat
         ) -> tuple[CloudServer, list[FakeEdge]]:
    """A training cloud with checkpoints in ``tmp_path`` and connected fake edges."""
    flat.setdefault("global-rounds", 1000)
    server = start(make_cfg(clients, edges, **flat), expected=clients, out_dir=tmp_path,
                   checkpoint=True)
    cleanup.append(server)
    fakes = [FakeEdge(server.address, m) for m in range(edges)]
    cleanup.extend(fakes)
    register_all(server.address, [request(f"c{i}", one_hot(i), home=i % edges)
                                  for i in range(clients)])
    return server, fakes


def on_disk(tmp_path: Path) -> str:
    """Digest of the checkpoint's state.json (changes with every checkpoint write)."""
    path = tmp_path / "checkpoint" / "state.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


def everything(server: CloudServer, tmp_path: Path | None) -> dict:
    state = state_of(server)
    state["checkpoint"] = on_disk(tmp_path) if tmp_path is not None else None
    state["faults"] = len(server.service.controller.faults)
    return state


def status(server: CloudServer) -> pb.StatusReply:
    """The cloud still answers (Monitor.Status)."""
    ch = channel(server.address)
    try:
        return pb_grpc.MonitorStub(ch).Status(pb.StatusRequest(), timeout=5)
    finally:
        ch.close()


def submit(edge: FakeEdge, task: pb.Task, model: bytes | None = None, **fields
           ) -> pb.SubmitReply:
    """A Submit for ``task`` with a good model unless ``model``, and the given fields."""
    if model is None:
        model = encode_arrays([np.full_like(a, 0.5) for a in decode_arrays(task.model)])
    req = pb.SubmitRequest(task_id=task.task_id, edge_id=edge.edge_id, num_samples=10,
                           model=model, latency_s=0.1)
    for k, v in fields.items():
        if isinstance(v, list):
            getattr(req, k).extend(v)
        else:
            setattr(req, k, v)
    return pb_grpc.EdgeLinkStub(edge.channel).Submit(req, timeout=30)


def model_with_header(header: str, body: bytes = b"\0" * 4) -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + body


def association(cleanup: list, server: CloudServer) -> pb_grpc.AssociationStub:
    ch = channel(server.address)
    cleanup.append(ch)
    return pb_grpc.AssociationStub(ch)


def refused(fn, code: grpc.StatusCode) -> str:
    """Call ``fn``; assert it fails with ``code`` and a short detail; return the detail."""
    with pytest.raises(grpc.RpcError) as err:
        fn()
    assert err.value.code() == code, (err.value.code(), err.value.details()[:200])
    detail = err.value.details() or ""
    assert len(detail) <= 400
    return detail


# ------------------------------------------------------------------------------ 1. energy
def test_1_an_absurd_energy_coefficient_is_refused_at_register(cleanup):
    server = start(make_cfg(2, 1), expected=2)
    cleanup.append(server)
    before = everything(server, None)
    stub = association(cleanup, server)
    for kappa in (1e308, float("inf"), 0.5):
        req = request("greedy", one_hot(0))
        req.device.kappa = kappa
        detail = refused(lambda: stub.Register(req, timeout=5), INVALID)
        assert "kappa" in detail
    assert everything(server, None) == before
    assert status(server).phase == pb.StatusReply.REGISTERING


def test_1_an_update_whose_checkpoint_fails_is_rolled_back_and_retried(cleanup, tmp_path):
    """Aggregation, records and checkpoint together or not at all: the Submit is refused
    (UNAVAILABLE), nothing changed in memory or on disk, and the retry is a real acceptance
    that is on disk."""
    server, (e0, _) = live(cleanup, tmp_path)
    svc = server.service.controller
    task = e0.next_task()
    before = everything(server, tmp_path)
    store = svc.checkpoints
    real = store.save
    calls = []

    def broken(*args, **kw):
        calls.append(1)
        raise OSError(28, "No space left on device")

    store.save = broken
    for _ in range(2):  # the same refusal on a retry while the disk is full
        detail = refused(lambda: submit(e0, task), grpc.StatusCode.UNAVAILABLE)
        assert "not aggregated" in detail
        assert everything(server, tmp_path) == before
    assert len(calls) == 2 and status(server).version == before["version"]
    store.save = real
    reply = submit(e0, task)
    assert reply.accepted and reply.version == before["version"] + 1
    saved = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert saved["strategy"]["version"] == reply.version
    assert submit(e0, task) == reply  # a duplicate: the same reply, nothing applied twice
    assert state_of(server)["version"] == reply.version


# ------------------------------------------------------------------------------ 2. formation
@pytest.mark.parametrize("field, value", [
    ("cycles_per_sample", 1e308), ("uplink_mbps", 5e-324), ("downlink_mbps", 1e300),
    ("f_max_ghz", 1e6), ("f_min_ghz", 1e-9)])
def test_2_an_unusable_profile_is_refused_at_register_and_the_others_go_on(cleanup, field, value):
    server = start(make_cfg(2, 1, **{"global-rounds": 3}), expected=2)
    cleanup.append(server)
    edge = FakeEdge(server.address, 0)
    cleanup.append(edge)
    stub = association(cleanup, server)
    bad = request("bad", one_hot(0))
    if field == "cycles_per_sample":
        bad.device.cycles_per_sample["digits"] = value
    else:
        setattr(bad.device, field, value)
    detail = refused(lambda: stub.Register(bad, timeout=5), INVALID)
    assert field in detail
    assert status(server).clients_registered == 0
    # the others register, formation runs, training goes on
    replies = register_all(server.address, [request(f"c{i}", one_hot(i)) for i in range(2)])
    assert [r.edge_id for r in replies] == [0, 0]
    assert edge.submit(edge.next_task()).accepted


def test_2_a_formation_error_is_reported_without_ending_the_cloud(cleanup):
    server = start(make_cfg(2, 1, **{"global-rounds": 3}), expected=2)
    cleanup.append(server)
    edge = FakeEdge(server.address, 0)
    cleanup.append(edge)
    svc = server.service.controller
    real = svc.build_initial_arrays
    svc.build_initial_arrays = lambda: (_ for _ in ()).throw(RuntimeError("model build failed"))
    ch = channel(server.address)
    cleanup.append(ch)
    stub = pb_grpc.AssociationStub(ch)
    futs = [stub.Register.future(request(f"c{i}", one_hot(i)), timeout=20) for i in range(2)]
    for f in futs:
        with pytest.raises(grpc.RpcError) as err:
            f.result()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "formation failed" in err.value.details()
    # the cloud is up and still registering; the failure is in the faults list
    reply = status(server)
    assert reply.phase == pb.StatusReply.REGISTERING and reply.clients_registered == 2
    assert any(f["kind"] == "formation-failed" for f in svc.faults)
    # the cause goes away, the clients call again: formation runs and training goes on
    svc.build_initial_arrays = real
    replies = register_all(server.address, [request(f"c{i}", one_hot(i)) for i in range(2)])
    assert [r.client_id for r in replies] == [0, 1]
    assert edge.submit(edge.next_task()).accepted
    assert status(server).phase == pb.StatusReply.TRAINING


# ------------------------------------------------------------------------------ 3. models
HOSTILE_MODELS = {
    "huge shape": '{"0000": {"dtype": "F32", "shape": [0, ' + str(10**30) + '], '
                  '"data_offsets": [0, 0]}}',
    "65 dimensions": '{"0000": {"dtype": "F32", "shape": [' + ", ".join(["1"] * 65) + '], '
                     '"data_offsets": [0, 4]}}',
    "JSON 200000 deep": "[" * 200_000 + "]" * 200_000,
    "5000-digit integer": '{"0000": {"dtype": "F32", "shape": [' + "7" * 5000 + '], '
                          '"data_offsets": [0, 4]}}',
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_MODELS))
def test_3_malformed_models_are_invalid_argument(cleanup, tmp_path, kind):
    server, (e0, _) = live(cleanup, tmp_path)
    task = e0.next_task()
    before = everything(server, tmp_path)
    refused(lambda: submit(e0, task, model_with_header(HOSTILE_MODELS[kind])), INVALID)
    assert everything(server, tmp_path) == before
    assert status(server).phase == pb.StatusReply.TRAINING
    assert submit(e0, task).accepted  # the task is still open


# ------------------------------------------------------------------------------ 4. repeats
def test_4_unbounded_repeated_fields_are_refused_fast(cleanup, tmp_path):
    server, (e0, _) = live(cleanup, tmp_path)
    task = e0.next_task()
    member = task.client_ids[0]
    before = everything(server, tmp_path)
    stat = pb.ClientStat(client_id=member, edge_round=0, samples=5, seconds=1.0,
                         f_applied_ghz=1.0, loss=1.0)
    cases = {
        "dropped_client_ids": {"dropped_client_ids": [member] * 3_000_000},
        "repeats a client": {"dropped_client_ids": [member, member]},
        "reported twice": {"stats": [stat, stat]},
        "at most one per member": {"stats": [stat] * 20_000},
        "edge_round": {"stats": [pb.ClientStat(client_id=member, edge_round=99, samples=5,
                                               seconds=1.0, f_applied_ghz=1.0)]},
    }
    for needle, fields in cases.items():
        detail = refused(lambda: submit(e0, task, **fields), INVALID)
        assert needle in detail, (needle, detail)
        assert everything(server, tmp_path) == before, needle
    assert status(server).version == before["version"]
    reply = submit(e0, task, stats=[stat])
    assert reply.accepted
    assert server.service.controller.records[-1]["energy_j"] > 0


# ------------------------------------------------------------------------------ 5. echo
def test_5_long_request_text_is_never_echoed_whole(cleanup, tmp_path):
    server, (e0, _) = live(cleanup, tmp_path)
    task = e0.next_task()
    before = everything(server, tmp_path)
    long_id = "x" * 20_000
    detail = refused(lambda: submit(e0, task, task_id=long_id), grpc.StatusCode.NOT_FOUND)
    assert "unknown task id" in detail and len(detail) < 200
    stub = pb_grpc.AssociationStub(e0.channel)
    detail = refused(lambda: stub.Register(request("n" * 20_000, one_hot(0)), timeout=5),
                     INVALID)
    assert "client_name" in detail
    detail = refused(lambda: stub.Register(request("late-" + "y" * 100, one_hot(0)),
                                           timeout=5), grpc.StatusCode.FAILED_PRECONDITION)
    assert "y" * 60 not in detail
    assert everything(server, tmp_path) == before


# ------------------------------------------------------------------------------ 6. identity
def test_6_an_edge_cannot_act_as_another_edge(cleanup, tmp_path):
    from cloud_server.identity import EdgeCredentials, new_edge_tokens

    tokens = new_edge_tokens(2)
    service = CloudService(
        make_cfg(4, 2, **{"global-rounds": 1000}), expected_clients=4, register_timeout_s=20,
        token="shared-client-secret", initial_arrays=SMALL_MODEL, write_plots=False,
        out_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoint",
        edge_credentials=EdgeCredentials(tokens))
    server = CloudServer(service, "127.0.0.1:0")
    server.start()
    cleanup.append(server)
    e0 = FakeEdge(server.address, 0, token=tokens[0])
    e1 = FakeEdge(server.address, 1, token=tokens[1])
    cleanup.extend([e0, e1])
    register_all(server.address, [request(f"c{i}", one_hot(i), home=i % 2,
                                          token="shared-client-secret") for i in range(4)])
    task = e0.next_task()
    e1.next_task()
    before = everything(server, tmp_path)
    link = pb_grpc.EdgeLinkStub(e1.channel)
    denied = grpc.StatusCode.PERMISSION_DENIED
    # edge 1's channel and token, asking as edge 0
    req = pb.SubmitRequest(task_id=task.task_id, edge_id=0, num_samples=10, latency_s=0.1,
                           token=tokens[1], model=encode_arrays(
                               [np.full_like(a, 0.5) for a in decode_arrays(task.model)]))
    refused(lambda: link.Submit(req, timeout=10), denied)
    refused(lambda: link.Members(pb.MembersRequest(edge_id=0, token=tokens[1]), timeout=5),
            denied)
    refused(lambda: next(iter(link.Connect(pb.ConnectRequest(
        edge_id=0, address="127.0.0.1:1", token=tokens[1]), timeout=5))), denied)
    # the shared client token is no edge credential
    req.token = "shared-client-secret"
    refused(lambda: link.Submit(req, timeout=10), grpc.StatusCode.UNAUTHENTICATED)
    assert everything(server, tmp_path) == before
    assert service.edges[0].connects == 1
    # edge 0 with its own token is accepted
    req.token = tokens[0]
    assert pb_grpc.EdgeLinkStub(e0.channel).Submit(req, timeout=10).accepted


# ------------------------------------------------------------------------------ 7. overflow
def test_7_label_counts_whose_sum_wraps_are_refused(cleanup):
    server = start(make_cfg(2, 1), expected=2)
    cleanup.append(server)
    stub = association(cleanup, server)
    for counts in ([2**62 - 1] * 4, [2**62, 2**62, 2**62, 2**62 - 5], [10**9 + 1, 0, 0, 0]):
        detail = refused(lambda: stub.Register(request("wrap", counts), timeout=5), INVALID)
        assert "label_counts" in detail
    assert everything(server, None) == {"phase": pb.StatusReply.REGISTERING, "clients": [],
                                        "checkpoint": None, "faults": 0}


# ------------------------------------------------------------------------------ 8. failover
def test_8_availability_changes_and_their_faults_are_recorded_together(cleanup):
    """Whoever sees coalition 0 lost (or back) also sees the fault saying so: the fault is
    recorded before the state changes, under the same lock."""
    server = start(make_cfg(4, 2, **{"global-rounds": 1000, "max-concurrent": 2,
                                     "deadline-min-s": 0.5, "first-deadline-s": 0.5}),
                   expected=4)
    cleanup.append(server)
    e0, e1 = FakeEdge(server.address, 0), FakeEdge(server.address, 1)
    cleanup.extend([e0, e1])
    register_all(server.address, [request(f"c{i}", one_hot(i), home=i % 2) for i in range(4)])
    svc = server.service.controller
    seen: list[tuple[str, int, bool]] = []
    s = svc.strategy
    real_lost, real_back = s.mark_unavailable, s.mark_available

    def lost(m: int) -> None:
        seen.append(("lost", m, any(f["kind"] == "lost" and f["coalition"] == m
                                    for f in svc.faults)))
        real_lost(m)

    def back(m: int) -> None:
        seen.append(("back", m, any(f["kind"] == "back" and f["coalition"] == m
                                    for f in svc.faults)))
        real_back(m)

    s.mark_unavailable, s.mark_available = lost, back
    e0.next_task()
    e0.close()  # edge 0 holds its task and goes away: the deadline marks it lost
    wait_until(lambda: 0 in svc.strategy.unavailable, 20)
    e0 = FakeEdge(server.address, 0)  # it comes back
    cleanup.append(e0)
    wait_until(lambda: 0 not in svc.strategy.unavailable, 20)
    assert [x for x in seen if x[1] == 0][:2] == [("lost", 0, True), ("back", 0, True)]
    assert all(ok for _, _, ok in seen)
    assert status(server).phase == pb.StatusReply.TRAINING


# ------------------------------------------------------------------------------ 9. soak
@settings(max_examples=80, deadline=None)
@given(seconds=st.floats(30.0, 3600.0), every=st.floats(1.0, 600.0), seed=st.integers(0, 2**31))
def test_9_the_soak_kills_the_cloud_mid_run_at_least_twice(seconds, every, seed):
    """Any soak of 30 s or more plans ≥ 2 cloud kills, each mid-run: at least 5 s after the
    start and 5 s before the end, spaced so that the cloud can resume in between."""
    from bench.soak import cloud_kill_times

    times = cloud_kill_times(seconds, every, random.Random(seed))
    assert len(times) >= 2
    assert all(5.0 <= t <= seconds - 5.0 for t in times)
    assert times == sorted(times) and all(b - a >= 5.0 - 1e-9 for a, b in zip(times, times[1:]))
