"""``fedcure-cloud`` as a process: a whole run, SIGTERM, and a port already in use."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from cloud_server.server import AddressInUse, CloudServer
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from tests.deployment.fakes import FakeEdge, channel, make_cfg, register_request, start_cloud
from tests.deployment.reliability import Proc


class Cloud(Proc):
    """``python -m cloud_server.cli ...`` (plaintext unless TLS is asked for), its log lines
    collected; stop = SIGKILL."""

    def __init__(self, *args: str) -> None:
        super().__init__("-m", "cloud_server.cli", *args,
                         *([] if {"--insecure", "--tls-cert"} & set(args) else ["--insecure"]))


@pytest.fixture
def procs():
    started: list[Cloud] = []
    yield started
    for p in started:
        p.stop()


def test_a_whole_run_through_the_command_line(procs, tmp_path: Path):
    # the fake edge answers constant models no SGD step makes: lift the norm screen's bound
    config = tmp_path / "cloud.toml"
    config.write_text("[reliability]\nnorm-grad-bound = 10000.0\n")
    cloud = Cloud("--listen", "127.0.0.1:0", "--expected-clients", "2", "--edges", "1",
                  "--rounds", "2", "--method", "fedcure", "--formation", "none",
                  "--config", str(config), "--out", str(tmp_path), "--no-plots")
    procs.append(cloud)
    port = int(cloud.wait_for(r"listening on 127\.0\.0\.1:(\d+)").group(1))
    address = f"127.0.0.1:{port}"
    edge = FakeEdge(address, 0)
    try:
        ch = channel(address)
        stub = pb_grpc.AssociationStub(ch)
        futs = [stub.Register.future(register_request(f"c{i}", [5] * 10, home=0), timeout=30)
                for i in range(2)]
        assert [f.result().edge_address for f in futs] == [edge.address] * 2
        for _ in range(2):
            assert edge.submit(edge.next_task(timeout=30)).accepted
        assert cloud.proc.wait(30) == 0
        assert edge.ended.wait(5) and edge.end is None
        ch.close()
    finally:
        edge.close()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["rounds"] == 2 and result["dataset"] == "digits"
    assert (tmp_path / "final_model.safetensors").stat().st_size > 0
    assert "training over after 2 rounds" in "".join(cloud.log)


def test_sigterm_stops_the_cloud_cleanly(procs, tmp_path: Path):
    cloud = Cloud("--listen", "127.0.0.1:0", "--expected-clients", "3", "--edges", "1",
                  "--out", str(tmp_path))
    procs.append(cloud)
    cloud.wait_for(r"listening on")
    cloud.proc.send_signal(signal.SIGTERM)
    assert cloud.proc.wait(15) == 0
    assert "SIGTERM received" in "".join(cloud.log)


def test_a_port_in_use_is_a_one_line_error(procs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cloud = Cloud("--listen", f"127.0.0.1:{port}", "--expected-clients", "2", "--edges", "1")
        procs.append(cloud)
        assert cloud.proc.wait(30) == 2
    text = "".join(cloud.log).strip()
    assert len(text.splitlines()) == 1, text
    assert text.startswith("fedcure-cloud: error: cannot listen on 127.0.0.1:"), text


def test_two_clouds_cannot_share_a_port(cleanup):
    first = start_cloud(make_cfg(2, 1), expected=2)
    cleanup.append(first)
    second = CloudServer(first.service.__class__(make_cfg(2, 1), expected_clients=2),
                         f"127.0.0.1:{first.port}")
    cleanup.append(second)
    with pytest.raises(AddressInUse):
        second.start()


def test_a_named_dataset_is_evaluated(procs, tmp_path: Path):
    data = pytest.importorskip("fedcure_app.data")
    if not hasattr(data, "load_dataset"):
        pytest.skip("fedcure_app.data.load_dataset is not available")
    cloud = Cloud("--listen", "127.0.0.1:0", "--expected-clients", "2", "--edges", "1",
                  "--rounds", "1", "--formation", "none", "--dataset", "digits",
                  "--out", str(tmp_path), "--no-plots")
    procs.append(cloud)
    port = int(cloud.wait_for(r"listening on 127\.0\.0\.1:(\d+)", timeout=60).group(1))
    address = f"127.0.0.1:{port}"
    edge = FakeEdge(address, 0)
    try:
        ch = channel(address)
        stub = pb_grpc.AssociationStub(ch)
        futs = [stub.Register.future(register_request(f"c{i}", [5] * 10, home=0), timeout=30)
                for i in range(2)]
        [f.result() for f in futs]
        task = edge.next_task(timeout=30)
        assert edge.submit(task, value=0.0).accepted
        assert cloud.proc.wait(30) == 0
        ch.close()
    finally:
        edge.close()
    result = json.loads((tmp_path / "result.json").read_text())
    assert 0.0 <= result["initial_accuracy"] <= 1.0
    assert result["records"][-1]["accuracy"] is not None
    assert result["final_accuracy"] == result["records"][-1]["accuracy"]
