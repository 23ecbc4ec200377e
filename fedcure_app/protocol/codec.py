"""The protocol's public names in one place, re-exported from the three modules that hold them.

- :mod:`fedcure_app.protocol.arrays`: the one binary model format (safetensors bytes of an
  ordered list of numpy arrays): :func:`encode_arrays`, :func:`encode_parts`,
  :func:`decode_arrays`, :func:`read_header`, :func:`check_like`, :func:`tensor_key`,
  :class:`CodecError`, :data:`FORMAT_NAME` and the limits :data:`MAX_NDIM`, :data:`MAX_DIM`;
- :mod:`fedcure_app.protocol.wire`: gRPC options (:data:`GRPC_OPTIONS`,
  :data:`MAX_MESSAGE_BYTES`) and the protobuf wire path that keeps a model beside its message
  (:class:`WithModel`, :func:`serialize_with_model`, :func:`split_model`, :func:`parse_task`,
  :func:`parse_submit`, :func:`unwrap`, :class:`EdgeLinkClient`, :func:`edge_link_handler`);
- :mod:`fedcure_app.protocol.convert`: value types ↔ protobuf messages (``profile_*``,
  ``task_*``, ``report_*``, ``result_*``, ``evaluation_*``).

Import from here or from the module itself; both name the same objects.
"""

from __future__ import annotations

from fedcure_app.protocol.arrays import (
    FORMAT_NAME,
    MAX_DIM,
    MAX_NDIM,
    CodecError,
    check_like,
    decode_arrays,
    encode_arrays,
    encode_parts,
    read_header,
    tensor_key,
)
from fedcure_app.protocol.convert import (
    evaluation_from_proto,
    evaluation_to_proto,
    profile_from_proto,
    profile_to_proto,
    report_from_proto,
    report_to_proto,
    result_from_proto,
    result_to_proto,
    result_to_wire,
    task_from_proto,
    task_to_proto,
    task_to_wire,
)
from fedcure_app.protocol.wire import (
    EDGE_LINK,
    GRPC_OPTIONS,
    MAX_MESSAGE_BYTES,
    SUBMIT_MODEL_FIELD,
    TASK_MODEL_FIELD,
    EdgeLinkClient,
    WithModel,
    edge_link_handler,
    parse_submit,
    parse_task,
    serialize_with_model,
    split_model,
    unwrap,
)

__all__ = [
    "CodecError", "EDGE_LINK", "EdgeLinkClient", "FORMAT_NAME", "GRPC_OPTIONS", "MAX_DIM",
    "MAX_MESSAGE_BYTES", "MAX_NDIM", "SUBMIT_MODEL_FIELD", "TASK_MODEL_FIELD", "WithModel",
    "check_like", "decode_arrays", "edge_link_handler", "evaluation_from_proto",
    "evaluation_to_proto", "encode_arrays", "encode_parts",
    "parse_submit", "parse_task", "profile_from_proto", "profile_to_proto", "read_header",
    "report_from_proto", "report_to_proto", "result_from_proto", "result_to_proto",
    "result_to_wire", "serialize_with_model", "split_model", "task_from_proto", "task_to_proto",
    "task_to_wire", "tensor_key", "unwrap",
]
