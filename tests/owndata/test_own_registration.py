"""The cloud of a task at registration: a client whose model differs from the cloud's is
refused in one line naming the first difference and no longer awaited; a client that cannot
take part withdraws with its reason, which the cloud logs in one line, and formation goes on
with the others; a private (noisy) histogram is accepted with its exact sample count, which is
what the queues' data shares use."""

from __future__ import annotations

import json
import logging
import threading

import grpc
import pytest

from fedcure_app.data.task import parse_task
from fedcure_app.models import build_model, get_weights, model_signature
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from tests.deployment.fakes import channel, make_cfg, register_request, start_cloud

TASK = parse_task({"classes": ["a", "b", "c", "d"], "kind": "tabular", "features": 5})


def task_cfg():
    from fedcure_app.config import build_config

    data = make_cfg(3, 2).model_dump()
    data["task"] = TASK.model_dump()
    return build_config(data)


def signature(task=TASK) -> str:
    return json.dumps([[k, list(v)] for k, v in model_signature(build_model(task))])


@pytest.fixture
def cloud():
    cfg = task_cfg()
    server = start_cloud(cfg, expected=3, timeout=30.0,
                         initial=get_weights(build_model(TASK)))
    ch = channel(server.address)
    yield server, pb_grpc.AssociationStub(ch)
    ch.close()
    server.stop()


def register_async(stub, req, results, key):
    def go():
        try:
            results[key] = stub.Register(req, timeout=25.0)
        except grpc.RpcError as err:
            results[key] = err
    t = threading.Thread(target=go)
    t.start()
    return t


def test_a_client_with_another_model_is_refused_in_one_line_and_not_awaited(cloud, caplog):
    server, stub = cloud
    other = parse_task({"classes": ["a", "b", "c", "d"], "kind": "tabular", "features": 6})
    req = register_request("odd", [1, 1, 1, 1])
    req.model_signature = signature(other)
    with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
        with pytest.raises(grpc.RpcError) as err:
            stub.Register(req, timeout=10.0)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    detail = err.value.details()
    assert "\n" not in detail and "model differs" in detail and "(64, 6)" in detail
    assert any("'odd' withdrew" in r.getMessage() for r in caplog.records)
    assert server.service.controller.roster.awaited == 2


def test_a_withdrawn_client_no_longer_holds_formation(cloud, caplog):
    server, stub = cloud
    for name in ("c0", "c1", "c2"):
        stub.Claim(pb.ClaimRequest(client_name=name), timeout=5.0)
    results: dict = {}
    threads = []
    for name, counts in (("c0", [4, 0, 1, 0]), ("c1", [0, 3, 0, 3])):
        req = register_request(name, counts)
        req.model_signature = signature()
        threads.append(register_async(stub, req, results, name))
    with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
        reply = stub.Withdraw(pb.WithdrawRequest(client_name="c2",
                                                 reason="unknown-class: 2 classes"),
                             timeout=5.0)
    assert reply.expected_clients == 2
    lines = [r.getMessage() for r in caplog.records if "withdrew" in r.getMessage()]
    assert lines == ["client 'c2' withdrew: unknown-class: 2 classes (formation waits for 2 "
                     "clients now)"]
    for t in threads:
        t.join(timeout=1.0)
    c = server.service.controller
    assert c.forming or c.strategy is not None
    assert sorted(c.roster.clients) == ["c0", "c1"]
    assert "c2" not in c.roster.claims


def test_a_private_histogram_registers_with_its_exact_sample_count(cloud):
    server, stub = cloud
    req = register_request("p", [0, 0, 0, 0])  # noise and the minimum count took them all
    req.model_signature = signature()
    req.num_samples = 37
    req.histogram_epsilon = 0.5
    results: dict = {}
    t = register_async(stub, req, results, "p")
    t.join(timeout=1.0)
    entry = server.service.controller.roster.clients["p"]
    assert entry.samples == 37 and entry.histogram_epsilon == 0.5
    # an exact histogram must still hold samples
    bad = register_request("q", [0, 0, 0, 0])
    bad.model_signature = signature()
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(bad, timeout=5.0)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "positive sum" in err.value.details()


@pytest.mark.parametrize("argv, words", [
    (["--task", "{task}", "--dataset", "digits"], "--dataset digits: not used with --task"),
    (["--task", "{missing}"], "task file not found"),
    (["--test-data", "{task}"], "--test-data: only with --task"),
])
def test_the_clouds_own_data_flags_are_one_line_and_exit_2(tmp_path, argv, words):
    import subprocess
    import sys

    from fedcure_app.data.task import task_toml

    task = tmp_path / "task.toml"
    task.write_text(task_toml(TASK))
    argv = [a.format(task=task, missing=tmp_path / "nope.toml") for a in argv]
    done = subprocess.run([sys.executable, "-m", "cloud_server.cli", "--listen", "127.0.0.1:0",
                           "--expected-clients", "2", "--edges", "1", "--insecure", *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and words in line


def test_a_withdrawn_client_that_comes_back_replaces_its_withdrawal(cloud, caplog):
    """One name, one client: c2 withdraws, is fixed and registers under the same name; it is
    registered once and counted once, so formation still waits for c1, which registers."""
    server, stub = cloud
    c = server.service.controller
    stub.Withdraw(pb.WithdrawRequest(client_name="c2", reason="bad data"), timeout=5.0)
    assert c.roster.awaited == 2
    results: dict = {}
    threads = []
    for name, counts in (("c2", [0, 2, 2, 0]), ("c0", [4, 0, 1, 0])):
        stub.Claim(pb.ClaimRequest(client_name=name), timeout=5.0)
        req = register_request(name, counts)
        req.model_signature = signature()
        threads.append(register_async(stub, req, results, name))
        while name not in c.roster.clients:  # registered before the next one comes
            threads[-1].join(timeout=0.05)
    assert c.roster.withdrawn == {} and c.roster.awaited == 3
    assert not c.forming and c.strategy is None  # 2 of 3: formation waits for c1
    req = register_request("c1", [0, 3, 0, 3])
    req.model_signature = signature()
    threads.append(register_async(stub, req, results, "c1"))
    for t in threads:
        t.join(timeout=1.0)
    assert not any(isinstance(r, grpc.RpcError) for r in results.values()), results
    assert c.forming or c.strategy is not None  # all three: formation runs
    assert sorted(c.roster.clients) == ["c0", "c1", "c2"] and c.roster.withdrawn == {}
