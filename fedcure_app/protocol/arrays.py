"""The one binary model format: an ordered list of numpy arrays as safetensors bytes.

A model is an ordered list of numpy arrays. On the wire (and in ``final_model.safetensors``) it
is a standard `safetensors <https://github.com/huggingface/safetensors>`_ buffer:

- 8 bytes: little-endian u64 ``N``, the header length in bytes;
- ``N`` bytes: a JSON object ``{"0000": {"dtype": "F32", "shape": [32, 1, 3, 3],
  "data_offsets": [0, 1152]}, "0001": {...}, ..., "__metadata__": {"format": "fedcure-arrays/1",
  "count": "2"}}``, padded with spaces to a multiple of 8 bytes;
- the tensors' raw little-endian C-order bytes, back to back, in index order
  (``data_offsets`` are byte offsets into this data section).

Keys are the tensor's index zero-padded to four digits (``"0000"``, ``"0001"``, …, ``"9999"``,
then ``"10000"``…); the list order is the index order, whatever order the JSON keys are in.
Supported dtypes: F64 F32 F16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL (numpy has no BF16).
Buffers written by ``safetensors.numpy.save`` with such keys decode, and what
:func:`encode_arrays` writes loads with ``safetensors.numpy.load``. Limits: a header of at most
100 MiB, at most :data:`MAX_NDIM` dimensions per tensor, each at most :data:`MAX_DIM`.

:func:`encode_arrays` copies each tensor's bytes exactly once (into the result);
:func:`encode_parts` gives the same bytes as a list of buffers, copying nothing;
:func:`decode_arrays` copies nothing: it returns read-only ``np.frombuffer`` views into the
given buffer (``copy=True`` for writable arrays). Any malformed input raises :class:`CodecError`
(a ``ValueError``) naming what is wrong. :func:`check_like` checks decoded arrays against a
reference model (count, shapes, dtypes, finite values).

Depends on numpy only; :mod:`fedcure_app.protocol.wire` carries these buffers over gRPC.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedcure_app.protocol.errors import CodecError

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


__all__ = [
    "CodecError", "FORMAT_NAME", "MAX_DIM", "MAX_NDIM", "check_like", "decode_arrays",
    "encode_arrays", "encode_parts", "read_header", "tensor_key",
]
