"""A side whose TLS settings differ from the cloud's says so in one line within seconds, naming
the option that fixes it (``fedcure_app.protocol.channel.check_security``), instead of waiting
out --connect-timeout and blaming the address."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from fedcure_app.cli.certs import write_certificates
from fedcure_app.protocol.channel import (
    ChannelSecurityError,
    check_security,
    open_channel,
    probe_server,
    security_mismatch,
)
from fedcure_app.runtime.processes import free_port


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    write_certificates(out, ["localhost", "127.0.0.1"])
    return out


def _server(certs: Path | None) -> tuple[grpc.Server, str]:
    """A gRPC server with no services: TLS with ``certs``' server certificate, else plaintext."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if certs is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        creds = grpc.ssl_server_credentials([((certs / "server.key").read_bytes(),
                                              (certs / "server.crt").read_bytes())])
        port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def plain():
    server, address = _server(None)
    yield address
    server.stop(0)


@pytest.fixture
def tls(certs):
    server, address = _server(certs)
    yield address
    server.stop(0)


def test_probe_tells_tls_from_plaintext_from_nothing(plain, tls):
    assert probe_server(plain) == "plaintext"
    assert probe_server(tls) == "tls"
    assert probe_server(f"127.0.0.1:{free_port()}") is None


def test_matching_sides_pass_quietly(plain, tls, certs):
    for address, kw in ((plain, {"insecure": True}),
                        (tls, {"insecure": False, "tls_ca": certs / "ca.crt"})):
        ch = open_channel(address, **kw)
        try:
            check_security(ch, address, **kw)
        finally:
            ch.close()
        assert security_mismatch(address, **kw) is None


@pytest.mark.parametrize("case", ["tls-to-plain", "plain-to-tls", "wrong-ca"])
def test_mismatch_is_one_line_with_the_fix_within_seconds(case, plain, tls, certs):
    if case == "tls-to-plain":
        address, kw, says = plain, {"insecure": False, "tls_ca": certs / "ca.crt"}, \
            ["speaks plaintext", "add --insecure"]
    elif case == "plain-to-tls":
        address, kw, says = tls, {"insecure": True}, ["speaks TLS", "drop --insecure",
                                                      "--tls-ca"]
    else:  # the system roots do not know the project's own CA
        address, kw, says = tls, {"insecure": False}, ["does not verify", "system's CA roots",
                                                       "pass --tls-ca"]
    ch = open_channel(address, **kw)
    t0 = time.monotonic()
    try:
        with pytest.raises(ChannelSecurityError) as err:
            check_security(ch, address, wait_s=1.0, **kw)
    finally:
        ch.close()
    assert time.monotonic() - t0 < 8.0
    msg = str(err.value)
    assert "\n" not in msg and address in msg
    for part in says:
        assert part in msg


def test_nothing_listening_is_not_a_mismatch():
    address = f"127.0.0.1:{free_port()}"
    ch = open_channel(address, insecure=True)
    try:
        check_security(ch, address, insecure=True, wait_s=0.3)  # returns: the caller waits on
    finally:
        ch.close()


def _role(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)


def test_client_without_insecure_against_a_plaintext_cloud_exits_2_at_once(plain, tmp_path):
    t0 = time.monotonic()
    proc = _role(["client", "--cloud", plain, "--connect-timeout", "60",
                  "--work-dir", str(tmp_path / "w")], tmp_path)
    assert time.monotonic() - t0 < 30.0  # not the 60 s connect timeout
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fedcure-client: error: the cloud at") and "add --insecure" in last


def test_edge_with_tls_against_a_plaintext_cloud_exits_2_at_once(plain, certs, tmp_path):
    t0 = time.monotonic()
    proc = _role(["edge_server", "--cloud", plain, "--edge-id", "0",
                  "--listen", f"127.0.0.1:{free_port()}", "--tls-ca", str(certs / "ca.crt"),
                  "--tls-cert", str(certs / "server.crt"), "--tls-key",
                  str(certs / "server.key"), "--work-dir", str(tmp_path / "w")], tmp_path)
    assert time.monotonic() - t0 < 30.0
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fedcure-edge: error: the cloud at") and "this edge" in last


def test_launch_names_the_reason_a_role_printed_last():
    from types import SimpleNamespace

    from fedcure_app.cli.launch_wait import last_error

    why = ("the cloud at 127.0.0.1:1 speaks plaintext (it runs with --insecure) but this edge "
           "connects with TLS: add --insecure to this edge too, or start the cloud with "
           "--tls-cert/--tls-key")
    child = SimpleNamespace(tail=lambda n: f"12:00:00 INFO fedcure.edge: starting\n"
                                           f"fedcure-edge: error: {why}\n")
    assert last_error(child) == why
    assert last_error(SimpleNamespace(tail=lambda n: "")) == ""
