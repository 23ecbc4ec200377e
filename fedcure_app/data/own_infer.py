"""A task inferred from clients' own data (``fedcure task init``).

PATH is a folder of client entries (each one client's data in any format of
:mod:`fedcure_app.data.own`: a folder, a ``.csv`` or an ``.npz``) or one client's data. A first
pass reads only what is cheap (image headers, labels, array shapes): the kind, the union of
class names (sorted by name), the input shape (C: the channels most images have, with a note
naming the clients in the minority; H×W the most common size) or the feature count. A second pass reads every client for that task
and computes the mean and standard deviation per channel (pixels on the [0, 1] scale) or per
feature over all clients' training data (their ``test/`` parts left out).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcure_app.data import own_hf, own_images, own_read, own_tables
from fedcure_app.data.errors import ClientDataError
from fedcure_app.data.own_images import GREY_MODES, mode_channels
from fedcure_app.data.task import TaskConfig, parse_task

_CHUNK = 512


@dataclass
class Survey:
    """What the cheap pass found in one client's data."""

    name: str
    source: Path
    format: str
    kind: str
    train: Counter = field(default_factory=Counter)
    test: Counter = field(default_factory=Counter)
    modes: Counter = field(default_factory=Counter)
    sizes: Counter = field(default_factory=Counter)  # (width, height) -> images
    features: int | None = None


def is_client_data(path: Path) -> bool:
    """Whether ``path`` is one client's data rather than a folder of client entries."""
    return (path.is_file() or own_hf.is_hf_folder(path)
            or own_images.split_folders(path) is not None
            or own_images.has_class_folders(path))


def _survey_images(s: Survey, headers) -> None:
    for mode, size in headers:
        s.modes[mode] += 1
        s.sizes[size] += 1


def survey(path: Path, label_column: str = "label") -> Survey:
    """The cheap pass over one client's data."""
    source, fmt = own_read.resolve(path)
    where = str(source)
    if fmt == "folders":
        s = Survey(path.name, source, fmt, "image")
        for part, (paths, names) in own_images.image_parts(source).items():
            getattr(s, part).update(names)
            _survey_images(s, (own_images.header(p) for p in paths))
        return s
    if fmt == "csv":
        _, names, columns = own_tables.read_csv(source, label_column)
        s = Survey(path.name, source, fmt, "tabular", features=len(columns))
        s.train.update(names)
        return s
    if fmt == "npz":
        s = Survey(path.name, source, fmt, "image")
        for part, (x, names) in own_tables.read_npz(source).items():
            getattr(s, part).update(names.tolist())
            if x.ndim == 2:
                s.kind, s.features = "tabular", int(x.shape[1])
                continue
            chw = own_images.nchw_layout(x, where)
            s.modes[own_images.MODES.get(chw.shape[1], f"{chw.shape[1]} channels")] += len(x)
            s.sizes[(int(chw.shape[3]), int(chw.shape[2]))] += len(x)
        return s
    s = Survey(path.name, source, fmt, "image")
    for part, ds in own_hf.load_parts(source).items():
        getattr(s, part).update(own_hf.label_names(ds, label_column, where).tolist())
        column = own_hf.image_column(ds)
        if column is None:
            s.kind = "tabular"
            s.features = len(own_hf.feature_columns(ds, label_column))
        else:
            _survey_images(s, own_hf.image_headers(ds, column, where))
    return s


def channels_of(s: Survey) -> Counter:
    """One client's images per channel count (a Pillow mode's, or an array's ``N channels``)."""
    out: Counter = Counter()
    for mode, n in s.modes.items():
        out[int(mode.split()[0]) if mode.endswith(" channels") else mode_channels(mode)] += n
    return out


def majority_channels(surveys: list[Survey]) -> tuple[int, str | None]:
    """The channels most images have (a tie: the larger count) and, when the clients' images
    disagree, a note naming the clients holding images of other channels."""
    per = {s.name: channels_of(s) for s in surveys}
    total = sum(per.values(), Counter())
    if not total:
        return 1, None
    channels = max(total, key=lambda c: (total[c], c))
    if len(total) == 1:
        return channels, None
    minority = [name for name, seen in per.items() if set(seen) - {channels}]
    counts = ", ".join(f"{c} channel{'s' if c != 1 else ''}: {n}"
                       for c, n in sorted(total.items()))
    shown = ", ".join(minority[:8]) + (f", … ({len(minority) - 8} more)"
                                       if len(minority) > 8 else "")
    return channels, (f"images disagree on channels ({counts} images): the task takes the "
                      f"majority's {channels}; the images of other channels, held by "
                      f"{shown}, are refused by their clients unless the task says "
                      "convert = true")


