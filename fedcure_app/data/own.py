"""A client's own data, read for a task (:class:`~fedcure_app.data.task.TaskConfig`).

``read_client_data(PATH, task)`` reads one client's data in any of four formats: a folder of
class folders (``<class>/*.{png,jpg,jpeg}``, optionally under ``train/`` and ``test/``), an
``.npz`` with ``x`` and ``y``, a CSV with a header and a label column, or a Hugging Face
``datasets.save_to_disk`` folder. Every label maps to the task's class list BY NAME, so two
clients holding different class subsets agree on every shared class's index. Images come back
as uint8 (N, C, H, W) of the task's shape, table rows as raw float32 (N, F); normalisation is
:func:`normalise_x` (or :func:`pixel_norm` per batch). Without a test part a seeded, stratified
fraction is held out (:func:`stratified_holdout`). Everything a client cannot use is refused
before any training, as one line naming the file, row, column or class
(:class:`ClientDataError`). :func:`infer_task` writes a task from clients' data
(``fedcure task init``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcure_app.data.errors import ClientDataError
from fedcure_app.data.own_infer import infer_task
from fedcure_app.data.own_read import (
    DATA_SUFFIXES,
    check_classes,
    client_entries,
    read_parts,
    resolve,
)
from fedcure_app.data.task import TaskConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class ClientData:
    """One client's data for a task. ``x``: uint8 (N, C, H, W) pixels 0..255 (image task) or
    raw float32 (N, F) features (tabular task), not normalised; ``y``: int64 indices into
    ``task.classes``. The test part is empty (0 rows) only when the source has none and the
    hold-out fraction is 0. ``source``: the file or folder read; ``format``: folders, npz,
    csv or datasets."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str
    format: str

    @property
    def train_size(self) -> int:
        return int(len(self.y_train))

    def label_counts(self, num_classes: int, part: str = "train") -> np.ndarray:
        """Samples per class (int64, ``num_classes``) of the ``train`` or ``test`` part."""
        y = self.y_train if part == "train" else self.y_test
        return np.bincount(y, minlength=num_classes).astype(np.int64)


