"""A model as one flat array inside a Flower message (fewer objects to move per message).

Flower 1.41 moves a message's content as separate objects: every array of an ``ArrayRecord`` is
an ``Array`` plus its chunks, so the paper's 6-tensor CNNs make 15 objects per message where one
concatenated array makes 5. Each object is its own HTTP request on every hop (edge → SuperLink →
SuperNode → ClientApp and back), and on a small machine those requests, not the bytes, are what
an edge round spends outside training. So the edge packs the model into one array
(:func:`pack`), the ClientApp unpacks it by its own model's shapes and answers in the form it
was sent, and the edge unpacks the average by the task's shapes (:func:`unpack`).

Packing concatenates the raveled arrays in order and unpacking reshapes slices of it, so the
numbers are untouched, and FedAvg, an element-wise weighted mean, gives bit-for-bit the same
values on the packed array as on the separate ones. Arrays of different dtypes are not packed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pack(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``[concatenation of the raveled arrays]`` when there are several of one dtype, else the
    arrays unchanged (one array, none, or mixed dtypes)."""
    arrs = [np.asarray(a) for a in arrays]
    if len(arrs) < 2 or len({a.dtype for a in arrs}) != 1:
        return arrs
    return [np.concatenate([a.ravel() for a in arrs])]


def is_packed(arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]) -> bool:
    """Whether ``arrays`` is the packed form of arrays with ``shapes`` (more than one)."""
    return (len(shapes) > 1 and len(arrays) == 1 and np.ndim(arrays[0]) == 1
            and int(np.size(arrays[0])) == sum(int(np.prod(s, dtype=np.int64)) for s in shapes))


def unpack(arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """The arrays of ``shapes`` from their packed form (views into it), or ``arrays`` unchanged
    when they are not packed; ``ValueError`` when they fit neither."""
    arrs = [np.asarray(a) for a in arrays]
    if not is_packed(arrs, shapes):
        if len(arrs) == len(shapes):
            return arrs
        total = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
        raise ValueError(f"got {len(arrs)} arrays ({sum(a.size for a in arrs)} values) for "
                         f"{len(shapes)} tensors ({total} values)")
    out, start = [], 0
    for s in shapes:
        n = int(np.prod(s, dtype=np.int64))
        out.append(arrs[0][start:start + n].reshape(s))
        start += n
    return out


__all__ = ["is_packed", "pack", "unpack"]
