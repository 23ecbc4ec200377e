"""Flower SuperNode authentication on the edges' SuperLinks: keys, their way through the cloud
(Register → Members), and a real deployment over TLS in which the assigned clients train and a
stranger's SuperNode is refused."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.flower.supernode_auth import check_supernode_key, make_supernode_keys, refused
from tests.deployment.fakes import FakeEdge, channel, make_cfg
from tests.deployment.reliability import code_of, one_hot, register_all, request, start


def test_made_keys_are_private_and_valid(tmp_path: Path):
    private, public = make_supernode_keys(tmp_path)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    text = public.read_text()
    assert text.startswith("ecdsa-sha2-nistp384 ")
    check_supernode_key(text)
    assert make_supernode_keys(tmp_path / "other")[1].read_text() != text


def test_non_ec_and_garbage_keys_are_refused():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ed = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    with pytest.raises(ValueError, match="elliptic-curve"):
        check_supernode_key(ed)
    with pytest.raises(ValueError, match="longer"):
        check_supernode_key("ecdsa-sha2-nistp384 " + "A" * 5000)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300))
def test_random_text_is_never_taken_for_a_key(text):
    with pytest.raises(ValueError):
        check_supernode_key(text)


def test_members_lists_each_edges_clients_with_their_keys(cleanup, tmp_path: Path):
    cfg = make_cfg(4, 2, **{"global-rounds": 1000})
    server = start(cfg, expected=4)
    cleanup.append(server)
    ch = channel(server.address)
    cleanup.append(ch)
    edge = pb_grpc.EdgeLinkStub(ch)
    assert list(edge.Members(pb.MembersRequest(edge_id=0), timeout=5).members) == []
    keys = {i: make_supernode_keys(tmp_path / f"c{i}")[1].read_text().strip()
            for i in range(4)}
    cleanup.extend(FakeEdge(server.address, m) for m in range(2))
    reqs = [request(f"c{i}", one_hot(i), home=i % 2) for i in range(4)]
    for i, r in enumerate(reqs):
        if i != 3:  # a client without a key (an edge without auth does not need one)
            r.supernode_public_key = keys[i]
    replies = register_all(server.address, reqs)
    by_edge: dict[int, dict[int, str]] = {0: {}, 1: {}}
    for m in (0, 1):
        for member in edge.Members(pb.MembersRequest(edge_id=m), timeout=5).members:
            by_edge[m][member.client_id] = member.supernode_public_key
    want: dict[int, dict[int, str]] = {0: {}, 1: {}}
    for i, rep in enumerate(replies):
        want[rep.edge_id][rep.client_id] = keys[i] if i != 3 else ""
    assert by_edge == want
    # a restarted client comes with a new key: the cloud hands out the new one
    fresh = make_supernode_keys(tmp_path / "c0-again")[1].read_text().strip()
    again = request("c0", one_hot(0), home=0)
    again.supernode_public_key = fresh
    rep = register_all(server.address, [again])[0]
    members = edge.Members(pb.MembersRequest(edge_id=rep.edge_id), timeout=5).members
    assert {m.client_id: m.supernode_public_key for m in members}[rep.client_id] == fresh


def test_members_and_keys_refuse_bad_input(cleanup):
    cfg = make_cfg(2, 1)
    server = start(cfg, expected=2, token="s3cret")
    cleanup.append(server)
    ch = channel(server.address)
    cleanup.append(ch)
    edge = pb_grpc.EdgeLinkStub(ch)
    assert code_of(lambda: edge.Members(pb.MembersRequest(edge_id=0, token="no"), timeout=5)
                   ) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: edge.Members(pb.MembersRequest(edge_id=5, token="s3cret"),
                                        timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
    bad = request("c0", one_hot(0), home=0, token="s3cret")
    bad.supernode_public_key = "ssh-rsa AAAA not a key"
    assoc = pb_grpc.AssociationStub(ch)
    assert code_of(lambda: assoc.Register(bad, timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
    assert server.service.controller.clients == {}


def test_edges_admit_only_the_clients_the_cloud_assigned(tmp_path: Path):
    """cloud + 1 edge (SuperLink with --enable-supernode-auth, TLS) + 2 clients, as processes:
    the run completes, and a stranger's SuperNode is refused by the edge's SuperLink."""
    import argparse

    from fedcure_app.cli import main as fedcure_main
    from fedcure_app.cli.launch import Roles, config_from_args, register, start_roles
    from fedcure_app.runtime.processes import Child, flower_env, free_port

    certs = tmp_path / "certs"
    assert fedcure_main(["certs", "--out", str(certs), "--hosts", "localhost,127.0.0.1"]) == 0
    out = tmp_path / "run"
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args([
        "launch", "--edges", "1", "--clients", "2", "--rounds", "3", "--dataset", "digits",
        "--tau-e", "1", "--tau-c", "5", "--tls-dir", str(certs), "--supernode-auth",
        "--no-progress", "--out", str(out)])
    roles = Roles()
    stranger = None
    try:
        record = start_roles(config_from_args(args), args, out, roles)
        edge_address = record["edges"][0]
        registered = out / "logs" / "edge0.log"
        end = time.monotonic() + 120
        while time.monotonic() < end and registered.read_text().count("SuperNode key") < 2:
            assert roles.cloud.poll() is None, roles.cloud.tail(30)
            time.sleep(0.5)
        key, _ = make_supernode_keys(tmp_path / "stranger")
        from fedcure_app.flower.tools import flower_bin

        # Child remembers what the SuperNode starts (its SuperExec lives in its own session)
        stranger = Child("stranger", [
            flower_bin("flower-supernode"), "--superlink", edge_address,
            "--root-certificates", str(certs / "ca.crt"), "--auth-supernode-private-key",
            str(key), "--port", str(free_port())],
            log_path=tmp_path / "stranger.log", env=flower_env(tmp_path / "stranger-home"))
        code = stranger.wait(60)
        text = (tmp_path / "stranger.log").read_text()
        assert code is not None, ("the edge's SuperLink let a stranger's SuperNode in:\n"
                                  + text[-3000:])
        assert code != 0 and refused(text), text[-3000:]
        assert roles.cloud.wait(300) == 0, roles.cloud.tail(40)
    finally:
        if stranger is not None:
            stranger.stop()
        roles.stop()
    import json

    result = json.loads((out / "result.json").read_text())
    assert result["rounds"] == 3
    assert all(sorted(map(int, r["frequencies_ghz"])) == [0, 1] for r in result["records"])
    assert all(not r["dropped"] for r in result["records"])


def test_a_refused_supernode_is_started_again_until_its_key_is_registered(tmp_path: Path):
    """The client's SuperNode may start before its ES registered the key: Flower refuses it
    (code 305) and the client starts it again; any other failure is reported at once."""
    import sys
    import threading

    from client.cli import start_supernode

    script = tmp_path / "fake_supernode.py"
    script.write_text(
        "import pathlib, sys, time\n"
        "n = pathlib.Path(sys.argv[1]); k = int(n.read_text()) if n.exists() else 0\n"
        "n.write_text(str(k + 1))\n"
        "if k < int(sys.argv[2]):\n"
        "    print('ERROR: Exit Code: 305', flush=True); sys.exit(1)\n"
        "print('INFO: SuperNode ID: 42', flush=True); time.sleep(60)\n")
    stop = threading.Event()
    counter = tmp_path / "starts"
    child = start_supernode([sys.executable, str(script), str(counter), "2"], tmp_path,
                            dict(os.environ), stop, auth=True, wait_s=60)
    try:
        assert child.poll() is None and counter.read_text() == "3"
        assert "305" in (tmp_path / "supernode-refused.log").read_text()
    finally:
        child.stop(grace_s=1)
    other = tmp_path / "other.py"
    other.write_text("import sys; print('bad flag', flush=True); sys.exit(2)\n")
    child = start_supernode([sys.executable, str(other)], tmp_path / "o", dict(os.environ),
                            stop, auth=True, wait_s=60)
    assert child.wait(10) == 2