def stratified_holdout(y: np.ndarray, fraction: float, seed: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Split sample indices into (train, test): disjoint, sorted int64 arrays covering
    ``range(len(y))``. Each class of n samples gives round(fraction·n) to the test part, at
    least 1 and at most n − 1 when n ≥ 2 (a single sample stays in training, unless every
    class is a single sample: then round(fraction·N), at least 1 and at most N − 1, of them go
    to the test part); the samples are drawn by a generator seeded with ``seed``, so the split
    is a function of (y, fraction, seed). ``fraction`` in [0, 1); 0 gives an empty test
    part, and any other fraction a non-empty one when there are at least 2 samples."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"hold-out fraction must be in [0, 1) (got {fraction})")
    y = np.asarray(y)
    test_mask = np.zeros(len(y), dtype=bool)
    if fraction > 0:
        rng = np.random.default_rng(seed)
        for cls in np.unique(y):
            idx = np.flatnonzero(y == cls)
            n = len(idx)
            k = min(max(int(round(fraction * n)), 1), n - 1) if n >= 2 else 0
            if k:
                test_mask[rng.permutation(idx)[:k]] = True
        if not test_mask.any() and len(y) >= 2:  # every class a single sample
            k = min(max(int(round(fraction * len(y))), 1), len(y) - 1)
            test_mask[rng.permutation(len(y))[:k]] = True
    return (np.flatnonzero(~test_mask).astype(np.int64),
            np.flatnonzero(test_mask).astype(np.int64))


def read_client_data(path: str | Path, task: TaskConfig, *, label_column: str = "label",
                     holdout: float = 0.1, seed: int = 0) -> ClientData:
    """One client's data at ``path`` for ``task`` (see the module doc for the formats): a
    ``test`` part of the source is the test part; without one, :func:`stratified_holdout`
    keeps the fraction ``holdout`` (seeded by ``seed``) for evaluation. Refusals are
    :class:`ClientDataError` in one line."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"hold-out fraction must be in [0, 1) (got {holdout})")
    source, fmt, parts, ys = _labelled_parts(path, task, label_column)
    x_train, y_train = parts["train"][0], ys["train"]
    if "test" in parts:
        x_test, y_test = parts["test"][0], ys["test"]
    else:
        tr, te = stratified_holdout(y_train, holdout, seed)
        x_test, y_test = x_train[te], y_train[te]
        x_train, y_train = x_train[tr], y_train[tr]
    if not len(y_train):
        raise ClientDataError(f"{source}: no training samples")
    log.info("%s (%s): %d training and %d test samples, %d classes", source, fmt,
             len(y_train), len(y_test), len(np.unique(y_train)))
    return ClientData(np.ascontiguousarray(x_train), y_train, np.ascontiguousarray(x_test),
                      y_test, str(source), fmt)


def _labelled_parts(path: str | Path, task: TaskConfig, label_column: str
                    ) -> tuple[Path, str, dict, dict[str, np.ndarray]]:
    """The source, its format, its parts as read and their labels as the task's indices."""
    source, fmt = resolve(path)
    parts = read_parts(source, fmt, task, label_column)
    ys = {part: check_classes(names, task, lambda _n, s=source: str(s))
          for part, (_, names) in parts.items()}
    return source, fmt, parts, ys


def read_test_data(path: str | Path, task: TaskConfig, *, label_column: str = "label"
                   ) -> ClientData:
    """All of ``path`` as test data (a central test set: ``--test-data``, ``fedcure model
    evaluate``): every part of it in the test part, none held out or trained on; refused as a
    client's data is (:class:`ClientDataError`, naming the file)."""
    source, fmt, parts, ys = _labelled_parts(path, task, label_column)
    x = np.concatenate([parts[k][0] for k in parts])
    y = np.concatenate([ys[k] for k in parts]).astype(np.int64)
    if not len(y):
        raise ClientDataError(f"{source}: no test samples")
    log.info("%s (%s): %d test samples, %d classes", source, fmt, len(y), len(np.unique(y)))
    empty = np.zeros((0, *x.shape[1:]), dtype=x.dtype)
    return ClientData(empty, np.zeros(0, dtype=np.int64), np.ascontiguousarray(x), y,
                      str(source), fmt)


def pixel_norm(task: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (image) or per-feature (tabular) float32 ``(scale, shift)`` with
    x_norm = x·scale − shift: scale = 1/(p·std), shift = mean/std, with p = 255 for uint8
    pixels and 1 for features (the convention of
    :func:`fedcure_app.data.dataset.norm_constants`, which
    :class:`fedcure_app.training.PixelNorm` applies per batch)."""
    p = 255.0 if task.kind == "image" else 1.0
    scale = np.asarray([1.0 / (p * s) for s in task.std_values], dtype=np.float32)
    shift = np.asarray([m / s for m, s in zip(task.mean_values, task.std_values)],
                       dtype=np.float32)
    return scale, shift


def normalise_x(x: np.ndarray, task: TaskConfig) -> np.ndarray:
    """uint8 (N, C, H, W) -> float32 (x/255 − mean_c)/std_c, or (N, F) -> (x − mean_f)/std_f,
    computed as x·scale − shift (:func:`pixel_norm`) so a per-batch normalisation gives the
    same float32 values."""
    scale, shift = pixel_norm(task)
    out = np.asarray(x).astype(np.float32)
    if task.kind == "image":
        out *= scale[None, :, None, None]
        out -= shift[None, :, None, None]
    else:
        out *= scale[None, :]
        out -= shift[None, :]
    return out


__all__ = ["ClientData", "ClientDataError", "DATA_SUFFIXES", "check_classes", "client_entries",
           "infer_task", "normalise_x", "pixel_norm", "read_client_data", "read_parts",
           "read_test_data",
           "resolve", "stratified_holdout"]
