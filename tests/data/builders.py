"""Writers of tiny datasets in each real on-disk format, for the reader tests."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import scipy.io

from fedcure_app.data import mnist
from fedcure_app.data.specs import CIFAR10_CLASSES


def idx_bytes(arr: np.ndarray) -> bytes:
    """An unsigned-byte IDX file holding ``arr``."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in arr.shape)
    return header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def random_split(n: int, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random uint8 images (n, *shape) and labels cycling through 0..9."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    y = (np.arange(n) % 10).astype(np.int64)
    return x, y


def write_mnist(directory: Path, *, gz: bool = True, n_train: int = 12, n_test: int = 5
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four IDX files in ``directory``; returns (x_train, y_train, x_test, y_test), uint8
    images (N, 28, 28)."""
    directory.mkdir(parents=True, exist_ok=True)
    x_tr, y_tr = random_split(n_train, (28, 28), 1)
    x_te, y_te = random_split(n_test, (28, 28), 2)
    content = {
        mnist.FILES["train_images"]: idx_bytes(x_tr),
        mnist.FILES["train_labels"]: idx_bytes(y_tr.astype(np.uint8)),
        mnist.FILES["test_images"]: idx_bytes(x_te),
        mnist.FILES["test_labels"]: idx_bytes(y_te.astype(np.uint8)),
    }
    for name, data in content.items():
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)
    return x_tr, y_tr, x_te, y_te


def write_cifar(directory: Path, *, per_batch: int = 4, protocol: int = 2
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``data_batch_1..5`` and ``test_batch`` as the official pickled dicts (bytes keys)."""
    directory.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        x, y = random_split(per_batch, (3, 32, 32), 10 + i)
        y = (y + i) % 10
        batch = {b"batch_label": name.encode(), b"labels": y.tolist(),
                 b"data": x.reshape(per_batch, -1), b"filenames": [b"x.png"] * per_batch}
        with (directory / name).open("wb") as f:
            pickle.dump(batch, f, protocol=protocol)
        xs.append(x)
        ys.append(y)
    return (np.concatenate(xs[:5]), np.concatenate(ys[:5]), xs[5], ys[5])


def write_svhn(directory: Path, *, n_train: int = 7, n_test: int = 4
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``train_32x32.mat`` / ``test_32x32.mat`` with X (32, 32, 3, N) and y in 1..10."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, n, seed in (("train_32x32.mat", n_train, 3), ("test_32x32.mat", n_test, 4)):
        x, y = random_split(n, (3, 32, 32), seed)
        mat_y = np.where(y == 0, 10, y).astype(np.uint8).reshape(-1, 1)
        scipy.io.savemat(str(directory / name), {"X": x.transpose(2, 3, 1, 0), "y": mat_y})
        out += [x, y]
    return out[0], out[1], out[2], out[3]


def write_cinic(root: Path, *, per_class: tuple[int, int] = (2, 1), grey: bool = False
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``train|valid|test/<class>/*.png``; returns {split: (uint8 (N, 3, 32, 32), labels)} in
    the reader's order (class, then file name)."""
    return write_class_folders(root, per_class=per_class, grey=grey, valid=True)


def write_class_folders(root: Path, *, per_class: tuple[int, int] = (2, 1), grey: bool = False,
                        suffix: str = ".png", valid: bool = False
                        ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``train|test[|valid]/<class>/img_NNN<suffix>`` of random 32×32 images; returns {split:
    (uint8 (N, 3, 32, 32), labels)} in the reader's order (class, then file name): the pixels
    written (for a lossy ``suffix`` such as .jpg, the pixels before encoding)."""
    from PIL import Image

    out = {}
    rng = np.random.default_rng(5)
    splits = [("train", per_class[0]), ("test", per_class[1])] + ([("valid", 1)] if valid else [])
    for split, n in splits:
        xs, ys = [], []
        for label, cls in enumerate(CIFAR10_CLASSES):
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for j in range(n):
                hwc = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                if grey and j == 0:
                    g = hwc[:, :, 0]
                    Image.fromarray(g, mode="L").save(folder / f"img_{j:03d}{suffix}")
                    hwc = np.repeat(g[:, :, None], 3, axis=2)
                else:
                    Image.fromarray(hwc).save(folder / f"img_{j:03d}{suffix}")
                xs.append(hwc.transpose(2, 0, 1))
                ys.append(label)
        out[split] = (np.stack(xs), np.asarray(ys, dtype=np.int64))
    return out
