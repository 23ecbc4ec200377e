"""SVHN (cropped digits, "format 2") from ``train_32x32.mat`` and ``test_32x32.mat``.

Looked for in ``<root>``, ``<root>/svhn`` and ``<root>/SVHN``. Each file holds ``X``
(32 × 32 × 3 × N uint8) and ``y`` (N × 1, digits 1–10 where 10 stands for 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcure_app.data.dataset import RawSplits
from fedcure_app.data.errors import CorruptDatasetError, MissingDatasetError
from fedcure_app.data.locate import find_dir
from fedcure_app.data.specs import SPECS

FILES: dict[str, str] = {"train": "train_32x32.mat", "test": "test_32x32.mat"}


def locate(root: Path) -> Path:
    """The directory holding both .mat files."""
    return find_dir(
        root,
        [root, root / "svhn", root / "SVHN"],
        lambda d: all((d / n).is_file() for n in FILES.values()),
        dataset="SVHN",
        expected=" and ".join(FILES.values()),
        url=SPECS["svhn"].url,
    )


def source_files(directory: Path) -> list[Path]:
    return [directory / n for n in FILES.values()]


def read_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One split: uint8 (N, 3, 32, 32) and int64 labels (N,) with 10 mapped to 0."""
    import scipy.io  # imported here: it is slow and only SVHN needs it

    if not path.is_file():
        raise MissingDatasetError(f"{path}: file not found")
    try:
        mat = scipy.io.loadmat(str(path), variable_names=["X", "y"])
    except Exception as err:  # scipy raises many types on damaged files; all mean "corrupt"
        raise CorruptDatasetError(
            f"{path}: not a readable MATLAB file ({type(err).__name__}: {err})"
        ) from None
    if "X" not in mat or "y" not in mat:
        raise CorruptDatasetError(f"{path}: missing variable {'X' if 'X' not in mat else 'y'}")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise CorruptDatasetError(
            f"{path}: X is {x.dtype} {x.shape}, expected uint8 (32, 32, 3, N)"
        )
    if y.shape[0] != x.shape[3]:
        raise CorruptDatasetError(f"{path}: {y.shape[0]} labels for {x.shape[3]} images")
    if y.size and (y.min() < 0 or y.max() > 10):
        raise CorruptDatasetError(f"{path}: labels span [{y.min()}, {y.max()}], expected 1–10")
    labels = y.astype(np.int64) % 10
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), labels


def read(directory: Path) -> RawSplits:
    """Decode both splits."""
    x_train, y_train = read_mat(directory / FILES["train"])
    x_test, y_test = read_mat(directory / FILES["test"])
    return RawSplits(x_train, y_train, x_test, y_test)
