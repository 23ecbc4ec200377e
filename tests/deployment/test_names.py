"""Names and remote text (:mod:`fedcure_app.protocol.text`): a client name with a control, format
or bidi character, or a path-like one, is refused at the cloud's door in one line naming the
rule; text a peer sent is escaped before any role logs it."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_server import validation as door
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.text import clip, name_problem, printable
from tests.deployment.fakes import channel, make_cfg
from tests.deployment.reliability import one_hot, request, start

HOSTILE = {
    "ESC": "c1\x1b[31mred",
    "CR": "c1\rforged",
    "LF": "c1\n12:00:00 INFO fedcure.cloud: forged",
    "NUL": "c1\x00",
    "BEL": "c1\x07",
    "DEL": "c1\x7f",
    "U+202E": "c1\u202egnp.exe",
    "U+2028": "c1\u2028next",
    "zero width": "c\u200b1",
}
PATHS = ["../../etc/x", "a/b", "a\\b", "..", "."]
GOOD = ["c1", "raspberrypi-4.local-1234", "Zoë", "客户端 7", "שרת", "a..b", "edge_0 (lab)"]


def one_line(text: str) -> bool:
    return text.isprintable()  # no CR, LF, ESC or any other control/format character


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_a_non_printable_name_is_refused_in_one_line_naming_the_rule(what):
    with pytest.raises(door.Refused) as err:
        door.check_name(HOSTILE[what])
    msg = str(err.value)
    assert one_line(msg), msg
    assert msg.startswith("client_name has the non-printable character U+")
    assert "names are printable text" in msg


@pytest.mark.parametrize("name", PATHS)
def test_a_path_like_name_is_refused(name):
    with pytest.raises(door.Refused, match="one path component"):
        door.check_name(name)


@pytest.mark.parametrize("name", GOOD)
def test_ordinary_names_pass(name):
    assert name_problem(name) is None
    assert door.check_name(f"  {name} ") == name


def test_addresses_and_profile_names_must_be_printable():
    with pytest.raises(door.Refused, match="non-printable"):
        door.check_address("edge\x1b[2J:9092")
    assert door.check_address("edge-1.lan:9092") == "edge-1.lan:9092"


def test_printable_escapes_only_what_is_not_printable():
    assert printable("r1-c0-v0") == "r1-c0-v0"
    assert printable("a\x1b[31mb\r\nc\u202ed\x00") == "a\\x1b[31mb\\x0d\\x0ac\\u202ed\\x00"
    assert printable("x" * 500, 10) == "x" * 10 + "…"
    assert printable(ValueError("bad\nline")) == "bad\\x0aline"


@given(st.text(max_size=200))
def test_escaped_text_is_always_one_printable_line(text):
    assert printable(text).isprintable()
    assert clip(text).isprintable()
    assert name_problem(text) is None or one_line(name_problem(text))


def test_a_client_named_with_a_control_character_is_refused_at_registration(cleanup):
    server = start(make_cfg(2, 1), expected=2)
    cleanup.append(server)
    ch = channel(server.address)
    stub = pb_grpc.AssociationStub(ch)
    try:
        for name in [*HOSTILE.values(), *PATHS]:
            with pytest.raises(grpc.RpcError) as err:
                stub.Register(request(name, one_hot(0)), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            detail = err.value.details()
            assert one_line(detail) and "client_name" in detail, detail
            with pytest.raises(grpc.RpcError) as err:
                stub.Claim(pb.ClaimRequest(client_name=name), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert not server.service.controller.clients  # nothing was stored
    finally:
        ch.close()


def test_the_edge_escapes_a_members_name_in_its_log(monkeypatch, caplog, tmp_path):
    from edge_server.keys import KeyRegistrar
    from fedcure_app.flower import supernode_auth

    hostile = "c1\n12:00:00 INFO fedcure.edge: forged\x1b[2J\u202e"
    member = SimpleNamespace(client_id=3, client_name=hostile,
                             supernode_public_key="ecdsa-sha2-nistp384 AAAA")
    reg = KeyRegistrar(channel("127.0.0.1:1"), 0, "t", keys_dir=tmp_path, connection="x",
                       env={})
    reg.stub = SimpleNamespace(Members=lambda req, timeout: SimpleNamespace(members=[member]))
    monkeypatch.setattr(supernode_auth, "register_supernode_key", lambda *a, **k: 7)
    with caplog.at_level(logging.INFO, logger="fedcure.edge"):
        assert reg.sync() == 1
    lines = [r.getMessage() for r in caplog.records if "SuperNode key" in r.getMessage()]
    assert len(lines) == 1 and one_line(lines[0]), lines
    assert "c1\\x0a12:00:00 INFO fedcure.edge: forged\\x1b[2J\\u202e" in lines[0]
