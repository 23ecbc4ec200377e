"""The one binary model format, gRPC channel options, and proto ↔ value-type converters.

Model format
------------
A model is an ordered list of numpy arrays. On the wire (and in ``final_model.safetensors``) it
is a standard `safetensors <https://github.com/huggingface/safetensors>`_ buffer:

- 8 bytes: little-endian u64 ``N``, the header length;
- ``N`` bytes: a JSON object ``{"0000": {"dtype": "F32", "shape": [32, 1, 3, 3],
  "data_offsets": [0, 1152]}, "0001": {...}, ..., "__metadata__": {"format": "fedcure-arrays/1",
  "count": "2"}}``, padded with spaces to a multiple of 8 bytes;
- the tensors' raw little-endian C-order bytes, back to back, in index order.

Keys are the tensor's index zero-padded to four digits (``"0000"``, ``"0001"``, …, ``"9999"``,
then ``"10000"``…); the list order is the index order, whatever order the JSON keys are in.
Supported dtypes: F64 F32 F16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL (numpy has no BF16).
Buffers written by ``safetensors.numpy.save`` with such keys decode, and what
:func:`encode_arrays` writes loads with ``safetensors.numpy.load``.

:func:`encode_arrays` copies each tensor's bytes exactly once (into the result);
:func:`decode_arrays` copies nothing: it returns read-only ``np.frombuffer`` views into the
given buffer (``copy=True`` for writable arrays). Any malformed input raises :class:`CodecError`
(a ``ValueError``) naming what is wrong.

gRPC
----
:data:`GRPC_OPTIONS` is the one list of channel/server options every FedCure gRPC endpoint uses
(512 MiB messages, no shared ports, keepalive, many concurrent streams).

Large models: protobuf copies a ``bytes`` field when it is set, serialised, parsed and read back.
:class:`WithModel` keeps the model beside a ``Task``/``SubmitRequest`` instead: the cloud's
``EdgeLink`` service (:func:`edge_link_handler`) and the edge's :class:`EdgeLinkClient` use it,
so a model is copied once into the wire bytes when sent and parsed as a zero-copy view when
received. The bytes on the wire are ordinary protobuf: plain generated stubs interoperate.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcure_app.devices import DeviceProfile, ProfileError, parse_profile
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.tasks import ClientReport, EdgeResult, EdgeTask

#: Largest gRPC message (bytes) sent or received: a model plus its envelope.
MAX_MESSAGE_BYTES = 512 * 1024 * 1024

#: Options for every FedCure gRPC server and channel (cloud, edge link, client association).
GRPC_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # servers: a port already taken is an error, not silently shared (gRPC defaults to
    # SO_REUSEPORT, which lets two clouds bind the same port); ignored by channels
    ("grpc.so_reuseport", 0),
    # Register calls wait for formation: one cloud holds one stream per waiting client.
    ("grpc.max_concurrent_streams", 100_000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
]

FORMAT_NAME = "fedcure-arrays/1"
_MAX_HEADER = 100 * 1024 * 1024
#: most dimensions one tensor may have (numpy's own limit is 64)
MAX_NDIM = 32
#: largest size of one dimension (2**40: far beyond any model, far below numpy's limit)
MAX_DIM = 2**40
_LITTLE = np.little_endian

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_CODES: dict[tuple[str, int], str] = {(d.kind, d.itemsize): code for code, d in _DTYPES.items()}


class CodecError(ValueError):
    """A model buffer or message that cannot be decoded, phrased as one actionable line."""


def tensor_key(index: int) -> str:
    """The safetensors key of the tensor at ``index``: ``"0000"``, ``"0001"``, …"""
    return f"{index:04d}"


def _dtype_code(dtype: np.dtype) -> str:
    code = _CODES.get((dtype.kind, dtype.itemsize))
    if code is None or dtype.kind not in "fiub":
        raise CodecError(
            f"unsupported dtype {dtype}; the model format carries "
            f"{', '.join(_DTYPES)} (numpy names float64 … bool)"
        )
    return code


def encode_parts(arrays: Sequence[np.ndarray], metadata: Mapping[str, str] | None = None
                 ) -> list[bytes | memoryview]:
    """The model format as a list of buffers (header, then each tensor's bytes), copying nothing.

    ``b"".join(parts)`` is :func:`encode_arrays`'s result. The tensor buffers are views of the
    arrays (or of little-endian / C-contiguous copies when an array is neither): do not change
    the arrays while the parts are in use.
    """
    header: dict[str, Any] = {}
    chunks: list[bytes | memoryview] = []
    offset = 0
    for i, a in enumerate(arrays):
        arr = np.asarray(a)
        code = _dtype_code(arr.dtype)
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not _LITTLE):
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
        nbytes = arr.nbytes
        header[tensor_key(i)] = {
            "dtype": code,
            "shape": [int(s) for s in arr.shape],
            "data_offsets": [offset, offset + nbytes],
        }
        if nbytes:
            chunks.append(memoryview(arr.reshape(-1).view(np.uint8)))
        offset += nbytes
    meta = {"format": FORMAT_NAME, "count": str(len(header))}
    if metadata:
        meta.update({str(k): str(v) for k, v in metadata.items()})
    header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return [struct.pack("<Q", len(raw)) + raw, *chunks]


def encode_arrays(arrays: Sequence[np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise an ordered list of arrays into the model format (safetensors bytes).

    Each tensor's bytes are copied once, straight into the result. ``metadata`` (str → str) is
    stored in the header's ``__metadata__`` next to ``format`` and ``count``.
    """
    return b"".join(encode_parts(arrays, metadata))


def read_header(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any], int]:
    """Parse and validate a model buffer's header; return it and the data section's start."""
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    total = view.nbytes
    if total < 8:
        raise CodecError(f"model buffer too short ({total} bytes): not a safetensors model")
    (n,) = struct.unpack("<Q", view[:8])
    if n > _MAX_HEADER or 8 + n > total:
        raise CodecError(
            f"model buffer header length {n} does not fit in {total} bytes: "
            "not a safetensors model (truncated or garbage)"
        )
    try:
        header = json.loads(bytes(view[8 : 8 + n]).decode("utf-8"))
    except (ValueError, RecursionError) as err:  # JSON, UTF-8, deep nesting, huge integers
        raise CodecError(f"model buffer header is not valid JSON: {_short(err)}") from None
    if not isinstance(header, dict):
        raise CodecError("model buffer header is not a JSON object")
    return header, 8 + n


