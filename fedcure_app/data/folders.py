"""Image datasets as class folders: ``<split>/<class>/<image>``, one folder per class.

CINIC-10 ships this way (PNG) and the offline CIFAR-10 copy too (JPEG). Listing is sorted by
class (the dataset's official label order) then file name, so the same tree gives the same
arrays; every image must be 32×32 (greyscale ones are converted to RGB). Decoding is spread
over a process pool (one worker per core) for large splits; the loader caches the result.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from fedcure_app.data.errors import CorruptDatasetError, MissingDatasetError

log = logging.getLogger(__name__)

#: Below this many images a split is decoded in-process (a pool costs more than it saves).
_POOL_THRESHOLD = 512
#: Images per task sent to a worker.
_CHUNK = 1000


def list_split(directory: Path, split: str, classes: Sequence[str], suffixes: Sequence[str], *,
               dataset: str, fetch: str) -> tuple[list[Path], np.ndarray]:
    """The image paths of one split (files ending in one of ``suffixes``, any case), sorted by
    class in ``classes`` order then by file name, and their labels (int64). A missing class
    folder or a split without images is one line naming the folder (``fetch``: where to get
    the files)."""
    paths: list[Path] = []
    labels: list[int] = []
    wanted = {s.lower() for s in suffixes}
    for label, cls in enumerate(classes):
        folder = directory / split / cls
        if not folder.is_dir():
            raise MissingDatasetError(
                f"{folder}: class folder missing ({dataset} needs one folder per class: "
                f"{', '.join(classes)}); {fetch}")
        found = sorted((p for p in folder.iterdir() if p.suffix.lower() in wanted),
                       key=lambda p: p.name)
        paths.extend(found)
        labels.extend([label] * len(found))
    if not paths:
        raise CorruptDatasetError(f"{directory / split}: no {'/'.join(sorted(wanted))} images "
                                  "in any class folder")
    return paths, np.asarray(labels, dtype=np.int64)


def decode_images(paths: list[str]) -> np.ndarray:
    """Decode 32×32 images into uint8 (N, 32, 32, 3); runs inside pool workers."""
    # lazy: only the image-folder datasets need Pillow; every other reader loads without it
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
        hwc = decode_images(names)
    else:
        chunk = max(1, min(_CHUNK, -(-len(names) // n_workers)))
        chunks = [names[i:i + chunk] for i in range(0, len(names), chunk)]
        log.info("decoding %d images in %d chunks on %d processes", len(names), len(chunks),
                 n_workers)
        with ProcessPoolExecutor(max_workers=min(n_workers, len(chunks))) as pool:
            hwc = np.concatenate(list(pool.map(decode_images, chunks)))
    return np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))


__all__ = ["decode_all", "decode_images", "list_split"]
