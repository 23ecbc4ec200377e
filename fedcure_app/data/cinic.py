"""CINIC-10 from its PNG image folders ``train/<class>/*.png`` and ``test/<class>/*.png``.

Looked for in ``<root>/cinic-10``, ``<root>/CINIC-10``, ``<root>/cinic10`` and ``<root>``. The
classes are the ten CIFAR-10 names in CIFAR order; the ``valid`` split is not read (train and test
are 90,000 images each). Images are 32×32; CINIC's few greyscale ones are converted to RGB.
Decoding is spread over a process pool (one worker per core) and done once: the loader caches the
result.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from fedcure_app.data.dataset import RawSplits
from fedcure_app.data.errors import CorruptDatasetError, MissingDatasetError
from fedcure_app.data.locate import find_dir
from fedcure_app.data.specs import CIFAR10_CLASSES, SPECS

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "test")
#: Below this many images a split is decoded in-process (a pool costs more than it saves).
_POOL_THRESHOLD = 512
#: Images per task sent to a worker.
_CHUNK = 1000


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
    paths: list[Path] = []
    labels: list[int] = []
    for label, cls in enumerate(CIFAR10_CLASSES):
        folder = directory / split / cls
        if not folder.is_dir():
            raise MissingDatasetError(
                f"{folder}: class folder missing (CINIC-10 needs one folder per class: "
                f"{', '.join(CIFAR10_CLASSES)}); get the files from {SPECS['cinic10'].url}"
            )
        found = sorted(
            (p for p in folder.iterdir() if p.suffix.lower() == ".png"), key=lambda p: p.name
        )
        paths.extend(found)
        labels.extend([label] * len(found))
    if not paths:
        raise CorruptDatasetError(f"{directory / split}: no .png images in any class folder")
    return paths, np.asarray(labels, dtype=np.int64)


def source_files(directory: Path) -> list[Path]:
    """Every image that will be read (for the cache key)."""
    files: list[Path] = []
    for split in SPLITS:
        files.extend(list_split(directory, split)[0])
    return files


def decode_pngs(paths: list[str]) -> np.ndarray:
    """Decode 32×32 images into uint8 (N, 32, 32, 3); runs inside pool workers."""
    # lazy: only CINIC-10's PNGs need Pillow; every other dataset reader loads without it
    from PIL import Image

    out = np.empty((len(paths), 32, 32, 3), dtype=np.uint8)
    for i, p in enumerate(paths):
        try:
            with Image.open(p) as im:
                arr = np.asarray(im.convert("RGB"))
        except Exception as err:  # Pillow raises many types on damaged files
            raise CorruptDatasetError(
                f"{p}: cannot decode image ({type(err).__name__}: {err})"
            ) from None
        if arr.shape != (32, 32, 3):
            raise CorruptDatasetError(
                f"{p}: image is {arr.shape[1]}×{arr.shape[0]}, expected 32×32"
            )
        out[i] = arr
    return out


def decode_all(paths: list[Path], workers: int | None = None) -> np.ndarray:
    """Decode ``paths`` in order into uint8 (N, 3, 32, 32), in parallel when worthwhile.

    ``workers``: processes to use (default: one per core); 1 decodes in this process.
    """
    names = [str(p) for p in paths]
    auto = workers is None
    n_workers = (os.cpu_count() or 1) if workers is None else max(1, int(workers))
    if n_workers == 1 or (auto and len(names) < _POOL_THRESHOLD):
        hwc = decode_pngs(names)
    else:
        chunk = max(1, min(_CHUNK, -(-len(names) // n_workers)))
        chunks = [names[i:i + chunk] for i in range(0, len(names), chunk)]
        log.info("decoding %d PNGs in %d chunks on %d processes", len(names), len(chunks),
                 n_workers)
        with ProcessPoolExecutor(max_workers=min(n_workers, len(chunks))) as pool:
            hwc = np.concatenate(list(pool.map(decode_pngs, chunks)))
    return np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))


def read(directory: Path, workers: int | None = None) -> RawSplits:
    """Decode the train and test splits."""
    x_train_paths, y_train = list_split(directory, "train")
    x_test_paths, y_test = list_split(directory, "test")
    return RawSplits(decode_all(x_train_paths, workers), y_train,
                     decode_all(x_test_paths, workers), y_test)
