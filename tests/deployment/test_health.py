"""The cloud serves the standard gRPC health service (grpc.health.v1.Health) on its own port:
SERVING while it takes registrations and trains, NOT_SERVING once the run finished; the
container healthcheck (docker/healthcheck.py, `fedcure-healthcheck --cloud`) follows it."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud_server.server import CloudServer
from cloud_server.service import CloudService
from tests.deployment.fakes import SMALL_MODEL, FakeEdge, channel, make_cfg, register_request

ROOT = Path(__file__).resolve().parents[2]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _healthcheck_main():
    spec = importlib.util.spec_from_file_location("fedcure_healthcheck",
                                                  ROOT / "docker" / "healthcheck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def check(address: str, service: str = "") -> int:
    ch = channel(address)
    try:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status
    finally:
        ch.close()


def test_health_is_serving_while_running_and_not_serving_after_the_end(cleanup, capsys):
    rounds = 2
    cfg = make_cfg(2, 2, **{"global-rounds": rounds, "max-concurrent": 2})
    service = CloudService(cfg, expected_clients=2, register_timeout_s=20,
                           initial_arrays=SMALL_MODEL, write_plots=False)
    server = CloudServer(service, "127.0.0.1:0", linger_s=30.0)
    server.start()
    cleanup.append(server)
    address = server.address
    healthcheck = _healthcheck_main()
    # registering: every service is SERVING, and the container healthcheck passes
    assert check(address) == SERVING
    for name in ("fedcure.v1.Association", "fedcure.v1.EdgeLink", "fedcure.v1.Monitor"):
        assert check(address, name) == SERVING
    with grpc.insecure_channel(address) as ch:
        try:
            health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
            raise AssertionError("an unknown service must be NOT_FOUND")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND
    assert healthcheck(["--cloud", address, "--insecure"]) == 0
    assert "cloud REGISTERING" in capsys.readouterr().out

    # a watcher sees every change of the whole server's status
    seen: list[int] = []
    watch_ch = channel(address)
    cleanup.append(watch_ch)
    stream = health_pb2_grpc.HealthStub(watch_ch).Watch(health_pb2.HealthCheckRequest(service=""))
    got_not_serving = threading.Event()

    def read() -> None:
        try:
            for reply in stream:
                seen.append(reply.status)
                if reply.status == NOT_SERVING:
                    got_not_serving.set()
        except grpc.RpcError:
            pass

    threading.Thread(target=read, daemon=True).start()

    fakes = [FakeEdge(address, m) for m in range(2)]
    cleanup.extend(fakes)
    ch = channel(address)
    cleanup.append(ch)
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc

    stub = pb_grpc.AssociationStub(ch)
    futs = [stub.Register.future(register_request(f"c{i}", [10, 0, 0, 10], home=i), timeout=20)
            for i in range(2)]
    for f in futs:
        f.result()
    assert check(address) == SERVING  # training
    assert healthcheck(["--cloud", address, "--insecure"]) == 0
    done = 0
    while done < rounds:
        for f in fakes:
            if done < rounds and not f.tasks.empty():
                f.submit(f.next_task())
                done += 1
    # finished (the cloud lingers, still answering): NOT_SERVING, and the healthcheck fails
    assert got_not_serving.wait(30), seen
    assert seen[0] == SERVING and seen[-1] == NOT_SERVING
    assert check(address) == NOT_SERVING
    capsys.readouterr()
    assert healthcheck(["--cloud", address, "--insecure"]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err
    stream.cancel()
