"""Transport security and authentication: `fedcure certs`, TLS, mutual TLS, tokens, flags."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import grpc
import pytest

from cloud_server.security import (
    SecurityConfigError,
    server_credentials,
    token_ok,
    transport_from_flags,
)
from cloud_server.server import CloudServer
from cloud_server.service import CloudService
from fedcure_app.cli import main as fedcure_main
from fedcure_app.cli.certs import parse_hosts, write_certificates
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.channel import ChannelConfigError, open_channel
from tests.deployment.fakes import SMALL_MODEL, make_cfg, register_request


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    assert fedcure_main(["certs", "--out", str(out),
                         "--hosts", "cloud,edge0,localhost,127.0.0.1"]) == 0
    return out


def tls_cloud(cleanup, certs: Path, *, mutual: bool = False, token: str = "") -> CloudServer:
    service = CloudService(make_cfg(2, 1), expected_clients=2, register_timeout_s=20,
                           token=token, initial_arrays=SMALL_MODEL, write_plots=False)
    creds = server_credentials(certs / "server.crt", certs / "server.key",
                               certs / "ca.crt" if mutual else None)
    server = CloudServer(service, "127.0.0.1:0", credentials=creds)
    server.start()
    cleanup.append(server)
    return server


def status(ch: grpc.Channel) -> pb.StatusReply:
    return pb_grpc.MonitorStub(ch).Status(pb.StatusRequest(), timeout=5)


# ------------------------------------------------------------------------------ fedcure certs
def test_certs_writes_a_ca_server_and_client_certificate(certs: Path):
    from cryptography import x509

    for name in ("ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key"):
        assert (certs / name).stat().st_size > 0
    for key in ("ca.key", "server.key", "client.key"):
        assert stat.S_IMODE((certs / key).stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((certs / "server.crt").read_bytes())
    client = x509.load_pem_x509_certificate((certs / "client.crt").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"cloud", "edge0", "localhost"}
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    for leaf in (server, client):
        assert leaf.issuer == ca.subject
        leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_certs_refuses_to_overwrite_and_bad_hosts(certs: Path, capsys):
    before = (certs / "ca.key").read_bytes()
    assert fedcure_main(["certs", "--out", str(certs)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (certs / "ca.key").read_bytes() == before
    with pytest.raises(ValueError):
        parse_hosts(" , ")
    with pytest.raises(ValueError):
        parse_hosts("good,bad host")


# ------------------------------------------------------------------------------ TLS
def test_tls_cloud_answers_tls_clients_and_refuses_plaintext(cleanup, certs: Path):
    server = tls_cloud(cleanup, certs)
    ch = open_channel(server.address, tls_ca=certs / "ca.crt")
    cleanup.append(ch)
    assert status(ch).expected_clients == 2
    plain = open_channel(server.address, insecure=True)
    cleanup.append(plain)
    with pytest.raises(grpc.RpcError) as err:
        status(plain)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_server_certificate_from_another_ca_is_refused(cleanup, certs: Path, tmp_path: Path):
    server = tls_cloud(cleanup, certs)
    write_certificates(tmp_path, ["127.0.0.1"])
    ch = open_channel(server.address, tls_ca=tmp_path / "ca.crt")
    cleanup.append(ch)
    with pytest.raises(grpc.RpcError) as err:
        status(ch)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_from_the_ca(cleanup, certs: Path, tmp_path: Path):
    server = tls_cloud(cleanup, certs, mutual=True)
    good = open_channel(server.address, tls_ca=certs / "ca.crt", tls_cert=certs / "client.crt",
                        tls_key=certs / "client.key")
    cleanup.append(good)
    assert status(good).num_edges == 1
    anonymous = open_channel(server.address, tls_ca=certs / "ca.crt")
    cleanup.append(anonymous)
    with pytest.raises(grpc.RpcError) as err:
        status(anonymous)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    write_certificates(tmp_path, ["127.0.0.1"])  # a stranger's CA signs this client cert
    stranger = open_channel(server.address, tls_ca=certs / "ca.crt",
                            tls_cert=tmp_path / "client.crt", tls_key=tmp_path / "client.key")
    cleanup.append(stranger)
    with pytest.raises(grpc.RpcError):
        status(stranger)


# ------------------------------------------------------------------------------ token
def test_every_rpc_checks_the_token(cleanup, certs: Path):
    server = tls_cloud(cleanup, certs, token="s3cret")
    ch = open_channel(server.address, tls_ca=certs / "ca.crt")
    cleanup.append(ch)
    assoc = pb_grpc.AssociationStub(ch)
    with pytest.raises(grpc.RpcError) as err:
        assoc.Register(register_request("c0", [5] * 4, home=0, token="wrong"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    edge = pb_grpc.EdgeLinkStub(ch)
    with pytest.raises(grpc.RpcError) as err:
        next(iter(edge.Connect(pb.ConnectRequest(edge_id=0, address="x:1", token=""),
                               timeout=5)))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        edge.Submit(pb.SubmitRequest(task_id="r0-c0-v0", edge_id=0, token="nope"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(server.service.controller.clients) == 0
    assert not server.service.edges[0].connected.is_set()


def test_token_comparison():
    assert token_ok("", "anything")
    assert token_ok("abc", "abc")
    assert not token_ok("abc", "abd") and not token_ok("abc", "") and not token_ok("abc", "abcd")


# ------------------------------------------------------------------------------ flags
def test_security_flag_combinations(certs: Path):
    crt, key, ca = str(certs / "server.crt"), str(certs / "server.key"), str(certs / "ca.crt")
    assert transport_from_flags(insecure=True, tls_cert=None, tls_key=None,
                                tls_client_ca=None) is None
    assert transport_from_flags(insecure=False, tls_cert=crt, tls_key=key,
                                tls_client_ca=ca) is not None
    bad = [
        dict(insecure=False, tls_cert=None, tls_key=None, tls_client_ca=None),
        dict(insecure=True, tls_cert=crt, tls_key=key, tls_client_ca=None),
        dict(insecure=False, tls_cert=crt, tls_key=None, tls_client_ca=None),
        dict(insecure=False, tls_cert=None, tls_key=None, tls_client_ca=ca),
        dict(insecure=False, tls_cert=str(certs / "missing.crt"), tls_key=key,
             tls_client_ca=None),
        dict(insecure=False, tls_cert=key + "x", tls_key=key, tls_client_ca=None),
    ]
    for flags in bad:
        with pytest.raises(SecurityConfigError):
            transport_from_flags(**flags)
    with pytest.raises(ChannelConfigError):
        open_channel("127.0.0.1:1", insecure=True, tls_ca=ca)
    with pytest.raises(ChannelConfigError):
        open_channel("127.0.0.1:1", tls_cert=crt)
    with pytest.raises(ChannelConfigError):
        open_channel("127.0.0.1:1", tls_ca=str(certs / "nope.crt"))


def test_a_fake_edge_connects_over_tls(cleanup, certs: Path):
    """The fast wire path (models beside the messages) works unchanged over a TLS channel."""
    from types import SimpleNamespace

    import numpy as np

    from fedcure_app.protocol.codec import EdgeLinkClient, WithModel, decode_arrays, encode_arrays

    server = tls_cloud(cleanup, certs)
    ch = open_channel(server.address, tls_ca=certs / "ca.crt")
    cleanup.append(ch)
    stub = EdgeLinkClient(ch)
    stream = stub.Connect(pb.ConnectRequest(edge_id=0, address="127.0.0.1:19000"))
    cleanup.append(SimpleNamespace(close=stream.cancel))
    assoc = pb_grpc.AssociationStub(ch)
    futs = [assoc.Register.future(register_request(f"c{i}", [5] * 4, home=0), timeout=20)
            for i in range(2)]
    assert [f.result().edge_id for f in futs] == [0, 0]
    item = next(stream)
    task, model = item.message, item.model_bytes()
    update = encode_arrays([np.ones_like(a) for a in decode_arrays(model)])
    req = pb.SubmitRequest(task_id=task.task_id, edge_id=0, num_samples=10, latency_s=0.1)
    assert stub.Submit(WithModel(req, update), timeout=10).accepted


# ------------------------------------------------------------------------------ the CLI
def test_the_cloud_cli_refuses_plaintext_unless_asked(tmp_path: Path):
    import subprocess
    import sys

    from tests.deployment.reliability import ROOT

    res = subprocess.run(
        [sys.executable, "-m", "cloud_server.cli", "--listen", "127.0.0.1:0",
         "--expected-clients", "2", "--edges", "1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--insecure" in lines[0] and "--tls-cert" in lines[0], lines


def test_the_cloud_cli_serves_mutual_tls(certs: Path, tmp_path: Path):
    from tests.deployment.reliability import Proc

    cloud = Proc("-m", "cloud_server.cli", "--listen", "127.0.0.1:0", "--expected-clients", "2",
                 "--edges", "1", "--out", str(tmp_path), "--tls-cert", str(certs / "server.crt"),
                 "--tls-key", str(certs / "server.key"), "--tls-client-ca", str(certs / "ca.crt"))
    try:
        port = int(cloud.wait_for(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        cloud.wait_for(r"serving TLS with mutual authentication")
        ch = open_channel(f"127.0.0.1:{port}", tls_ca=certs / "ca.crt",
                          tls_cert=certs / "client.crt", tls_key=certs / "client.key")
        assert status(ch).expected_clients == 2
        ch.close()
        plain = open_channel(f"127.0.0.1:{port}", tls_ca=certs / "ca.crt")
        with pytest.raises(grpc.RpcError):
            status(plain)
        plain.close()
    finally:
        cloud.kill()


# ------------------------------------------------------------------------------ edge identity
def test_edge_certificates_and_tokens_bind_each_edge_to_its_id(cleanup, tmp_path: Path):
    """`fedcure certs --edges 2` issues each edge a certificate (CN fedcure-edge-<m>) and a
    token; under mutual TLS with --edge-certs an edge may only act as itself."""
    import json

    from cloud_server.identity import EdgeCredentials, load_edge_tokens

    out = tmp_path / "certs"
    assert fedcure_main(["certs", "--out", str(out), "--hosts", "localhost,127.0.0.1",
                         "--edges", "2"]) == 0
    tokens = load_edge_tokens(out / "edge-tokens.json")
    assert set(tokens) == {0, 1} and tokens[0] != tokens[1]
    assert (out / "edge-1.token").read_text().strip() == tokens[1]
    for name in ("edge-0.key", "edge-1.token", "edge-tokens.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
    assert json.loads((out / "edge-tokens.json").read_text())["0"] == tokens[0]

    service = CloudService(make_cfg(2, 2), expected_clients=2, register_timeout_s=20,
                           initial_arrays=SMALL_MODEL, write_plots=False,
                           edge_credentials=EdgeCredentials(require_certs=True))
    creds = server_credentials(out / "server.crt", out / "server.key", out / "ca.crt")
    server = CloudServer(service, "127.0.0.1:0", credentials=creds)
    server.start()
    cleanup.append(server)

    def as_cert(name: str) -> pb_grpc.EdgeLinkStub:
        ch = open_channel(server.address, tls_ca=out / "ca.crt", tls_cert=out / f"{name}.crt",
                          tls_key=out / f"{name}.key")
        cleanup.append(ch)
        return pb_grpc.EdgeLinkStub(ch)

    def members(stub: pb_grpc.EdgeLinkStub, m: int) -> grpc.StatusCode:
        try:
            stub.Members(pb.MembersRequest(edge_id=m), timeout=5)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    edge1 = as_cert("edge-1")
    assert members(edge1, 1) == grpc.StatusCode.OK
    assert members(edge1, 0) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        next(iter(edge1.Connect(pb.ConnectRequest(edge_id=0, address="127.0.0.1:1"),
                                timeout=5)))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # a client certificate names no edge: with --edge-certs it may act as none
    assert members(as_cert("client"), 0) == grpc.StatusCode.PERMISSION_DENIED
    assert not any(e.connected.is_set() for e in service.edges.values())


def test_the_cloud_cli_checks_the_edge_identity_flags(tmp_path: Path, capsys):
    from cloud_server.cli import main as cloud_main

    tokens = tmp_path / "edge-tokens.json"
    tokens.write_text('{"0": "edge0-0123456789abcdef"}')
    base = ["--listen", "127.0.0.1:0", "--expected-clients", "2", "--edges", "2",
            "--out", str(tmp_path), "--insecure"]
    assert cloud_main(base + ["--edge-tokens", str(tokens)]) == 2
    assert "no token for edges [1]" in capsys.readouterr().err
    assert cloud_main(base + ["--edge-certs"]) == 2
    assert "--tls-client-ca" in capsys.readouterr().err
    tokens.write_text("not json")
    assert cloud_main(base + ["--edge-tokens", str(tokens)]) == 2
    assert "cannot read edge tokens" in capsys.readouterr().err