def _short(err: BaseException, limit: int = 120) -> str:
    """The first line of an error's text, at most ``limit`` characters."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def _clip(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (never echo a whole hostile header)."""
    try:
        text = repr(value)
    except ValueError:  # an integer too long to print
        text = "<unprintable>"
    return text if len(text) <= limit else text[:limit] + "…"


def decode_arrays(data: bytes | bytearray | memoryview, *, copy: bool = False) -> list[np.ndarray]:
    """Parse a model buffer (see the module docstring) into the ordered list of arrays.

    Without ``copy`` the arrays are read-only views into ``data`` (no copy; keep ``data``
    alive and unchanged). Raises :class:`CodecError` on anything malformed, and on nothing else:
    any other failure while decoding (a numpy or JSON limit) is turned into one.
    """
    try:
        return _decode_arrays(data, copy=copy)
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError, KeyError,
            IndexError, AttributeError, struct.error) as err:
        raise CodecError(f"model buffer cannot be decoded: {_short(err)}") from None


def _decode_arrays(data: bytes | bytearray | memoryview, *, copy: bool) -> list[np.ndarray]:
    header, start = read_header(data)
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    body = view[start:]
    meta = header.pop("__metadata__", None)
    if meta is not None and not isinstance(meta, dict):
        raise CodecError("model buffer __metadata__ is not a JSON object")
    n = len(header)
    expected = {tensor_key(i) for i in range(n)}
    if set(header) != expected:
        odd = sorted(set(header) - expected)[:3]
        raise CodecError(
            f"model buffer keys must be the indices 0000..{tensor_key(n - 1) if n else '0000'}; "
            f"found unexpected key(s) {_clip(odd)}"
        )
    spans = []
    out: list[np.ndarray] = []
    for i in range(n):
        key = tensor_key(i)
        info = header[key]
        if not isinstance(info, dict):
            raise CodecError(f"tensor {key}: entry is not a JSON object")
        code = info.get("dtype")
        dtype = _DTYPES.get(code) if isinstance(code, str) else None
        if dtype is None:
            raise CodecError(f"tensor {key}: unsupported dtype {_clip(code)}; expected one of "
                             f"{', '.join(_DTYPES)}")
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise CodecError(f"tensor {key}: shape {_clip(shape)} is not a list of sizes >= 0")
        if len(shape) > MAX_NDIM:
            raise CodecError(f"tensor {key}: {len(shape)} dimensions, at most {MAX_NDIM}")
        if any(s > MAX_DIM for s in shape):
            raise CodecError(f"tensor {key}: a dimension of shape {_clip(shape)} exceeds "
                             f"{MAX_DIM}")
        offs = info.get("data_offsets")
        if (
            not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        ):
            raise CodecError(f"tensor {key}: data_offsets {_clip(offs)} is not [begin, end]")
        b, e = offs
        count = math.prod(shape)
        if not 0 <= b <= e <= body.nbytes:
            raise CodecError(
                f"tensor {key}: data_offsets {_clip(offs)} outside the {body.nbytes}-byte data "
                "section"
            )
        if e - b != count * dtype.itemsize:
            raise CodecError(
                f"tensor {key}: {e - b} bytes for shape {_clip(shape)} of {code} "
                f"(needs {_clip(count * dtype.itemsize)})"
            )
        spans.append((b, e))
        arr = np.frombuffer(body, dtype=dtype, count=count, offset=b).reshape(shape)
        if dtype.byteorder == ">" or (dtype.byteorder == "<" and not _LITTLE):  # pragma: no cover
            arr = arr.astype(dtype.newbyteorder("="))
        out.append(arr.copy() if copy else arr)
    # safetensors' own rule: the tensors tile the data section exactly, no holes, no overlap
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            raise CodecError(f"model buffer data section has a hole or overlap at byte {pos}")
        pos = e
    if pos != body.nbytes:
        raise CodecError(
            f"model buffer has {body.nbytes - pos} trailing bytes after the last tensor"
        )
    return out


