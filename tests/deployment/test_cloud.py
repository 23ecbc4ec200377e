"""A live cloud on 127.0.0.1 with fake edges and fake clients (generated stubs, real gRPC)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import decode_arrays
from tests.deployment.fakes import (
    SMALL_MODEL,
    FakeEdge,
    channel,
    make_cfg,
    register_request,
    start_cloud,
)


def one_hot(c: int, classes: int = 4, n: int = 20) -> list[int]:
    out = [0] * classes
    out[c % classes] = n
    return out


def register_all(address: str, reqs: list[pb.RegisterRequest], timeout: float = 20.0):
    ch = channel(address)
    stub = pb_grpc.AssociationStub(ch)
    try:
        with ThreadPoolExecutor(len(reqs)) as pool:
            return list(pool.map(lambda r: stub.Register(r, timeout=timeout), reqs))
    finally:
        ch.close()


def status(address: str) -> pb.StatusReply:
    ch = channel(address)
    try:
        return pb_grpc.MonitorStub(ch).Status(pb.StatusRequest(), timeout=5)
    finally:
        ch.close()


def federation(cleanup, clients=6, edges=3, *, out_dir=None, fast=False, evaluator=None,
               gpu: dict[int, float] | None = None, **flat):
    """A running cloud with connected fake edges and registered clients (home ES = i % M);
    ``gpu``: client index -> the samples/s it registers as a ``cuda`` client."""
    cfg = make_cfg(clients, edges, **flat)
    server = start_cloud(cfg, expected=clients, out_dir=out_dir, evaluator=evaluator)
    cleanup.append(server)
    fakes = [FakeEdge(server.address, m, fast=fast) for m in range(edges)]
    cleanup.extend(fakes)
    reqs = [register_request(f"client-{i}", one_hot(i), home=i % edges) for i in range(clients)]
    for i, rate in (gpu or {}).items():
        reqs[i].compute_device, reqs[i].samples_per_s = "cuda", rate
    replies = register_all(server.address, reqs)
    return server, fakes, reqs, replies


# ------------------------------------------------------------------------------ association
def test_concurrent_registration_answers_every_client_with_its_es(cleanup):
    server, fakes, reqs, replies = federation(cleanup, clients=9, edges=3)
    # ids in natural name order, whatever the arrival order
    assert [r.client_id for r in replies] == list(range(9))
    # formation "none" keeps the home ESs; the address is that ES's Connect address
    for i, r in enumerate(replies):
        assert r.edge_id == i % 3
        assert r.edge_address == fakes[r.edge_id].address
        assert (r.num_clients, r.num_edges) == (9, 3)
    s = status(server.address)
    assert s.phase == pb.StatusReply.TRAINING and s.clients_registered == 9
    assert s.edges_connected == 3 and sorted(s.in_flight) == [0, 1, 2]
    # registering the same name again gives the same answer; a new name is refused
    again = register_all(server.address, [reqs[4]])[0]
    assert again == replies[4]
    with pytest.raises(grpc.RpcError) as err:
        register_all(server.address, [register_request("late", one_hot(0), home=0)])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "registration is closed" in err.value.details()


def test_registration_follows_the_formation_rule(cleanup):
    from fedcure_app.core.coalition import form_coalitions

    n, m = 12, 3
    cfg = make_cfg(n, m, formation="fedcure")
    server = start_cloud(cfg, expected=n)
    cleanup.append(server)
    cleanup.extend(FakeEdge(server.address, e) for e in range(m))
    # edge non-IID start: ES e holds classes {e, e+1 mod 4}... one class per client
    homes = [i * m // n for i in range(n)]
    counts = [one_hot(homes[i] + (i % 2)) for i in range(n)]
    reqs = [register_request(f"c{i}", counts[i], home=homes[i]) for i in range(n)]
    replies = register_all(server.address, reqs[::-1])[::-1]
    expected = form_coalitions(np.array(counts), np.array(homes), m, rule="fedcure",
                               seed=cfg.run.seed).assignment
    assert [r.edge_id for r in replies] == [int(e) for e in expected]
    assert server.service.controller.strategy.coalitions == [
        tuple(np.flatnonzero(np.asarray(expected) == e)) for e in range(m)]


def test_register_times_out_with_a_clear_status_and_bad_requests_are_refused(cleanup):
    cfg = make_cfg(4, 2)
    server = start_cloud(cfg, expected=4, timeout=0.5)
    cleanup.append(server)
    with pytest.raises(grpc.RpcError) as err:
        register_all(server.address, [register_request("a", one_hot(0), home=0)])
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "1 of 4 expected clients" in err.value.details()
    bad = [
        register_request("", one_hot(0)),
        register_request("x", [1, 2]),                 # wrong number of classes
        register_request("x", [0, 0, 0, 0]),           # no samples
        register_request("x", one_hot(0), home=7),     # no such ES
        pb.RegisterRequest(client_name="x", label_counts=one_hot(0)),  # no profile
    ]
    for req in bad:
        with pytest.raises(grpc.RpcError) as err:
            register_all(server.address, [req])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, req


def test_a_wrong_token_is_unauthenticated(cleanup):
    server = start_cloud(make_cfg(2, 1), expected=2, token="s3cret")
    cleanup.append(server)
    with pytest.raises(grpc.RpcError) as err:
        register_all(server.address, [register_request("a", one_hot(0), token="nope")])
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    edge = FakeEdge(server.address, 0, token="wrong")
    cleanup.append(edge)
    assert edge.ended.wait(5)
    assert edge.end is not None and edge.end.code() == grpc.StatusCode.UNAUTHENTICATED


# ------------------------------------------------------------------------------ edge link
@pytest.mark.parametrize("fast", [False, True], ids=["plain-stub", "fast-wire"])
def test_submit_aggregates_with_the_staleness_weight(cleanup, fast):
    server, fakes, _, replies = federation(cleanup, clients=6, edges=3, fast=fast,
                                           **{"max-concurrent": 3})
    strategy = server.service.controller.strategy
    tasks = [f.next_task() for f in fakes]
    assert [t.coalition for t in tasks] == [0, 1, 2] and {t.version for t in tasks} == {0}
    for t in tasks:
        assert sorted(t.client_ids) == [r.client_id for r in replies if r.edge_id == t.coalition]
        assert set(t.frequencies_ghz) == set(t.client_ids)
        assert all(np.array_equal(a, b) for a, b in zip(decode_arrays(t.model), SMALL_MODEL))
    ell, k = 0.2, 0.95
    r0 = fakes[0].submit(tasks[0], value=1.0)
    assert r0.accepted and r0.version == 1
    assert np.allclose(strategy.global_arrays[0], ell)           # staleness 0: ξ = ℓ
    r1 = fakes[1].submit(tasks[1], value=1.0)                      # trained from v0, now v1
    assert r1.accepted and r1.version == 2
    xi = ell * k
    assert np.allclose(strategy.global_arrays[0], (1 - xi) * ell + xi)
    assert server.service.controller.records[1]["staleness"] == 1
    assert server.service.controller.records[1]["xi"] == pytest.approx(xi)
    # the freed slots are refilled: coalition 0 gets a new task from the new version
    nxt = fakes[0].next_task()
    assert nxt.version >= 1 and nxt.task_id != tasks[0].task_id


def test_duplicate_submit_is_idempotent(cleanup):
    server, fakes, _, _ = federation(cleanup, clients=4, edges=2)
    t = fakes[0].next_task()
    first = fakes[0].submit(t, value=1.0)
    snapshot = [a.copy() for a in server.service.controller.strategy.global_arrays]
    second = fakes[0].submit(t, value=5.0)
    assert second == first
    assert server.service.controller.strategy.version == 1 and len(server.service.controller.records) == 1
    assert all(np.array_equal(a, b) for a, b in
               zip(snapshot, server.service.controller.strategy.global_arrays))


def _state(server):
    s = server.service.controller.strategy
    return (s.version, s.round, sorted(s.in_flight), [a.copy() for a in s.global_arrays],
            len(server.service.controller.records))


def _same_state(a, b) -> bool:
    return a[:3] == b[:3] and a[4] == b[4] and all(np.array_equal(x, y) for x, y in zip(a[3], b[3]))


@pytest.mark.parametrize(
    ("kwargs", "code", "needle"),
    [
        ({"task_id": "r9-c9-v9"}, grpc.StatusCode.NOT_FOUND, "unknown task id"),
        ({"arrays": [np.ones((3, 2), np.float32), np.ones(3, np.float32)]},
         grpc.StatusCode.INVALID_ARGUMENT, "shape"),
        ({"arrays": [np.ones((2, 3), np.float32)]}, grpc.StatusCode.INVALID_ARGUMENT, "tensors"),
        ({"arrays": [np.ones((2, 3)), np.ones(3)]}, grpc.StatusCode.INVALID_ARGUMENT, "dtype"),
        ({"model": b"\x00garbage"}, grpc.StatusCode.INVALID_ARGUMENT, "safetensors"),
        ({"edge_id": 1}, grpc.StatusCode.INVALID_ARGUMENT, "belongs to edge 0"),
        ({"samples": 0}, grpc.StatusCode.INVALID_ARGUMENT, "num_samples"),
    ],
)
def test_bad_submissions_are_refused_and_change_nothing(cleanup, kwargs, code, needle):
    server, fakes, _, _ = federation(cleanup, clients=4, edges=2)
    t = fakes[0].next_task()
    before = _state(server)
    with pytest.raises(grpc.RpcError) as err:
        fakes[0].submit(t, **kwargs)
    assert err.value.code() == code
    assert needle in err.value.details()
    assert _same_state(before, _state(server))
    # the task is still open: a correct answer is aggregated
    assert fakes[0].submit(t).accepted


def test_a_reconnecting_edge_gets_its_unanswered_task_again(cleanup):
    server, fakes, _, _ = federation(cleanup, clients=4, edges=2)
    t = fakes[1].next_task()
    again = FakeEdge(server.address, 1)
    cleanup.append(again)
    resent = again.next_task()
    assert resent.task_id == t.task_id and resent.model == t.model
    assert fakes[1].ended.wait(5)                 # the older stream is replaced
    assert fakes[1].end.code() == grpc.StatusCode.ABORTED
    assert again.submit(resent).accepted
    assert server.service.controller.strategy.version == 1


def test_run_to_the_end_writes_results_and_closes_the_streams(cleanup, tmp_path: Path):
    rounds = 5
    server, fakes, _, _ = federation(cleanup, clients=4, edges=2, out_dir=tmp_path,
                                     **{"global-rounds": rounds})
    done = 0
    replies = []
    while done < rounds:
        for f in fakes:
            if not f.tasks.empty():
                replies.append(f.submit(f.next_task(), value=float(done + 1)))
                done += 1
                if done == rounds:
                    break
    assert [r.version for r in replies if r.accepted] == list(range(1, rounds + 1))
    # (results and plots are written after the last reply: allow a loaded machine its time)
    assert server.join(60), "the cloud should stop on its own after the last round"
    for f in fakes:
        assert f.ended.wait(5) and f.end is None           # status OK
    result = json.loads((tmp_path / "result.json").read_text())
    for key in ("config", "dataset", "initial_accuracy", "final_accuracy", "best_accuracy",
                "rounds", "wall_seconds", "energy_j", "latency_cov", "coalitions",
                "participation", "records"):
        assert key in result
    assert result["rounds"] == rounds and result["final_version"] == rounds
    rec = result["records"][0]
    for key in ("round", "time_s", "coalition", "staleness", "xi", "latency_s", "estimate_s",
                "version", "queues", "dispatched", "frequencies_ghz", "energy_j", "accuracy",
                "loss"):
        assert key in rec
    assert rec["energy_j"] > 0 and rec["latency_s"] > 0
    assert sum(result["participation"]["rounds"]) == rounds
    final = decode_arrays((tmp_path / "final_model.safetensors").read_bytes())
    assert all(np.array_equal(a, b) for a, b in zip(final, server.service.controller.strategy.global_arrays))
    for png in ("accuracy.png", "queues.png", "participation.png"):
        assert (tmp_path / png).stat().st_size > 0


def test_result_json_names_each_clients_device_and_measured_rate(cleanup, tmp_path: Path):
    """A client that registers as ``cuda`` with its measured rate is listed so in result.json,
    and its latency prior takes 1/rate per sample at f_max (the cycles the cloud keeps)."""
    server, fakes, reqs, _ = federation(cleanup, clients=4, edges=2, out_dir=tmp_path,
                                        gpu={1: 5000.0}, **{"global-rounds": 2})
    done = 0
    while done < 2:
        for f in fakes:
            if not f.tasks.empty() and done < 2:
                f.submit(f.next_task(), value=1.0)
                done += 1
    assert server.join(60)
    entry = server.service.controller.roster.clients["client-1"]
    assert entry.profile.cycles_for("digits") == pytest.approx(
        entry.profile.f_max_ghz * 1e9 / 5000.0)
    clients = {c["name"]: c for c in json.loads((tmp_path / "result.json").read_text())["clients"]}
    assert (clients["client-1"]["compute_device"], clients["client-1"]["samples_per_s"]) == (
        "cuda", 5000.0)
    assert all((clients[f"client-{i}"]["compute_device"], clients[f"client-{i}"]["samples_per_s"])
               == ("cpu", None) for i in (0, 2, 3))


def test_a_measured_rate_sets_the_cycles_of_the_prior_and_bad_values_are_refused():
    from cloud_server import validation as door
    from fedcure_app.devices import PRESETS

    prof = PRESETS["rpi4"]
    got = door.measured_profile(prof, "digits", 2000.0)
    assert got.cycles_for("digits") == pytest.approx(prof.f_max_ghz * 1e9 / 2000.0)
    assert got.cycles_for("mnist") == prof.cycles_for("mnist")   # other models untouched
    assert door.check_compute("", 0.0) == ("cpu", 0.0)
    assert door.check_compute("cuda", 10.0) == ("cuda", 10.0)
    for device, rate in (("tpu", 0.0), ("cuda", -1.0), ("cuda", float("nan")), ("cpu", 1e12)):
        with pytest.raises(door.Refused):
            door.check_compute(device, rate)


def test_register_waits_for_the_assigned_edge_to_connect(cleanup):
    server = start_cloud(make_cfg(2, 2), expected=2, timeout=1.0)
    cleanup.append(server)
    cleanup.append(FakeEdge(server.address, 0))
    ch = channel(server.address)
    cleanup.append(ch)
    stub = pb_grpc.AssociationStub(ch)
    futs = [stub.Register.future(register_request(f"c{i}", one_hot(i), home=i), timeout=10)
            for i in range(2)]
    assert futs[0].result().edge_id == 0
    with pytest.raises(grpc.RpcError) as err:
        futs[1].result()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "edge 1, which has not connected" in err.value.details()
    late = FakeEdge(server.address, 1)
    cleanup.append(late)
    reply = stub.Register(register_request("c1", one_hot(1), home=1), timeout=10)
    assert (reply.client_id, reply.edge_id, reply.edge_address) == (1, 1, late.address)


def test_the_global_model_is_evaluated_every_eval_every_rounds(cleanup):
    seen = []

    def evaluator(arrays):
        seen.append(float(arrays[0].mean()))
        return seen[-1], 1.0 - seen[-1]

    server, fakes, _, _ = federation(cleanup, clients=4, edges=2, evaluator=evaluator,
                                     **{"global-rounds": 3, "eval-every": 2,
                                        "max-concurrent": 2})
    for f in fakes:
        f.submit(f.next_task(), value=1.0)
    fakes[0].submit(fakes[0].next_task(), value=1.0)
    assert server.join(10)
    recs = server.service.controller.records
    assert [r["accuracy"] is not None for r in recs] == [False, True, True]
    assert server.service.controller.initial_accuracy == 0.0
    assert recs[1]["accuracy"] == pytest.approx(server.service.controller.result["records"][1]["accuracy"])
    assert server.service.controller.result["final_accuracy"] == pytest.approx(
        float(server.service.controller.strategy.global_arrays[0].mean()))


def test_formation_runs_when_the_registration_window_closes(cleanup):
    server = start_cloud(make_cfg(4, 2), expected=4, timeout=0.5)
    cleanup.append(server)
    edges = [FakeEdge(server.address, m) for m in range(2)]
    cleanup.extend(edges)
    replies = register_all(server.address,
                           [register_request(f"c{i}", one_hot(i), home=i) for i in range(2)])
    assert [(r.client_id, r.edge_id, r.num_clients) for r in replies] == [(0, 0, 2), (1, 1, 2)]
    assert status(server.address).phase == pb.StatusReply.TRAINING
    with pytest.raises(grpc.RpcError) as err:
        register_all(server.address, [register_request("c9", one_hot(0), home=0)])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_stopping_the_cloud_early_ends_edge_streams_with_unavailable(cleanup):
    server, fakes, _, _ = federation(cleanup, clients=4, edges=2)
    fakes[0].next_task()
    server.stop()
    for f in fakes:
        assert f.ended.wait(5)
        assert f.end is not None and f.end.code() == grpc.StatusCode.UNAVAILABLE


# ------------------------------------------------------------------------------ reachability
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=100, deadline=None)
@given(lat=st.lists(st.floats(1e-3, 1e4), min_size=1, max_size=8), data=st.data())
def test_reachable_shares_bound_what_k_slots_allow(lat, data):
    from cloud_server.reach import max_shares

    m = len(lat)
    k = data.draw(st.integers(1, m))
    cap = max_shares(np.array(lat), k)
    assert np.all((cap > 0) & (cap <= 1 + 1e-12))
    rate = 1 / np.array(lat)
    if k == m:  # every coalition always in flight: the shares are the rates' shares exactly
        assert np.allclose(cap, rate / rate.sum())
        assert np.isclose(cap.sum(), 1.0)
    if k == 1:
        assert np.allclose(cap, 1.0)
    if k > 1:  # more slots for the others can only lower what one coalition gets
        assert np.all(max_shares(np.array(lat), k - 1) >= cap - 1e-12)


def test_an_unreachable_target_share_is_warned_in_the_log_and_result(cleanup, tmp_path, caplog):
    """Coalition 0 is 10^5 times slower than coalition 1 and both are always in flight (K = M):
    it can get about 10^-5 of the rounds, far below its target share δ_0."""
    from tests.deployment.reliability import FAST, TIMED, request, start

    cfg = make_cfg(2, 2, **{"global-rounds": 2, "max-concurrent": 2})
    server = start(cfg, expected=2, out_dir=tmp_path)  # no plots: fast on a loaded machine
    cleanup.append(server)
    fakes = [FakeEdge(server.address, m) for m in range(2)]
    cleanup.extend(fakes)
    slow = TIMED.model_copy(update={"cycles_per_sample": {"digits": 1e9}})
    with caplog.at_level("WARNING", logger="fedcure.cloud"):
        register_all(server.address, [request("c0", one_hot(0), home=0, profile=slow),
                                      request("c1", one_hot(1), home=1, profile=FAST)])
    assert any("out of reach" in r.getMessage() and "coalition 0" in r.getMessage()
               for r in caplog.records)
    for _ in range(2):
        fakes[1].submit(fakes[1].next_task())
    assert server.join(10)
    result = json.loads((tmp_path / "result.json").read_text())
    warned = [w for w in result["warnings"] if w["kind"] == "unreachable-share"]
    assert warned and warned[0]["coalition"] == 0
    assert warned[0]["max_share"] < warned[0]["delta"]
    assert result["participation"]["max_share"][0] < result["participation"]["delta"][0]
