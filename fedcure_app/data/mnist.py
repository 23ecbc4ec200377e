"""MNIST from its four official IDX files (gzip or not).

Looked for in ``<root>/MNIST/raw``, ``<root>/mnist/raw``, ``<root>/raw``, ``<root>/mnist`` and
``<root>`` itself; each file may be ``NAME`` or ``NAME.gz`` (the uncompressed one wins).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcure_app.data.dataset import RawSplits
from fedcure_app.data.errors import CorruptDatasetError
from fedcure_app.data.idx import read_idx
from fedcure_app.data.locate import find_dir
from fedcure_app.data.specs import SPECS

FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _file(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        p = directory / name
        if p.is_file():
            return p
    return None


def locate(root: Path) -> Path:
    """The directory holding all four IDX files."""
    return find_dir(
        root,
        [root / "MNIST" / "raw", root / "mnist" / "raw", root / "raw", root / "mnist", root],
        lambda d: all(_file(d, s) is not None for s in FILES.values()),
        dataset="MNIST",
        expected=", ".join(f"{s}[.gz]" for s in FILES.values()),
        url=SPECS["mnist"].url,
    )


def source_files(directory: Path) -> list[Path]:
    """The four files that will be read (for the cache key)."""
    files = [_file(directory, s) for s in FILES.values()]
    return [f for f in files if f is not None]


def _split(directory: Path, images_stem: str, labels_stem: str) -> tuple[np.ndarray, np.ndarray]:
    img_path = _file(directory, images_stem)
    lab_path = _file(directory, labels_stem)
    assert img_path is not None and lab_path is not None  # guaranteed by locate()
    images = read_idx(img_path, 3)
    labels = read_idx(lab_path, 1)
    if images.shape[1:] != (28, 28):
        raise CorruptDatasetError(
            f"{img_path}: images are {images.shape[1]}×{images.shape[2]}, expected 28×28"
        )
    if labels.shape[0] != images.shape[0]:
        raise CorruptDatasetError(
            f"{lab_path}: {labels.shape[0]} labels for {images.shape[0]} images in {img_path.name}"
        )
    if labels.size and labels.max() > 9:
        raise CorruptDatasetError(f"{lab_path}: label {labels.max()} is not a digit 0–9")
    return images[:, None, :, :], labels.astype(np.int64)


def read(directory: Path) -> RawSplits:
    """Decode the train and test splits: uint8 (N, 1, 28, 28), int64 labels."""
    x_train, y_train = _split(directory, FILES["train_images"], FILES["train_labels"])
    x_test, y_test = _split(directory, FILES["test_images"], FILES["test_labels"])
    return RawSplits(x_train, y_train, x_test, y_test)
