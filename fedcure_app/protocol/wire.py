"""gRPC options and the protobuf wire path that carries a model without extra copies.

:data:`GRPC_OPTIONS` is the one list of channel/server options every FedCure gRPC endpoint uses
(:data:`MAX_MESSAGE_BYTES` = 512 MiB messages, no shared ports, keepalive, many concurrent
streams).

Large models: protobuf copies a ``bytes`` field when it is set, serialised, parsed and read back.
:class:`WithModel` keeps the model (a :mod:`fedcure_app.protocol.arrays` buffer) beside a
``Task``/``SubmitRequest`` instead: the cloud's ``EdgeLink`` service (:func:`edge_link_handler`)
and the edge's :class:`EdgeLinkClient` use it, so a model is copied once into the wire bytes
when sent and parsed as a zero-copy view when received. The bytes on the wire are ordinary
protobuf (the model is the length-delimited field :data:`TASK_MODEL_FIELD` /
:data:`SUBMIT_MODEL_FIELD`, appended after the rest of the message): plain generated stubs
interoperate. Malformed wire bytes raise :class:`~fedcure_app.protocol.errors.CodecError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.errors import CodecError

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


__all__ = [
    "EDGE_LINK", "EdgeLinkClient", "GRPC_OPTIONS", "MAX_MESSAGE_BYTES", "SUBMIT_MODEL_FIELD",
    "TASK_MODEL_FIELD", "WithModel", "edge_link_handler", "parse_submit", "parse_task",
    "serialize_with_model", "split_model", "unwrap",
]
