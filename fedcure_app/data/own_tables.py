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


def _cell(text: str, path: Path, row: int, column: str) -> float:
    """One feature cell as a finite float; else refused naming the row and column."""
    try:
        value = float(text)
    except ValueError:
        raise ClientDataError(f"{path}: row {row}, column {column!r}: {text.strip()!r} is not "
                              "a number") from None
    if not math.isfinite(value):
        raise ClientDataError(f"{path}: row {row}, column {column!r}: {text.strip()!r} is not "
                              "a finite number")
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
        raise ClientDataError(f"{where}: x has shape {list(x.shape)}; table rows are (N, F)")
    if x.dtype.kind not in "uifb":
        raise ClientDataError(f"{where}: x is {x.dtype}; features must be numbers")
    if features is not None and x.shape[1] != features:
        raise ClientDataError(f"{where}: x has {x.shape[1]} features per row, the task has "
                              f"features = {features}")
    out = np.asarray(x, dtype=np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        raise ClientDataError(f"{where}: row {r + 1}, feature {c + 1}: {x[r, c]} is not a "
                              "finite number")
    return out


def _names_of(y: np.ndarray, classes: np.ndarray | None, task_classes: Sequence[str] | None,
              where: str, key: str) -> np.ndarray:
    """``y`` as class names (str array): strings as they are; integers through the file's
    ``classes``, or as their text when every one is a task class (or no task is given)."""
    if y.ndim != 1:
        raise ClientDataError(f"{where}: {key} has shape {list(y.shape)}; labels are one per "
                              "sample (N,)")
    if y.dtype.kind in "US":
        return np.char.strip(y.astype(str))
    if y.dtype.kind not in "ui":
        raise ClientDataError(f"{where}: {key} is {y.dtype}; labels are class names (strings) "
                              "or integers")
    if classes is not None:
        if y.size and (y.min() < 0 or y.max() >= len(classes)):
            bad = int(y.min() if y.min() < 0 else y.max())
            raise ClientDataError(f"{where}: {key} has label {bad}, the file's classes array "
                                  f"has {len(classes)} names")
        return classes[y]
    text = np.asarray([str(int(v)) for v in y], dtype=str)
    if task_classes is not None:
        known = set(task_classes)
        missing = sorted((t for t in set(text.tolist()) if t not in known),
                         key=lambda t: (len(t), t))
        if missing:
            raise ClientDataError(
                f"{where}: {key} holds integer labels ({missing[0]}) that are not the task's "
                f"class names ({', '.join(list(task_classes)[:5])}"
                f"{', …' if len(task_classes) > 5 else ''}) and the file has no classes array "
                "naming them; add classes (names in label order) or store y as names")
    return text


def read_npz(path: Path, task_classes: Sequence[str] | None = None
             ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """An ``.npz``'s parts: ``{"train": (x, names)}`` and ``"test"`` when it has
    ``x_test``/``y_test``; ``x`` as stored, ``names`` the class name of each sample."""
    where = str(path)
    if not zipfile.is_zipfile(path):
        raise ClientDataError(f"{where}: cannot read .npz (not a zip archive of arrays; write "
                              "it with numpy.savez)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except ValueError as err:
        if "pickle" in str(err).lower():
            raise ClientDataError(f"{where}: holds Python objects (pickled); store labels and "
                                  "class names as string arrays (dtype str)") from None
        raise ClientDataError(f"{where}: cannot read .npz ({err})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise ClientDataError(f"{where}: cannot read .npz ({type(err).__name__}: "
                              f"{' '.join(str(err).split())})") from None
    for key in ("x", "y"):
        if key not in arrays:
            raise ClientDataError(f"{where}: no array {key!r} (has: "
                                  f"{', '.join(sorted(arrays)) or 'nothing'}); an .npz needs "
                                  "x and y")
    classes = arrays.get("classes")
    if classes is not None:
        if classes.ndim != 1 or classes.dtype.kind not in "US":
            raise ClientDataError(f"{where}: classes must be a 1-d array of names (strings)")
        classes = np.char.strip(classes.astype(str))
    parts = {"train": ("x", "y")}
    if "x_test" in arrays or "y_test" in arrays:
        parts["test"] = ("x_test", "y_test")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for part, (kx, ky) in parts.items():
        if kx not in arrays or ky not in arrays:
            raise ClientDataError(f"{where}: has {kx if kx in arrays else ky} without "
                                  f"{ky if kx in arrays else kx}")
        x, y = arrays[kx], arrays[ky]
        names = _names_of(y, classes, task_classes, where, ky)
        if x.ndim < 1 or len(x) != len(y):
            raise ClientDataError(f"{where}: {kx} has {len(x) if x.ndim else 0} samples, {ky} "
                                  f"has {len(y)} labels")
        out[part] = (x, names)
    if not len(out["train"][1]):
        raise ClientDataError(f"{where}: x and y are empty")
    return out


__all__ = ["read_csv", "read_npz", "table_array"]
