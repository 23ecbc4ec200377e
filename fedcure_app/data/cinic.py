"""CINIC-10 from its PNG image folders ``train/<class>/*.png`` and ``test/<class>/*.png``.

Looked for in ``<root>/cinic-10``, ``<root>/CINIC-10``, ``<root>/cinic10`` and ``<root>``. The
classes are the ten CIFAR-10 names in CIFAR order; the ``valid`` split is not read (train and test
are 90,000 images each). Images are 32×32; CINIC's few greyscale ones are converted to RGB
(:mod:`.folders` lists and decodes them; the loader caches the result).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcure_app.data import folders
from fedcure_app.data.dataset import RawSplits
from fedcure_app.data.locate import find_dir
from fedcure_app.data.specs import CIFAR10_CLASSES, SPECS

SPLITS: tuple[str, ...] = ("train", "test")


def locate(root: Path) -> Path:
    """The directory holding ``train/`` and ``test/`` class folders."""
    return find_dir(
        root,
        [root / "cinic-10", root / "CINIC-10", root / "cinic10", root],
        lambda d: all((d / s).is_dir() for s in SPLITS),
        dataset="CINIC-10",
        expected="train/<class>/*.png and test/<class>/*.png "
                 f"(classes {', '.join(CIFAR10_CLASSES)})",
        url=SPECS["cinic10"].url,
        downloadable=False,
    )


def list_split(directory: Path, split: str) -> tuple[list[Path], np.ndarray]:
    """The PNG paths of one split, sorted by class then file name, and their labels (int64)."""
    return folders.list_split(directory, split, CIFAR10_CLASSES, (".png",), dataset="CINIC-10",
                              fetch=f"get the files from {SPECS['cinic10'].url}")


def source_files(directory: Path) -> list[Path]:
    """Every image that will be read (for the cache key)."""
    files: list[Path] = []
    for split in SPLITS:
        files.extend(list_split(directory, split)[0])
    return files


def read(directory: Path, workers: int | None = None) -> RawSplits:
    """Decode the train and test splits."""
    x_train_paths, y_train = list_split(directory, "train")
    x_test_paths, y_test = list_split(directory, "test")
    return RawSplits(folders.decode_all(x_train_paths, workers), y_train,
                     folders.decode_all(x_test_paths, workers), y_test)
