"""The binary model format and the proto converters."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from fedcure_app.devices import PRESETS
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import (
    GRPC_OPTIONS,
    MAX_MESSAGE_BYTES,
    CodecError,
    check_like,
    decode_arrays,
    encode_arrays,
    profile_from_proto,
    profile_to_proto,
    result_from_proto,
    result_to_proto,
    task_from_proto,
    task_to_proto,
    tensor_key,
)
from fedcure_app.tasks import ClientReport, EdgeResult, EdgeTask

DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
          np.uint64, np.uint32, np.uint16, np.uint8, np.bool_]

arrays_strategy = st.lists(
    st.sampled_from(DTYPES).flatmap(
        lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    ),
    min_size=0, max_size=6,
)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=60, deadline=None)
@given(arrays_strategy)
def test_round_trip_keeps_order_dtypes_shapes_and_bits(arrays):
    blob = encode_arrays(arrays)
    out = decode_arrays(blob)
    assert len(out) == len(arrays)
    assert all(same(a, b) for a, b in zip(arrays, out))
    # standard safetensors: the reference library reads it, keys are zero-padded indices
    ref = st_load(blob)
    assert sorted(ref) == [tensor_key(i) for i in range(len(arrays))]
    assert all(same(arrays[i], ref[tensor_key(i)]) for i in range(len(arrays)))


@settings(max_examples=30, deadline=None)
@given(arrays_strategy)
def test_decodes_what_the_safetensors_library_writes(arrays):
    blob = st_save({tensor_key(i): np.ascontiguousarray(a) if a.ndim else a
                    for i, a in enumerate(arrays)})
    out = decode_arrays(blob)
    assert all(same(a, b) for a, b in zip(arrays, out))


def test_views_are_read_only_and_copy_gives_writable_arrays():
    blob = encode_arrays([np.arange(4, dtype=np.float32)])
    (view,) = decode_arrays(blob)
    assert not view.flags.writeable
    (own,) = decode_arrays(blob, copy=True)
    own[0] = 7.0
    assert own.flags.writeable and view[0] == 0.0


def test_non_contiguous_and_big_endian_inputs_are_normalised():
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T
    b = np.arange(3, dtype=">i4")
    out = decode_arrays(encode_arrays([a, b]))
    assert np.array_equal(out[0], a) and np.array_equal(out[1], b)
    assert out[1].dtype == np.int32


def test_metadata_is_kept_in_the_header():
    blob = encode_arrays([np.zeros(2, np.float32)], {"version": "7"})
    (n,) = struct.unpack("<Q", blob[:8])
    meta = json.loads(blob[8:8 + n])["__metadata__"]
    assert meta["version"] == "7" and meta["format"] == "fedcure-arrays/1"


def _blob_with_header(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize(
    ("blob", "needle"),
    [
        (b"", "too short"),
        (b"\x00\x01", "too short"),
        (b"not a model at all, just some text", "does not fit"),
        (struct.pack("<Q", 4) + b"{{{{", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (_blob_with_header({"weights": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                           b"\0" * 4), "unexpected key"),
        (_blob_with_header({"0000": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}},
                           b"\0" * 2), "unsupported dtype"),
        (_blob_with_header({"0000": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
                           b"\0" * 4), "shape"),
        (_blob_with_header({"0000": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
                           b"\0" * 4), "needs 8"),
        (_blob_with_header({"0000": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                           b"\0" * 8), "trailing"),
        (_blob_with_header({"0000": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
                           b"\0" * 8), "hole"),
        (_blob_with_header({"0000": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                           b"\0" * 8), "outside"),
    ],
)
def test_garbage_gives_a_clear_codec_error(blob, needle):
    with pytest.raises(CodecError, match=needle):
        decode_arrays(blob)


def test_truncated_model_is_rejected():
    blob = encode_arrays([np.ones((10, 10), np.float32)])
    for cut in (1, 7, 100, len(blob) - 1):
        with pytest.raises(CodecError):
            decode_arrays(blob[:cut])


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_another_exception(data):
    try:
        decode_arrays(data)
    except CodecError:
        pass


def test_check_like_names_the_mismatch():
    ref = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    check_like([np.ones((2, 3), np.float32), np.ones(3, np.float32)], ref)
    with pytest.raises(CodecError, match="1 tensors, expected 2"):
        check_like(ref[:1], ref)
    with pytest.raises(CodecError, match=r"shape \[3, 2\], expected \[2, 3\]"):
        check_like([np.zeros((3, 2), np.float32), ref[1]], ref)
    with pytest.raises(CodecError, match="dtype float64"):
        check_like([ref[0], np.zeros(3)], ref)
    with pytest.raises(CodecError, match="NaN"):
        check_like([ref[0], np.array([0, np.nan, 0], np.float32)], ref)


def test_grpc_options_raise_message_limits():
    opts = dict(GRPC_OPTIONS)
    assert opts["grpc.max_send_message_length"] == MAX_MESSAGE_BYTES >= 512 * 2**20
    assert opts["grpc.max_receive_message_length"] == MAX_MESSAGE_BYTES


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_device_profile_round_trip(name):
    p = PRESETS[name]
    msg = pb.DeviceProfile.FromString(profile_to_proto(p).SerializeToString())
    assert profile_from_proto(msg) == p


def test_invalid_device_profile_is_a_codec_error():
    msg = profile_to_proto(PRESETS["rpi4"])
    msg.f_min_ghz = 5.0  # above f_max
    with pytest.raises(CodecError, match="f_min_ghz"):
        profile_from_proto(msg)
    msg = profile_to_proto(PRESETS["rpi4"])
    msg.ClearField("jitter")
    assert profile_from_proto(msg).jitter == 0.1


def test_task_and_result_round_trip_through_the_wire():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)]
    task = EdgeTask("r1-c2", 2, 5, arrays, (3, 7), {3: 1.2, 7: 0.8}, 12, 5, 0.01, 32, 99)
    msg = pb.Task.FromString(task_to_proto(task, round=1, t_hat_round_s=2.5).SerializeToString())
    back = task_from_proto(msg)
    assert back.task_id == task.task_id and back.clients == task.clients
    assert back.frequencies_ghz == task.frequencies_ghz and back.seed == 99
    assert (back.tau_e, back.tau_c, back.lr, back.batch_size) == (12, 5, 0.01, 32)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back.arrays))
    assert msg.round == 1 and msg.t_hat_round_s == 2.5

    reports = [ClientReport(3, 0, 160, 1.5, 1.2, 0.7), ClientReport(7, 0, 160, 2.0, 0.8, 0.9)]
    res = EdgeResult("r1-c2", 2, arrays, 640, reports, dropped=[11])
    req = pb.SubmitRequest.FromString(
        result_to_proto(res, edge_id=2, latency_s=9.5, token="t").SerializeToString())
    assert req.edge_id == 2 and req.latency_s == 9.5 and req.token == "t"
    got = result_from_proto(req, coalition=2)
    assert got.num_samples == 640 and got.dropped == [11] and got.reports == res.reports
    assert all(np.array_equal(a, b) for a, b in zip(arrays, got.arrays))


def _json_values(depth: int = 3):
    leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8)
    return st.recursive(leaves, lambda kids: st.lists(kids, max_size=4)
                        | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=12)


_entry = st.fixed_dictionaries({}, optional={
    "dtype": st.sampled_from(["F32", "F64", "I8", "U8", "BOOL", "X9"]) | _json_values(),
    "shape": st.lists(st.integers(-2, 2**70), max_size=70) | _json_values(),
    "data_offsets": st.lists(st.integers(-2, 2**70), max_size=3) | _json_values(),
})


@settings(max_examples=120, deadline=None)
@given(header=st.dictionaries(st.sampled_from(["0000", "0001", "__metadata__", "x"]),
                              _entry | _json_values(), max_size=3) | _json_values(),
       body=st.binary(max_size=64))
def test_arbitrary_json_headers_raise_only_codec_errors(header, body):
    """Any JSON header (odd types, huge or negative sizes, 70 dimensions) and any data section
    decode or raise CodecError, never another exception."""
    raw = json.dumps(header).encode()
    try:
        decode_arrays(struct.pack("<Q", len(raw)) + raw + body)
    except CodecError:
        pass


@pytest.mark.parametrize("header, needle", [
    ('{"0000": {"dtype": "F32", "shape": [0, 1000000000000000000000000000000], '
     '"data_offsets": [0, 0]}}', "exceeds"),
    ('{"0000": {"dtype": "F32", "shape": [' + ", ".join(["1"] * 65) + '], '
     '"data_offsets": [0, 4]}}', "dimensions"),
    ("[" * 200_000 + "]" * 200_000, "JSON"),
    ('{"0000": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 4]}}',
     "JSON"),
])
def test_hostile_headers_are_codec_errors_with_short_messages(header, needle):
    raw = header.encode()
    with pytest.raises(CodecError, match=needle) as err:
        decode_arrays(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    assert len(str(err.value)) < 300