def _shape(surveys: list[Survey]) -> dict:
    """``kind`` and ``input-shape`` or ``features`` agreed by every client."""
    kinds = {s.kind for s in surveys}
    if len(kinds) > 1:
        img = next(s for s in surveys if s.kind == "image")
        tab = next(s for s in surveys if s.kind == "tabular")
        raise ClientDataError(f"{img.source} holds images but {tab.source} holds table rows; "
                              "one task has one kind of data")
    if kinds == {"tabular"}:
        widths = Counter(s.features for s in surveys)
        if len(widths) > 1:
            a, b = (next(s for s in surveys if s.features == w) for w in list(widths)[:2])
            raise ClientDataError(f"{a.source} has {a.features} features, {b.source} has "
                                  f"{b.features}")
        return {"kind": "tabular", "features": next(iter(widths))}
    sizes = sum((s.sizes for s in surveys), Counter())
    channels, _ = majority_channels(surveys)
    (w, h), _ = max(sizes.items(), key=lambda kv: (kv[1], kv[0][0] * kv[0][1], kv[0]))
    return {"kind": "image", "input-shape": [channels, h, w]}


def _stats(task: TaskConfig, surveys: list[Survey], label_column: str
           ) -> tuple[list[float], list[float]]:
    """Mean and standard deviation per channel ([0, 1] pixels) or feature over every client's
    training data (float64 sums, chunked)."""
    width = task.sample_shape[0]
    total = np.zeros(width)
    squares = np.zeros(width)
    count = 0
    for s in surveys:
        parts = own_read.read_parts(s.source, s.format, task, label_column)
        x = parts["train"][0]
        for start in range(0, len(x), _CHUNK):
            block = x[start:start + _CHUNK].astype(np.float64)
            if task.kind == "image":
                block = block.transpose(1, 0, 2, 3).reshape(width, -1) / 255.0
            else:
                block = block.T
            total += block.sum(axis=1)
            squares += (block * block).sum(axis=1)
            count += block.shape[1]
    mean = total / max(count, 1)
    std = np.sqrt(np.maximum(squares / max(count, 1) - mean * mean, 0.0))
    return ([_short(m) for m in mean],
            [_short(v) if v > 1e-12 and math.isfinite(v) else 1.0 for v in std])


def _short(v: float) -> float:
    """Six significant digits (a readable task file)."""
    return float(f"{float(v):.6g}")


def infer_task(path: str | Path, model: str | None = None, *, label_column: str = "label"
          ) -> tuple[TaskConfig, dict]:
    """The task and a summary (clients, their formats, samples and classes, image sizes and
    modes seen) for ``fedcure task init``."""
    root = Path(path).expanduser()
    if not root.exists():
        raise ClientDataError(f"{root}: no such file or folder")
    single = is_client_data(root)
    entries = [root] if single else own_read.client_entries(root)
    surveys = [survey(e, label_column) for e in entries]
    classes = sorted(set().union(*(s.train.keys() | s.test.keys() for s in surveys)))
    if len(classes) < 2:
        raise ClientDataError(f"{root}: {len(classes)} class ({', '.join(classes)}) in all "
                              "the data; a task needs at least 2")
    fields = {**_shape(surveys), "classes": classes, "model": model or ""}
    image = fields["kind"] == "image"
    reading = parse_task({**fields, "resize": image, "convert": image}, "task init")
    mean, std = _stats(reading, surveys, label_column)
    task = parse_task({**fields, "mean": mean, "std": std}, "task init")
    summary = {
        "path": str(root),
        "kind": task.kind,
        "classes": classes,
        "clients": [{"name": s.name, "source": str(s.source), "format": s.format,
                     "train": sum(s.train.values()), "test": sum(s.test.values()),
                     "classes": dict(sorted((s.train + s.test).items()))} for s in surveys],
        "sizes": {f"{w}×{h}": n for (w, h), n in sorted(
            sum((s.sizes for s in surveys), Counter()).items())},
        "modes": dict(sorted(sum((s.modes for s in surveys), Counter()).items())),
        "notes": [note] if image and (note := majority_channels(surveys)[1]) else [],
    }
    return task, summary


__all__ = ["GREY_MODES", "Survey", "channels_of", "infer_task", "is_client_data",
           "majority_channels", "survey"]
