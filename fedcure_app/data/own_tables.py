"""Rows and arrays of a client's own data: CSV files and ``.npz`` archives.

A CSV has a header, numeric feature columns and one label column whose values are class names
(matched as text). An ``.npz`` has ``x`` and ``y`` (and optionally ``x_test``/``y_test``): ``y``
holds class names, or integers that index an optional ``classes`` array in the file, or,
without one, integers whose text (``"3"``) is a class name of the task. Every refusal is one
line naming the file and the row, column or key at fault.
"""

from __future__ import annotations

import csv
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedcure_app.data.errors import ClientDataError

#: The members of an ``.npz`` a client loads; any other member is never read.
NPZ_KEYS: tuple[str, ...] = ("x", "y", "x_test", "y_test", "classes")
#: The largest ``.npz`` member a client loads (bytes, from the member's header): 1 GiB.
MAX_NPZ_ARRAY_BYTES = 2**30
#: The largest finite float32: a feature beyond it would be inf once cast.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _cell(text: str, path: Path, row: int, column: str) -> float:
    """One feature cell as a finite float; else refused naming the row and column."""
    try:
        value = float(text)
    except ValueError:
        raise ClientDataError(f"{path}: row {row}, column {column!r}: {text.strip()!r} is not "
                              "a number") from None
    if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        raise ClientDataError(f"{path}: row {row}, column {column!r}: {text.strip()!r} is not "
                              "a finite float32 number", "not-finite", 1)
    return value


def read_csv(path: Path, label_column: str = "label"
             ) -> tuple[np.ndarray, list[str], list[str]]:
    """A CSV's feature rows as float32 (N, F), each row's label text (stripped) and the feature
    columns' names, in file order. Rows are counted from 1 after the header."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            head = next(reader, None)
            if not head or not any(h.strip() for h in head):
                raise ClientDataError(f"{path}: empty CSV (expected a header row)")
            head = [h.strip() for h in head]
            if label_column not in head:
                raise ClientDataError(f"{path}: no label column {label_column!r} (columns: "
                                      f"{', '.join(head[:12])}{', …' if len(head) > 12 else ''};"
                                      " name it with --label-column)")
            at = head.index(label_column)
            columns = [h for i, h in enumerate(head) if i != at]
            rows: list[list[float]] = []
            names: list[str] = []
            for row, cells in enumerate(reader, start=1):
                if not cells or not any(c.strip() for c in cells):
                    continue  # blank line
                if len(cells) != len(head):
                    raise ClientDataError(f"{path}: row {row} has {len(cells)} cells, the "
                                          f"header has {len(head)} columns")
                label = cells[at].strip()
                if not label:
                    raise ClientDataError(f"{path}: row {row}, column {label_column!r}: empty "
                                          "label")
                names.append(label)
                rows.append([_cell(c, path, row, head[i]) for i, c in enumerate(cells)
                             if i != at])
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ClientDataError(f"{path}: cannot read CSV ({type(err).__name__}: "
                              f"{' '.join(str(err).split())})") from None
    if not rows:
        raise ClientDataError(f"{path}: no data rows under the header")
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), len(columns)), names, columns


def table_array(x: np.ndarray, features: int | None, where: str) -> np.ndarray:
    """Feature rows of an ``.npz`` as float32 (N, F): numeric, finite, and ``features`` wide
    when given; else refused naming the row and feature."""
    if x.ndim != 2:
        raise ClientDataError(f"{where}: x has shape {list(x.shape)}; table rows are (N, F)",
                              "shape-mismatch", 1)
    if x.dtype.kind not in "uifb":
        raise ClientDataError(f"{where}: x is {x.dtype}; features must be numbers", "bad-format")
    if features is not None and x.shape[1] != features:
        raise ClientDataError(f"{where}: x has {x.shape[1]} features per row, the task has "
                              f"features = {features}", "shape-mismatch", 1)
    with np.errstate(over="ignore"):  # beyond float32: inf, refused below
        out = np.asarray(x, dtype=np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        raise ClientDataError(f"{where}: row {r + 1}, feature {c + 1}: {x[r, c]} is not a "
                              "finite float32 number", "not-finite", int(bad.sum()))
    return out


def _names_of(y: np.ndarray, classes: np.ndarray | None, task_classes: Sequence[str] | None,
              where: str, key: str) -> np.ndarray:
    """``y`` as class names (str array): strings as they are; integers through the file's
    ``classes``, or as their text when every one is a task class (or no task is given)."""
    if y.ndim != 1:
        raise ClientDataError(f"{where}: {key} has shape {list(y.shape)}; labels are one per "
                              "sample (N,)", "bad-labels")
    if y.dtype.kind in "US":
        return np.char.strip(y.astype(str))
    if y.dtype.kind not in "ui":
        raise ClientDataError(f"{where}: {key} is {y.dtype}; labels are class names (strings) "
                              "or integers", "bad-labels")
    if classes is not None:
        if y.size and (y.min() < 0 or y.max() >= len(classes)):
            bad = int(y.min() if y.min() < 0 else y.max())
            raise ClientDataError(f"{where}: {key} has label {bad}, the file's classes array "
                                  f"has {len(classes)} names", "bad-labels")
        return classes[y]
    text = y.astype(str)
    if task_classes is not None:
        known = set(task_classes)
        missing = sorted((t for t in np.unique(text).tolist() if t not in known),
                         key=lambda t: (len(t), t))
        if missing:
            raise ClientDataError(
                f"{where}: {key} holds integer labels ({missing[0]}) that are not the task's "
                f"class names ({', '.join(list(task_classes)[:5])}"
                f"{', …' if len(task_classes) > 5 else ''}) and the file has no classes array "
                "naming them; add classes (names in label order) or store y as names",
                "unknown-class", len(missing))
    return text


def npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each of an ``.npz``'s :data:`NPZ_KEYS` members, read from the
    members' ``.npy`` headers (no array is loaded); other members are left unread. Refused:
    a header that cannot be read, a member of Python objects, one over
    :data:`MAX_NPZ_ARRAY_BYTES`."""
    where = str(path)
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                key = info.filename.removesuffix(".npy")
                if key not in NPZ_KEYS or key in out:
                    continue
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version not in readers:
                        raise ValueError(f"{key}: .npy format {version[0]}.{version[1]}")
                    shape, _, dtype = readers[version](f)
                out[key] = (tuple(int(d) for d in shape), dtype)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ClientDataError(f"{where}: cannot read .npz ({type(err).__name__}: "
                              f"{' '.join(str(err).split())})", "unreadable", 1) from None
    for key, (shape, dtype) in out.items():
        if dtype.hasobject:
            raise ClientDataError(f"{where}: {key} holds Python objects (pickled); store labels "
                                  "and class names as string arrays (dtype str)", "bad-format")
        size = math.prod(shape) * dtype.itemsize
        if size > MAX_NPZ_ARRAY_BYTES:
            raise ClientDataError(f"{where}: {key} is {list(shape)} {dtype} ({size / 2**30:.1f} "
                                  f"GiB), more than the {MAX_NPZ_ARRAY_BYTES / 2**30:g} GiB a "
                                  "client loads per array", "too-large", 1)
    return out