def check_like(arrays: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> None:
    """Raise :class:`CodecError` unless ``arrays`` match ``reference`` tensor by tensor
    (count, shape, dtype) and are all finite."""
    if len(arrays) != len(reference):
        raise CodecError(f"model has {len(arrays)} tensors, expected {len(reference)}")
    for i, (a, r) in enumerate(zip(arrays, reference)):
        if a.shape != r.shape:
            raise CodecError(f"tensor {tensor_key(i)} has shape {list(a.shape)}, "
                             f"expected {list(r.shape)}")
        if a.dtype != r.dtype:
            raise CodecError(f"tensor {tensor_key(i)} has dtype {a.dtype}, expected {r.dtype}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CodecError(f"tensor {tensor_key(i)} holds NaN or infinite values")


# ------------------------------------------------------------------------------ fast wire path
#: Field number of ``model`` in ``Task`` and in ``SubmitRequest`` (see cloud.proto).
TASK_MODEL_FIELD = pb.Task.DESCRIPTOR.fields_by_name["model"].number
SUBMIT_MODEL_FIELD = pb.SubmitRequest.DESCRIPTOR.fields_by_name["model"].number


@dataclass(frozen=True)
class WithModel:
    """A ``Task`` or ``SubmitRequest`` whose ``model`` bytes travel beside the message.

    ``message`` has its ``model`` field empty; ``model`` is the codec buffer: ``bytes``, a
    zero-copy ``memoryview`` into the received gRPC message (after :func:`parse_task` /
    :func:`parse_submit`), or the list of buffers :func:`encode_parts` gives, which the sender
    joins straight into the wire bytes (the arrays are then copied exactly once). The wire
    bytes are exactly those of the full protobuf message, so a peer using the plain generated
    stubs interoperates; this path only saves the copies protobuf makes of a large bytes field
    (setting it, serialising it, parsing it, reading it back).
    """

    message: Any
    model: bytes | memoryview | Sequence[bytes | memoryview]

    def model_bytes(self) -> bytes | memoryview:
        """The model buffer (parts from :func:`encode_parts` are joined, i.e. copied)."""
        if isinstance(self.model, (bytes, bytearray, memoryview)):
            return self.model
        return b"".join(self.model)

    def full(self) -> Any:
        """The ordinary protobuf message with ``model`` set (copies the model)."""
        out = type(self.message)()
        out.CopyFrom(self.message)
        out.model = bytes(self.model_bytes())
        return out

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's spelling
        return serialize_with_model(self)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end or shift > 63:
            raise CodecError("truncated or malformed protobuf message (varint)")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def serialize_with_model(obj: Any) -> bytes:
    """Wire bytes of a message, copying a :class:`WithModel`'s model exactly once."""
    if not isinstance(obj, WithModel):
        return obj.SerializeToString()
    field_no = obj.message.DESCRIPTOR.fields_by_name["model"].number
    head = obj.message.SerializeToString()
    model = obj.model
    parts = [model] if isinstance(model, (bytes, bytearray, memoryview)) else list(model)
    size = sum(memoryview(p).nbytes for p in parts)
    return b"".join([head, _varint((field_no << 3) | 2), _varint(size), *parts])


def split_model(data: bytes | memoryview, cls: Any) -> WithModel:
    """Parse wire bytes of ``cls`` (Task or SubmitRequest) without copying the model field."""
    view = memoryview(data)
    field_no = cls.DESCRIPTOR.fields_by_name["model"].number
    rest: list[memoryview] = []
    model: memoryview = view[0:0]
    pos, end = 0, len(view)
    while pos < end:
        start = pos
        key, pos = _read_varint(view, pos)
        wire, num = key & 7, key >> 3
        if wire == 0:
            _, pos = _read_varint(view, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = _read_varint(view, pos)
            if num == field_no:
                if pos + n > end:
                    raise CodecError("truncated protobuf message (model field)")
                model = view[pos : pos + n]
                pos += n
                continue
            pos += n
        else:
            raise CodecError(f"malformed protobuf message (wire type {wire})")
        if pos > end:
            raise CodecError("truncated protobuf message")
        rest.append(view[start:pos])
    try:
        msg = cls.FromString(b"".join(rest))
    except Exception as err:  # protobuf's DecodeError
        raise CodecError(f"malformed {cls.__name__} message: {err}") from None
    return WithModel(msg, model)


def parse_task(data: bytes) -> WithModel:
    """gRPC deserializer for ``Task``: the model stays a view into ``data``."""
    return split_model(data, pb.Task)


def parse_submit(data: bytes) -> WithModel:
    """gRPC deserializer for ``SubmitRequest``: the model stays a view into ``data``."""
    return split_model(data, pb.SubmitRequest)


def unwrap(obj: Any) -> tuple[Any, bytes | memoryview]:
    """``(message, model bytes)`` of a plain message or a :class:`WithModel`."""
    if isinstance(obj, WithModel):
        return obj.message, obj.model_bytes()
    return obj, obj.model


EDGE_LINK = "fedcure.v1.EdgeLink"


class EdgeLinkClient:
    """The edge's side of ``EdgeLink`` with the fast wire path (a drop-in for ``EdgeLinkStub``).

    ``connect(request)`` yields :class:`WithModel` tasks; ``submit(request)`` takes a
    ``SubmitRequest`` or a :class:`WithModel` (e.g. from :func:`result_to_wire`).
    """

    def __init__(self, channel: Any) -> None:
        self.Connect = channel.unary_stream(
            f"/{EDGE_LINK}/Connect",
            request_serializer=pb.ConnectRequest.SerializeToString,
            response_deserializer=parse_task,
        )
        self.Submit = channel.unary_unary(
            f"/{EDGE_LINK}/Submit",
            request_serializer=serialize_with_model,
            response_deserializer=pb.SubmitReply.FromString,
        )

    def connect(self, request: pb.ConnectRequest, **kw: Any) -> Any:
        return self.Connect(request, **kw)

    def submit(self, request: Any, **kw: Any) -> pb.SubmitReply:
        return self.Submit(request, **kw)


def edge_link_handler(servicer: Any) -> Any:
    """A generic gRPC handler serving ``EdgeLink`` on ``servicer`` with the fast wire path:
    ``Submit`` receives a :class:`WithModel` and ``Connect`` may yield :class:`WithModel` tasks."""
    import grpc

    return grpc.method_handlers_generic_handler(EDGE_LINK, {
        "Connect": grpc.unary_stream_rpc_method_handler(
            servicer.Connect,
            request_deserializer=pb.ConnectRequest.FromString,
            response_serializer=serialize_with_model,
        ),
        "Submit": grpc.unary_unary_rpc_method_handler(
            servicer.Submit,
            request_deserializer=parse_submit,
            response_serializer=pb.SubmitReply.SerializeToString,
        ),
        "Members": grpc.unary_unary_rpc_method_handler(
            servicer.Members,
            request_deserializer=pb.MembersRequest.FromString,
            response_serializer=pb.MembersReply.SerializeToString,
        ),
    })


# ------------------------------------------------------------------------------ device profiles
def profile_to_proto(profile: DeviceProfile) -> pb.DeviceProfile:
    """A :class:`DeviceProfile` as its proto message."""
    return pb.DeviceProfile(
        name=profile.name,
        f_min_ghz=profile.f_min_ghz,
        f_max_ghz=profile.f_max_ghz,
        cycles_per_sample=dict(profile.cycles_per_sample),
        uplink_mbps=profile.uplink_mbps,
        downlink_mbps=profile.downlink_mbps,
        kappa=profile.kappa,
        jitter=profile.jitter,
    )


def profile_from_proto(msg: pb.DeviceProfile) -> DeviceProfile:
    """The validated :class:`DeviceProfile` of a proto message (:class:`CodecError` if invalid)."""
    data: dict[str, Any] = {
        "name": msg.name,
        "f_min_ghz": msg.f_min_ghz,
        "f_max_ghz": msg.f_max_ghz,
        "cycles_per_sample": dict(msg.cycles_per_sample),
        "uplink_mbps": msg.uplink_mbps,
        "downlink_mbps": msg.downlink_mbps,
        "kappa": msg.kappa,
    }
    if msg.HasField("jitter"):
        data["jitter"] = msg.jitter
    try:
        return parse_profile(data)
    except ProfileError as err:
        raise CodecError(f"invalid device profile: {err}") from None


# ------------------------------------------------------------------------------ tasks
def _task_header(task: EdgeTask, round: int, t_hat_round_s: float) -> pb.Task:
    return pb.Task(
        task_id=task.task_id,
        coalition=task.coalition,
        version=task.version,
        tau_e=task.tau_e,
        tau_c=task.tau_c,
        lr=task.lr,
        batch_size=task.batch_size,
        client_ids=[int(c) for c in task.clients],
        frequencies_ghz={int(c): float(f) for c, f in task.frequencies_ghz.items()},
        seed=task.seed,
        round=round,
        t_hat_round_s=t_hat_round_s,
    )


def task_to_proto(task: EdgeTask, *, model: bytes | None = None, round: int = 0,
                  t_hat_round_s: float = 0.0) -> pb.Task:
    """An :class:`EdgeTask` as a ``Task`` message; ``model`` = already encoded arrays, if any."""
    msg = _task_header(task, round, t_hat_round_s)
    msg.model = encode_arrays(task.arrays) if model is None else model
    return msg


def task_to_wire(task: EdgeTask, *, model: bytes | None = None, round: int = 0,
                 t_hat_round_s: float = 0.0) -> WithModel:
    """Like :func:`task_to_proto`, with the model kept beside the message (no extra copy)."""
    return WithModel(_task_header(task, round, t_hat_round_s),
                     encode_parts(task.arrays) if model is None else model)


def task_from_proto(msg: pb.Task | WithModel, *, copy: bool = False) -> EdgeTask:
    """The :class:`EdgeTask` of a ``Task`` (plain or :class:`WithModel`; model decoded, as
    read-only views into the message unless ``copy``)."""
    msg, model = unwrap(msg)
    return EdgeTask(
        task_id=msg.task_id,
        coalition=msg.coalition,
        version=msg.version,
        arrays=decode_arrays(model, copy=copy),
        clients=tuple(int(c) for c in msg.client_ids),
        frequencies_ghz={int(c): float(f) for c, f in msg.frequencies_ghz.items()},
        tau_e=msg.tau_e,
        tau_c=msg.tau_c,
        lr=msg.lr,
        batch_size=msg.batch_size,
        seed=int(msg.seed),
    )


# ------------------------------------------------------------------------------ results
def report_to_proto(report: ClientReport) -> pb.ClientStat:
    """A :class:`ClientReport` as a ``ClientStat`` message."""
    return pb.ClientStat(
        client_id=report.client,
        edge_round=report.edge_round,
        samples=report.samples,
        seconds=report.seconds,
        f_applied_ghz=report.f_applied_ghz,
        loss=report.loss,
    )


def report_from_proto(msg: pb.ClientStat) -> ClientReport:
    """The :class:`ClientReport` of a ``ClientStat`` message."""
    return ClientReport(
        client=msg.client_id,
        edge_round=msg.edge_round,
        samples=int(msg.samples),
        seconds=msg.seconds,
        f_applied_ghz=msg.f_applied_ghz,
        loss=msg.loss,
    )


def _submit_header(result: EdgeResult, edge_id: int, latency_s: float, token: str
                   ) -> pb.SubmitRequest:
    return pb.SubmitRequest(
        task_id=result.task_id,
        edge_id=edge_id,
        num_samples=result.num_samples,
        stats=[report_to_proto(r) for r in result.reports],
        dropped_client_ids=[int(c) for c in result.dropped],
        latency_s=latency_s,
        token=token,
    )


def result_to_proto(result: EdgeResult, *, edge_id: int, latency_s: float, token: str = "",
                    model: bytes | None = None) -> pb.SubmitRequest:
    """An :class:`EdgeResult` as a ``SubmitRequest`` from ES ``edge_id``."""
    msg = _submit_header(result, edge_id, latency_s, token)
    msg.model = encode_arrays(result.arrays) if model is None else model
    return msg


def result_to_wire(result: EdgeResult, *, edge_id: int, latency_s: float, token: str = "",
                   model: bytes | None = None) -> WithModel:
    """Like :func:`result_to_proto`, with the model beside the message (for
    :class:`EdgeLinkClient`): the arrays are copied once, into the wire bytes, when sent; do not
    change them before the call returns."""
    return WithModel(_submit_header(result, edge_id, latency_s, token),
                     encode_parts(result.arrays) if model is None else model)


def result_from_proto(msg: pb.SubmitRequest | WithModel, coalition: int, *,
                      copy: bool = False) -> EdgeResult:
    """The :class:`EdgeResult` of a ``SubmitRequest`` (its task's ``coalition`` given)."""
    msg, model = unwrap(msg)
    return EdgeResult(
        task_id=msg.task_id,
        coalition=coalition,
        arrays=decode_arrays(model, copy=copy),
        num_samples=int(msg.num_samples),
        reports=[report_from_proto(s) for s in msg.stats],
        dropped=[int(c) for c in msg.dropped_client_ids],
    )


__all__ = [
    "CodecError", "EdgeLinkClient", "FORMAT_NAME", "GRPC_OPTIONS", "MAX_MESSAGE_BYTES",
    "WithModel", "check_like", "decode_arrays", "edge_link_handler", "encode_arrays",
    "encode_parts",
    "parse_submit", "parse_task", "profile_from_proto", "profile_to_proto", "read_header",
    "report_from_proto", "report_to_proto", "result_from_proto", "result_to_proto",
    "result_to_wire", "serialize_with_model", "split_model", "task_from_proto", "task_to_proto",
    "task_to_wire", "tensor_key", "unwrap",
]
