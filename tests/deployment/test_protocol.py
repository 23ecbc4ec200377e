"""The proto, its committed stubs, and the fast wire path for models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import (
    CodecError,
    WithModel,
    decode_arrays,
    encode_arrays,
    encode_parts,
    parse_submit,
    parse_task,
    serialize_with_model,
)

HERE = Path(__file__).resolve().parents[2] / "fedcure_app" / "protocol"


def test_committed_stubs_match_the_proto():
    pytest.importorskip("grpc_tools")
    from fedcure_app.protocol.generate import main

    assert main(["--check"]) == 0, "run: python -m fedcure_app.protocol.generate"


def test_generated_grpc_module_imports_its_messages_package_relative():
    text = (HERE / "cloud_pb2_grpc.py").read_text()
    assert "from . import cloud_pb2 as" in text
    assert pb.DESCRIPTOR.package == "fedcure.v1"


def _task(model: bytes) -> pb.Task:
    return pb.Task(task_id="r3-c1-v2", coalition=1, version=2, model=model, tau_e=12, tau_c=5,
                   lr=0.01, batch_size=32, client_ids=[4, 9], frequencies_ghz={4: 1.1, 9: 0.7},
                   seed=123, round=3, t_hat_round_s=1.5)


def test_model_beside_the_message_gives_the_same_wire_bytes_as_protobuf():
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(5, np.float64)]
    blob = encode_arrays(arrays)
    plain = _task(blob)
    head = _task(b"")
    for model in (blob, encode_parts(arrays), memoryview(blob)):
        wire = serialize_with_model(WithModel(head, model))
        assert pb.Task.FromString(wire) == plain
    # and parsing plain protobuf bytes keeps the model out of the message, as a view
    got = parse_task(plain.SerializeToString())
    assert isinstance(got.model, memoryview) and got.message.model == b""
    assert got.full() == plain
    assert all(np.array_equal(a, b) for a, b in zip(arrays, decode_arrays(got.model)))


def test_submit_request_split_keeps_repeated_fields():
    req = pb.SubmitRequest(task_id="t", edge_id=2, model=b"xyz", num_samples=7,
                           stats=[pb.ClientStat(client_id=i, seconds=0.5) for i in range(300)],
                           dropped_client_ids=[5, 6], latency_s=2.0, token="k")
    got = parse_submit(req.SerializeToString())
    assert bytes(got.model) == b"xyz"
    assert got.full() == req


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_truncated_wire_bytes_are_a_codec_error(cut):
    wire = _task(encode_arrays([np.ones(50, np.float32)])).SerializeToString()
    with pytest.raises(CodecError):
        parse_task(wire[:-cut])