def _check_lengths(where: str, heads: dict[str, tuple[tuple[int, ...], np.dtype]],
                   kx: str, ky: str) -> None:
    """x and y present, x of at least 1 axis and as many samples as y labels (from the
    headers, before anything is loaded)."""
    if kx not in heads or ky not in heads:
        raise ClientDataError(f"{where}: has {kx if kx in heads else ky} without "
                              f"{ky if kx in heads else kx}", "bad-format")
    xs, ys = heads[kx][0], heads[ky][0]
    if ys and len(ys) == 1 and xs and xs[0] == ys[0]:
        return
    if len(ys) != 1:
        raise ClientDataError(f"{where}: {ky} has shape {list(ys)}; labels are one per "
                              "sample (N,)", "bad-labels")
    raise ClientDataError(f"{where}: {kx} has {xs[0] if xs else 0} samples, {ky} has "
                          f"{ys[0]} labels", "bad-labels")


def read_npz(path: Path, task_classes: Sequence[str] | None = None
             ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """An ``.npz``'s parts: ``{"train": (x, names)}`` and ``"test"`` when it has
    ``x_test``/``y_test``; ``x`` as stored, ``names`` the class name of each sample. Only the
    :data:`NPZ_KEYS` members are loaded, after their headers are checked
    (:func:`npz_headers`) and x's samples counted against y's labels."""
    where = str(path)
    if not zipfile.is_zipfile(path):
        raise ClientDataError(f"{where}: cannot read .npz (not a zip archive of arrays; write "
                              "it with numpy.savez)", "bad-format")
    heads = npz_headers(path)
    for key in ("x", "y"):
        if key not in heads:
            raise ClientDataError(f"{where}: no array {key!r} (has: "
                                  f"{', '.join(sorted(heads)) or 'nothing'} of "
                                  f"{', '.join(NPZ_KEYS)}); an .npz needs x and y",
                                  "bad-format")
    parts = {"train": ("x", "y")}
    if "x_test" in heads or "y_test" in heads:
        parts["test"] = ("x_test", "y_test")
    for kx, ky in parts.values():
        _check_lengths(where, heads, kx, ky)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in heads}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ClientDataError(f"{where}: cannot read .npz ({type(err).__name__}: "
                              f"{' '.join(str(err).split())})", "unreadable", 1) from None
    classes = arrays.get("classes")
    if classes is not None:
        if classes.ndim != 1 or classes.dtype.kind not in "US":
            raise ClientDataError(f"{where}: classes must be a 1-d array of names (strings)",
                                  "bad-labels")
        classes = np.char.strip(classes.astype(str))
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for part, (kx, ky) in parts.items():
        out[part] = (arrays[kx], _names_of(arrays[ky], classes, task_classes, where, ky))
    if not len(out["train"][1]):
        raise ClientDataError(f"{where}: x and y are empty", "no-samples")
    return out


__all__ = ["FLOAT32_MAX", "MAX_NPZ_ARRAY_BYTES", "NPZ_KEYS", "npz_headers", "read_csv",
           "read_npz", "table_array"]
