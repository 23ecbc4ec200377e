"""The in-memory dataset: raw uint8 splits as read from disk, and the normalised float view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcure_app.data.errors import CorruptDatasetError
from fedcure_app.data.specs import DatasetSpec


@dataclass(eq=False)
class RawSplits:
    """Decoded pixels as stored on disk: uint8 images (N, C, H, W) and int64 labels (N,)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def validate(self, spec: DatasetSpec, source: str) -> None:
        """Check dtypes, shapes and label range against ``spec``; raise CorruptDatasetError."""
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if x.dtype != np.uint8 or x.ndim != 4 or tuple(x.shape[1:]) != spec.input_shape:
                raise CorruptDatasetError(
                    f"{source}: {split} images are {x.dtype} {tuple(x.shape)}, expected uint8 "
                    f"(N, {', '.join(map(str, spec.input_shape))})"
                )
            if y.ndim != 1 or y.shape[0] != x.shape[0]:
                raise CorruptDatasetError(
                    f"{source}: {x.shape[0]} {split} images but {y.shape[0]} labels"
                )
            if x.shape[0] == 0:
                raise CorruptDatasetError(f"{source}: the {split} split is empty")
            if y.min() < 0 or y.max() >= spec.num_classes:
                raise CorruptDatasetError(
                    f"{source}: {split} labels span [{y.min()}, {y.max()}], expected "
                    f"[0, {spec.num_classes - 1}]"
                )


@dataclass(eq=False)
class Dataset:
    """A train/test dataset ready for training.

    Images are float32 (N, C, H, W), normalised per channel as (pixel/pixel_max − mean)/std;
    labels are int64 in ``[0, num_classes)``.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
    #: Where the pixels came from (directory, or the scikit-learn loader).
    source: str = ""
    #: True when the decoded pixels came from the cache rather than the source files.
    from_cache: bool = False
    mean: tuple[float, ...] = field(default=())
    std: tuple[float, ...] = field(default=())
    #: a user's own task (:class:`fedcure_app.data.task.TaskConfig`) when the data are the
    #: clients' own; None for a built-in dataset
    task: Any = None
    #: with a task: each client's sample indices into the training split (the partition is
    #: given by who holds what, not cut), in client order; the test split is the union of the
    #: clients' held-out parts
    client_indices: list[np.ndarray] | None = None
    client_names: tuple[str, ...] = ()
    #: with a task: the central test set the test split was read from ("": the union of the
    #: clients' held-out parts, a federated evaluation)
    test_source: str = ""
    #: with a task: the clients of the clients folder that were refused (name -> why); they
    #: take no part, as a deployed client that withdraws
    withdrawn: dict[str, str] = field(default_factory=dict)

    @property
    def model_spec(self) -> Any:
        """What :func:`fedcure_app.models.build_model` builds this dataset's model from: the
        task when there is one, else the dataset's name."""
        return self.task if self.task is not None else self.name

    @property
    def train_size(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.y_test.shape[0])

    def class_counts(self, split: str = "train") -> np.ndarray:
        """Samples per class in ``split`` ("train" or "test"), shape (num_classes,), int64."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        y = self.y_train if split == "train" else self.y_test
        return np.bincount(y, minlength=self.num_classes).astype(np.int64)


def norm_constants(spec: DatasetSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel float32 ``(scale, shift)`` with x_norm = x·scale − shift, i.e.
    scale_c = 1/(pixel_max·std_c) and shift_c = mean_c/std_c: the one source of the constants
    for :func:`normalise` and for a trainer that normalises uint8 pixels per batch
    (:class:`fedcure_app.training.PixelNorm`), so both give the same float32 values."""
    scale = np.asarray([1.0 / (spec.pixel_max * s) for s in spec.std], dtype=np.float32)
    shift = np.asarray([m / s for m, s in zip(spec.mean, spec.std)], dtype=np.float32)
    return scale, shift


def normalise(x: np.ndarray, spec: DatasetSpec) -> np.ndarray:
    """uint8 (N, C, H, W) -> float32 (N, C, H, W): (x/pixel_max − mean_c)/std_c, one allocation."""
    out = x.astype(np.float32)
    scale, shift = norm_constants(spec)
    out *= scale[None, :, None, None]
    out -= shift[None, :, None, None]
    return out


def build_dataset(spec: DatasetSpec, raw: RawSplits, source: str, from_cache: bool) -> Dataset:
    """Normalise ``raw`` into a :class:`Dataset` described by ``spec``."""
    return Dataset(
        name=spec.name,
        x_train=normalise(raw.x_train, spec),
        y_train=np.ascontiguousarray(raw.y_train, dtype=np.int64),
        x_test=normalise(raw.x_test, spec),
        y_test=np.ascontiguousarray(raw.y_test, dtype=np.int64),
        num_classes=spec.num_classes,
        input_shape=spec.input_shape,
        class_names=spec.class_names,
        source=source,
        from_cache=from_cache,
        mean=spec.mean,
        std=spec.std,
    )
