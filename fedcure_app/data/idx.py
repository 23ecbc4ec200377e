"""IDX files (the MNIST format), plain or gzip-compressed, parsed with numpy.

Layout: a 4-byte big-endian magic ``0x00 0x00 <type> <ndim>`` (type 0x08 = unsigned byte), then
``ndim`` big-endian uint32 sizes, then exactly ``prod(sizes)`` bytes of data.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from fedcure_app.data.errors import CorruptDatasetError, MissingDatasetError

_UBYTE = 0x08


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when its name ends in ``.gz``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MissingDatasetError(f"{path}: file not found") from None
    except OSError as err:
        raise CorruptDatasetError(f"{path}: cannot read ({err.strerror or err})") from None
    if path.suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise CorruptDatasetError(f"{path}: bad gzip data ({err})") from None


def parse_idx(buf: bytes, ndim: int, source: str) -> np.ndarray:
    """Parse an unsigned-byte IDX buffer with ``ndim`` dimensions into a uint8 array (a view)."""
    expected_magic = (_UBYTE << 8) | ndim
    if len(buf) < 4:
        raise CorruptDatasetError(f"{source}: truncated IDX header ({len(buf)} bytes)")
    magic = int.from_bytes(buf[:4], "big")
    if magic != expected_magic:
        raise CorruptDatasetError(
            f"{source}: bad magic number 0x{magic:08x}, expected 0x{expected_magic:08x} "
            f"(IDX unsigned bytes, {ndim}-D)"
        )
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise CorruptDatasetError(f"{source}: truncated IDX header ({len(buf)} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(buf, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64))
    body = len(buf) - header
    if body != expected:
        shape = "×".join(map(str, dims))
        raise CorruptDatasetError(
            f"{source}: wrong length: header says {shape} = {expected} data bytes, "
            f"file has {body}"
        )
    return np.frombuffer(buf, dtype=np.uint8, offset=header).reshape(dims)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read and parse one IDX file (gzip by ``.gz`` suffix)."""
    return parse_idx(read_bytes(path), ndim, str(path))
