"""CIFAR-10 from the official "python version" pickle batches, or from image class folders.

Official batches: looked for in ``<root>/cifar-10-batches-py`` (the archive's folder),
``<root>/cifar10/cifar-10-batches-py``, ``<root>/cifar-10/cifar-10-batches-py`` and ``<root>``:
``data_batch_1`` … ``data_batch_5`` and ``test_batch``, each a pickled dict with ``data`` (N × 3072
uint8, channel-major 32×32 planes) and ``labels``. Pickles can run code when loaded, so they are
read with an unpickler that only builds plain containers and numpy arrays.

Class folders: ``train/<class>/*.{jpg,jpeg,png}`` and ``test/<class>/…`` in ``<root>/cifar10``,
``<root>/cifar-10`` or ``<root>``, one folder per class named as the official classes (airplane …
truck); the label order is the official one, which is alphabetical. Read through
:mod:`.folders` (32×32 images only). Where both are present the official batches win.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.data import folders
from fedcure_app.data.dataset import RawSplits
from fedcure_app.data.errors import CorruptDatasetError, MissingDatasetError
from fedcure_app.data.locate import find_dir
from fedcure_app.data.specs import CIFAR10_CLASSES, SPECS

TRAIN_FILES: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES: tuple[str, ...] = ("test_batch",)
FOLDER = "cifar-10-batches-py"
#: The splits and the image files of the class-folder layout.
SPLITS: tuple[str, ...] = ("train", "test")
IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png")

#: (module, name) pairs a CIFAR batch may reference; numpy 2 moved numpy.core to numpy._core.
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
    ("_codecs", "encode"),  # how Python 3 writes bytes at protocol 2
})


class _SafeUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the numpy array constructors in ``_ALLOWED``."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module.startswith("numpy.core") and hasattr(np, "_core"):
            module = "numpy._core" + module[len("numpy.core"):]
        return getattr(importlib.import_module(module), name)


def has_batches(directory: Path) -> bool:
    """Whether ``directory`` holds the six official batch files."""
    return all((directory / n).is_file() for n in TRAIN_FILES + TEST_FILES)


def has_folders(directory: Path) -> bool:
    """Whether ``directory`` holds ``train/`` and ``test/`` (the class-folder layout)."""
    return all((directory / s).is_dir() for s in SPLITS)


def locate(root: Path) -> Path:
    """The directory holding the six batch files or the ``train/`` and ``test/`` class
    folders (the batches first)."""
    names = TRAIN_FILES + TEST_FILES
    return find_dir(
        root,
        [root / FOLDER, root / "cifar10" / FOLDER, root / "cifar-10" / FOLDER, root,
         root / "cifar10", root / "cifar-10"],
        lambda d: has_batches(d) or has_folders(d),
        dataset="CIFAR-10",
        expected=(f"{FOLDER}/{{{', '.join(names)}}}, or train/<class>/*.jpg and "
                  f"test/<class>/*.jpg (classes {', '.join(CIFAR10_CLASSES)})"),
        url=SPECS["cifar10"].url,
    )


def list_split(directory: Path, split: str) -> tuple[list[Path], np.ndarray]:
    """The images of one split of the class-folder layout and their labels (int64)."""
    return folders.list_split(directory, split, CIFAR10_CLASSES, IMAGE_SUFFIXES,
                              dataset="CIFAR-10", fetch=f"get the files from "
                              f"{SPECS['cifar10'].url}")


def source_files(directory: Path) -> list[Path]:
    """Every file that will be read (for the cache key)."""
    if has_batches(directory):
        return [directory / n for n in TRAIN_FILES + TEST_FILES]
    return [p for s in SPLITS for p in list_split(directory, s)[0]]


def describe(directory: Path) -> str:
    """Where the data come from and in which layout (``fedcure data info``, result files)."""
    if has_batches(directory):
        return f"{directory} (official python batches)"
    first = next((p for p in sorted((directory / "train" / CIFAR10_CLASSES[0]).iterdir())
                  if p.suffix.lower() in IMAGE_SUFFIXES), None)
    if first is not None and first.suffix.lower() in (".jpg", ".jpeg"):
        return (f"{directory} (JPEG class folders: a re-encoding of the official images, not "
                "the official pixels)")
    return f"{directory} (image class folders)"


def _get(batch: dict, key: str, path: Path) -> Any:
    for k in (key, key.encode()):
        if k in batch:
            return batch[k]
    raise CorruptDatasetError(f"{path}: batch has no {key!r} entry")


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch: uint8 (N, 3, 32, 32) and int64 labels (N,)."""
    try:
        with path.open("rb") as f:
            batch = _SafeUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise MissingDatasetError(f"{path}: file not found") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as err:
        raise CorruptDatasetError(
            f"{path}: not a readable CIFAR pickle ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(batch, dict):
        raise CorruptDatasetError(f"{path}: expected a dict, found {type(batch).__name__}")
    data = np.asarray(_get(batch, "data", path))
    labels = np.asarray(_get(batch, "labels", path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise CorruptDatasetError(
            f"{path}: data is {data.dtype} {data.shape}, expected uint8 (N, 3072)"
        )
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise CorruptDatasetError(f"{path}: {labels.shape} labels for {data.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise CorruptDatasetError(f"{path}: labels span [{labels.min()}, {labels.max()}], "
                                  "expected 0–9")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _read_all(directory: Path, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    parts = [read_batch(directory / n) for n in names]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def read(directory: Path, workers: int | None = None) -> RawSplits:
    """Decode the five training batches and the test batch, or the two class-folder splits
    (``workers``: decoding processes, default one per core)."""
    if has_batches(directory):
        x_train, y_train = _read_all(directory, TRAIN_FILES)
        x_test, y_test = _read_all(directory, TEST_FILES)
        return RawSplits(x_train, y_train, x_test, y_test)
    train, y_train = list_split(directory, "train")
    test, y_test = list_split(directory, "test")
    return RawSplits(folders.decode_all(train, workers), y_train,
                     folders.decode_all(test, workers), y_test)
