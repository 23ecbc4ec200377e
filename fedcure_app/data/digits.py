"""scikit-learn's bundled 8×8 handwritten digits (1,797 images, pixel values 0–16): no files.

The bundled ``sklearn/datasets/data/digits.csv.gz`` (64 pixels + label per row) is parsed
directly, which avoids importing scikit-learn (≈1.4 s, paid by every fresh ClientApp process);
if that file is not where it has always been, ``sklearn.datasets.load_digits`` is used instead.
The 80/20 train/test split is stratified by class and seeded, so every process sees the same one
(1,437 training and 360 test images).
"""

from __future__ import annotations

import gzip
import importlib.util
import logging
import math
from pathlib import Path

import numpy as np

from fedcure_app.data.dataset import RawSplits
from fedcure_app.data.errors import CorruptDatasetError

log = logging.getLogger(__name__)

#: Seed of the fixed train/test split.
SPLIT_SEED = 0
TEST_FRACTION = 0.2
_PIXELS = 64


def bundled_csv() -> Path | None:
    """Path of scikit-learn's ``digits.csv.gz`` (found without importing scikit-learn)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


def _parse_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        text = gzip.decompress(path.read_bytes()).decode("ascii")
        flat = np.array(text.replace("\n", ",").strip(",").split(","), dtype=np.int64)
        table = flat.reshape(-1, _PIXELS + 1)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as err:
        raise CorruptDatasetError(f"{path}: not scikit-learn's digits table ({err})") from None
    return table[:, :_PIXELS], table[:, _PIXELS]


def load_pixels() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 images as uint8 (N, 1, 8, 8) with values 0–16, and int64 labels (N,)."""
    path = bundled_csv()
    if path is not None:
        pixels, labels = _parse_csv(path)
    else:
        # lazy: scikit-learn takes seconds to import; only needed without the bundled CSV
        from sklearn.datasets import load_digits

        log.info("digits.csv.gz not found beside scikit-learn; using load_digits()")
        bunch = load_digits()
        pixels, labels = bunch.data, bunch.target
    return (pixels.astype(np.uint8).reshape(-1, 1, 8, 8),
            np.asarray(labels, dtype=np.int64))


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) indices; each class keeps ≈ its share in both parts.

    The test set has ⌈fraction·N⌉ samples (scikit-learn's convention), spread over the classes
    by largest remainder (ties to the lower class); samples are drawn with ``seed``.
    """
    classes, counts = np.unique(labels, return_counts=True)
    n_test = math.ceil(test_fraction * labels.size)
    exact = counts * (n_test / labels.size)
    per_class = np.floor(exact).astype(np.int64)
    short = n_test - int(per_class.sum())
    per_class[np.argsort(-(exact - per_class), kind="stable")[:short]] += 1
    rng = np.random.default_rng(seed)
    test = np.concatenate([
        rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, per_class)
    ])
    mask = np.zeros(labels.size, dtype=bool)
    mask[test] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def read() -> RawSplits:
    """The digits as uint8 (N, 1, 8, 8) with the deterministic stratified 80/20 split."""
    x, y = load_pixels()
    train, test = stratified_split(y, TEST_FRACTION, SPLIT_SEED)
    return RawSplits(x[train], y[train], x[test], y[test])
