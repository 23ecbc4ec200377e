"""Tiny client data sets in every format :mod:`fedcure_app.data.own` reads, for its tests."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from fedcure_app.data.task import TaskConfig


def image_task(classes=("cat", "dog", "zebra"), shape=(1, 6, 5), **kw) -> TaskConfig:
    return TaskConfig(kind="image", classes=list(classes), input_shape=list(shape), **kw)


def table_task(classes=("a", "b", "c"), features=3, **kw) -> TaskConfig:
    return TaskConfig(kind="tabular", classes=list(classes), features=features, **kw)


def pixels(n: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def write_classes(root: Path, counts: dict[str, int], hw=(6, 5), channels: int = 1,
                  seed: int = 0, suffix: str = ".png") -> dict[str, np.ndarray]:
    """``root/<class>/<i>.png`` images of H×W ``hw``; returns each class's pixels as written
    (N, H, W) or (N, H, W, 3)."""
    from PIL import Image

    written = {}
    for k, (cls, n) in enumerate(counts.items()):
        folder = root / cls
        folder.mkdir(parents=True, exist_ok=True)
        arr = pixels(n, (*hw, 3) if channels == 3 else hw, seed + k)
        for i, a in enumerate(arr):
            Image.fromarray(a).save(folder / f"{i:03d}{suffix}")
        written[cls] = arr
    return written


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def table_rows(labels: list[str], features: int = 3, seed: int = 0
               ) -> tuple[np.ndarray, list[list[object]]]:
    """Random float32 features and CSV rows (features then label)."""
    x = np.random.default_rng(seed).normal(size=(len(labels), features)).astype(np.float32)
    return x, [[repr(float(v)) for v in row] + [lab] for row, lab in zip(x, labels)]
