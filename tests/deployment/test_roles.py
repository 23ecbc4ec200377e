"""The edge and client roles in one process: Claim, node data, the node directory, the
ClientApp's deployed path, and a whole run of EdgeServers against a real cloud service with
in-process "SuperNodes" (FakeGrid nodes running the real ClientApp)."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from client.cli import build_node_data, config_of
from edge_server.directory import NodeDirectory
from edge_server.serve import EdgeServer
from edge_server.settings import EdgeSettings, SettingsError
from fedcure_app.flower import client_app
from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.models import build_model, get_weights
from fedcure_app.flower.node_data import (
    NodeData,
    NodeDataError,
    load_node_data,
    read_applied,
    save_node_data,
)
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from tests.deployment.fakes import channel, make_cfg, register_request, start_cloud
from tests.simulation.fake_grid import FakeGrid, task_identity


@pytest.fixture(autouse=True)
def _identity():
    with task_identity():
        yield


def _args(**kw) -> argparse.Namespace:
    base = {"dataset": None, "num_partitions": None, "data_dir": None}
    base.update(kw)
    return argparse.Namespace(**base)


# ------------------------------------------------------------------------------ Claim
def test_claim_gives_stable_first_come_indices_and_the_config(cleanup):
    cfg = make_cfg(3, 1)
    server = start_cloud(cfg, expected=3)
    cleanup.append(server)
    stub = pb_grpc.AssociationStub(channel(server.address))
    a = stub.Claim(pb.ClaimRequest(client_name="a"))
    b = stub.Claim(pb.ClaimRequest(client_name="b", partition_id=2))
    c = stub.Claim(pb.ClaimRequest(client_name="c"))
    assert (a.partition_id, b.partition_id, c.partition_id) == (0, 2, 1)
    assert a.num_partitions == 3
    assert stub.Claim(pb.ClaimRequest(client_name="b")).partition_id == 2  # stable
    back = config_of(a, _args())
    assert back == cfg
    codes = {}
    for req in (pb.ClaimRequest(client_name="d"), pb.ClaimRequest(client_name="e", partition_id=1),
                pb.ClaimRequest(client_name="f", partition_id=3),
                pb.ClaimRequest(client_name="a", partition_id=1),
                pb.ClaimRequest(client_name="")):
        with pytest.raises(grpc.RpcError) as err:
            stub.Claim(req)
        codes[req.client_name] = err.value.code()
    assert codes == {"d": grpc.StatusCode.RESOURCE_EXHAUSTED,
                     "e": grpc.StatusCode.ALREADY_EXISTS,
                     "f": grpc.StatusCode.INVALID_ARGUMENT,
                     "a": grpc.StatusCode.FAILED_PRECONDITION,
                     "": grpc.StatusCode.INVALID_ARGUMENT}
    with pytest.raises(ValueError, match="differs from the cloud's dataset"):
        config_of(a, _args(dataset="mnist"))
    with pytest.raises(ValueError, match="num-partitions 5 differs"):
        config_of(a, _args(num_partitions=5))


def test_client_ids_follow_claimed_partitions_not_names(cleanup):
    cfg = make_cfg(3, 1)
    server = start_cloud(cfg, expected=3)
    cleanup.append(server)
    stub = pb_grpc.AssociationStub(channel(server.address))
    names = {"zeta": 0, "alpha": 1, "mid": 2}  # natural name order would be alpha, mid, zeta
    for name, index in names.items():
        stub.Claim(pb.ClaimRequest(client_name=name, partition_id=index))
    from tests.deployment.fakes import FakeEdge

    edge = FakeEdge(server.address, 0)
    cleanup.append(edge)
    replies: dict[str, int] = {}

    def reg(name: str) -> None:
        replies[name] = stub.Register(register_request(name, [1, 1, 1, 1], home=0),
                                      timeout=20).client_id

    threads = [threading.Thread(target=reg, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert replies == names


# ------------------------------------------------------------------------------ node data
def _profile():
    from fedcure_app.devices import PRESETS

    return PRESETS["rpi4"]


def test_node_data_round_trip_and_errors(tmp_path: Path):
    x = np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32)
    y = np.array([0, 1, 1, 3, 9])
    data = NodeData(x=x, y=y, dataset="digits", num_classes=10, client_name="n",
                    partition_id=4, profile=_profile())
    path = save_node_data(tmp_path / "d.npz", data)
    back = load_node_data(path)
    assert np.array_equal(back.x, x) and np.array_equal(back.y, y)
    assert back.profile == data.profile and back.partition_id == 4
    assert back.label_counts.tolist() == [1, 2, 0, 1, 0, 0, 0, 0, 0, 1]
    with pytest.raises(NodeDataError, match="not found"):
        load_node_data(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"garbage")
    with pytest.raises(NodeDataError, match="not readable"):
        load_node_data(tmp_path / "bad.npz")


def test_edge_settings_round_trip(tmp_path: Path):
    s = EdgeSettings(cloud="127.0.0.1:1", edge_id=2, advertise="e:9", token="t")
    p = s.save(tmp_path / "edge.json")
    assert EdgeSettings.load(p) == s
    assert p.stat().st_mode & 0o077 == 0  # holds the token: owner only
    p.write_text('{"cloud": "x", "edge_id": 0, "advertise": "y", "nope": 1}')
    with pytest.raises(SettingsError, match="unknown keys"):
        EdgeSettings.load(p)


# ------------------------------------------------------------------------------ ClientApp
def _deployed_ctx(path: Path, client: int, cpufreq: str = "emulate") -> Context:
    return Context(run_id=1, node_id=100 + client, state=RecordDict(), run_config={},
                   node_config={"client-id": client, "cpufreq": cpufreq,
                                "data-file": str(path)})


def _train_msg(client: int, freq: float, node: int) -> Message:
    from flwr.app import ArrayRecord, MessageType

    arrays = ArrayRecord(get_weights(build_model("digits", 10)))
    config = ConfigRecord({"client-id": client, "tau-c": 2, "lr": 0.05, "batch-size": 8,
                           "freq-ghz": freq, "seed": 3, "edge-round": 0, "task-id": "t1"})
    return Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=node,
                   message_type=MessageType.TRAIN, group_id="g")


def test_deployed_clientapp_trains_its_own_data_and_logs_the_directive(tmp_path: Path):
    cfg = apply_flat(FedCureConfig(), {"dataset": "digits", "num-clients": 4, "num-edges": 2})
    data, home = build_node_data(cfg, 1, "dev-1")
    assert 0 <= home < 2 and data.label_counts.sum() == len(data.y) > 0
    path = save_node_data(tmp_path / "node.npz", data)
    grid = FakeGrid({101: lambda m: client_app.app(m, _deployed_ctx(path, 1))})
    [mid] = grid.push_messages([_train_msg(1, 0.9, 101)])
    [reply] = grid.pull_messages([mid])
    assert not reply.has_error(), reply.error
    metrics = reply.content["metrics"]
    f = min(data.profile.f_max_ghz, max(data.profile.f_min_ghz, 0.9))
    assert metrics["f-applied-ghz"] == pytest.approx(f)
    assert metrics["num-examples"] == len(data.y)
    [entry] = read_applied(path)
    assert entry["directive_ghz"] == 0.9 and entry["applied_ghz"] == pytest.approx(f)
    assert entry["task"] == "t1" and entry["cpufreq"] == "emulate"
    # emulation stretches the measured time by f_max / f
    assert entry["seconds"] == pytest.approx(entry["measured_s"] * data.profile.f_max_ghz / f)
    # a message for another client is refused with an error reply
    [mid] = grid.push_messages([_train_msg(2, 0.9, 101)])
    [reply] = grid.pull_messages([mid])
    assert reply.has_error() and "holds client 1" in reply.error.reason


def test_a_client_holds_uint8_pixels_and_trains_as_on_the_normalised_split(tmp_path: Path):
    """The node data file keeps the dataset's uint8 pixels (a quarter of float32's bytes); the
    ClientApp normalises each batch, and its reply equals, bit for bit, the reply of a client
    holding the normalised float32 images."""
    import dataclasses

    from fedcure_app.data.dataset import normalise
    from fedcure_app.data.specs import SPECS

    cfg = apply_flat(FedCureConfig(), {"dataset": "digits", "num-clients": 4, "num-edges": 2})
    data, _ = build_node_data(cfg, 1, "dev-1")
    assert data.x.dtype == np.uint8
    pix = save_node_data(tmp_path / "pixels.npz", data)
    assert load_node_data(pix).x.dtype == np.uint8
    flt = save_node_data(tmp_path / "float.npz",
                         dataclasses.replace(data, x=normalise(data.x, SPECS["digits"])))
    replies = []
    for path in (pix, flt):
        grid = FakeGrid({101: lambda m, p=path: client_app.app(m, _deployed_ctx(p, 1))})
        torch.manual_seed(0)  # the same initial weights in both messages
        [mid] = grid.push_messages([_train_msg(1, 0.9, 101)])
        [reply] = grid.pull_messages([mid])
        assert not reply.has_error(), reply.error
        replies.append(reply)
    a, b = (r.content["arrays"].to_numpy_ndarrays() for r in replies)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert replies[0].content["metrics"]["loss"] == replies[1].content["metrics"]["loss"]


# ------------------------------------------------------------------------------ directory
def _identity_node(client: int | None):
    def handler(msg: Message):
        ident = {} if client is None else {"client-id": client}
        return RecordDict({"identity": ConfigRecord(ident)})
    return handler


def test_node_directory_queries_each_node_once_and_tracks_departures():
    grid = FakeGrid({11: _identity_node(0), 12: _identity_node(1), 13: _identity_node(None)})
    d = NodeDirectory(grid, retry_s=0.0)
    assert d.resolve([0, 1], timeout_s=2, poll_s=0.001) == {0: 11, 1: 12}
    sent = len(grid.sent)
    d.refresh()
    d.refresh()
    assert len(grid.sent) == sent == 3  # nobody asked twice, the stranger neither
    del grid.handlers[11]  # node 11 left; client 0 comes back as node 14
    grid.handlers[14] = _identity_node(0)
    assert d.resolve([0, 1], timeout_s=2, poll_s=0.001) == {0: 14, 1: 12}
    assert d.resolve([0, 5], timeout_s=0.05, poll_s=0.001) == {0: 14}  # partial on timeout


def test_node_directory_asks_again_after_an_error_answer():
    calls = {"n": 0}

    def flaky(msg: Message):
        calls["n"] += 1
        if calls["n"] == 1:
            return Error(code=1, reason="not yet")
        return RecordDict({"identity": ConfigRecord({"client-id": 3})})

    d = NodeDirectory(FakeGrid({21: flaky}), retry_s=0.0)
    assert d.resolve([3], timeout_s=2, poll_s=0.001) == {3: 21}
    assert calls["n"] == 2


# ------------------------------------------------------------------------------ a whole run
def test_edge_servers_serve_a_whole_run_against_the_cloud(cleanup, tmp_path: Path):
    """2 EdgeServers + 4 in-process clients (real ClientApp) + the real cloud service."""
    cfg = apply_flat(FedCureConfig(), {
        "dataset": "digits", "num-clients": 4, "num-edges": 2, "global-rounds": 3,
        "tau-e": 1, "tau-c": 2, "batch-size": 16, "partition": "dirichlet",
        "max-concurrent": 2, "method": "fedcure"})
    import torch

    torch.manual_seed(cfg.run.seed)
    server = start_cloud(cfg, expected=4, initial=get_weights(build_model("digits", 10)))
    cleanup.append(server)
    stub = pb_grpc.AssociationStub(channel(server.address))
    grids = {0: FakeGrid({}), 1: FakeGrid({})}
    edges = [EdgeServer(grids[m], EdgeSettings(cloud=server.address, edge_id=m,
                                               advertise=f"edge{m}:1", insecure=True,
                                               discovery_timeout_s=60))
             for m in (0, 1)]
    edge_errors: list[BaseException] = []

    def serve(e: EdgeServer) -> None:
        try:
            e.run()
        except BaseException as err:  # noqa: BLE001
            edge_errors.append(err)

    edge_threads = [threading.Thread(target=serve, args=(e,), daemon=True) for e in edges]
    for t in edge_threads:
        t.start()
    regs: dict[int, pb.RegisterReply] = {}
    files: dict[int, Path] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            name = f"dev-{9 - i}"  # names sort against partition order
            claim = stub.Claim(pb.ClaimRequest(client_name=name, partition_id=i))
            ccfg = config_of(claim, _args())
            data, home = build_node_data(ccfg, i, name)
            files[i] = save_node_data(tmp_path / f"c{i}.npz", data)
            from fedcure_app.protocol.codec import profile_to_proto

            reply = stub.Register(pb.RegisterRequest(
                client_name=name, label_counts=data.label_counts.tolist(),
                device=profile_to_proto(data.profile), home_edge=home), timeout=30)
            regs[i] = reply
            ctx = _deployed_ctx(files[i], reply.client_id)
            grids[reply.edge_id].handlers[1000 + i] = lambda m: client_app.app(m, ctx)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert server.join(120), "the run did not finish"
    for t in edge_threads:
        t.join(10)
        assert not t.is_alive()
    assert not edge_errors, edge_errors
    result = server.service.controller.result
    assert result is not None and result["rounds"] == 3
    # client ids are the claimed partitions; the ESs are formation's, as in simulation
    assert {i: r.client_id for i, r in regs.items()} == {i: i for i in range(4)}
    from fedcure_app.simulation.engine import build_federation

    sim = build_federation(apply_flat(cfg, {"num-classes": 10}))
    assert result["formation"]["assignment"] == np.asarray(sim.assignment).tolist()
    assert {i: r.edge_id for i, r in regs.items()} == {
        i: int(sim.assignment[i]) for i in range(4)}
    assert {i: r.edge_address for i, r in regs.items()} == {
        i: f"edge{r.edge_id}:1" for i, r in regs.items()}
    # every round's directives reached its clients and were applied
    applied = {i: read_applied(files[i]) for i in range(4)}
    for rec in result["records"]:
        for c, f in rec["frequencies_ghz"].items():
            got = [a for a in applied[int(c)] if a["task"] == rec["task_id"]]
            assert got and got[0]["directive_ghz"] == pytest.approx(f)
        assert rec["energy_j"] > 0
    assert sum(e.stats.tasks for e in edges) >= 3
    # staleness weights: ξ = ℓ·k^φ
    ell, k = cfg.method.ell, cfg.method.k
    for rec in result["records"]:
        assert rec["xi"] == pytest.approx(ell * k ** rec["staleness"])


# ------------------------------------------------------------------------------ partition child
def test_the_partition_cut_in_a_child_equals_the_one_cut_in_process(tmp_path: Path):
    """``cut_partition`` (a child process) writes the node data file build_node_data gives and
    reports its sample count, label counts, initial ES and device profile."""
    from client.partition import cut_partition

    cfg = apply_flat(FedCureConfig(), {"dataset": "digits", "num-clients": 4, "num-edges": 2})
    want, home = build_node_data(cfg, 2, "dev-2")
    got = cut_partition(cfg, 2, "dev-2", tmp_path / "node.npz")
    held = load_node_data(got.data_file)
    assert np.array_equal(held.x, want.x) and np.array_equal(held.y, want.y)
    assert held.client_name == "dev-2" and held.partition_id == 2
    assert got.samples == len(want.y)
    assert got.label_counts == want.label_counts.tolist()
    assert got.home == home and got.profile == want.profile == held.profile


def test_the_partition_child_reports_its_failure_as_the_error_it_was(tmp_path: Path):
    """A dataset that is not there is a DatasetError of one line naming it, as in process."""
    from client.partition import cut_partition
    from fedcure_app.data.errors import DatasetError

    cfg = apply_flat(FedCureConfig(), {"dataset": "mnist", "num-clients": 4, "num-edges": 2,
                                       "data-dir": str(tmp_path / "nowhere")})
    with pytest.raises(DatasetError) as err:
        cut_partition(cfg, 0, "dev-0", tmp_path / "node.npz")
    assert "\n" not in str(err.value) and "mnist" in str(err.value).lower()
    assert not (tmp_path / "node.npz").exists()
    assert not list(tmp_path.glob(".partition-config-*"))  # its config file is cleaned up


def test_a_stop_request_ends_the_partition_child(tmp_path: Path):
    """A role asked to stop (SIGTERM) while its partition is cut stops the child and goes on
    to exit: no data file, no configuration file left."""
    import time

    from client.partition import cut_partition

    cfg = apply_flat(FedCureConfig(), {"dataset": "digits", "num-clients": 4, "num-edges": 2})
    stop = threading.Event()
    stop.set()
    t0 = time.monotonic()
    assert cut_partition(cfg, 0, "dev-0", tmp_path / "node.npz", stop=stop) is None
    assert time.monotonic() - t0 < 10
    assert not (tmp_path / "node.npz").exists()
    assert not list(tmp_path.glob(".partition-config-*"))
