"""Benchmark: dataset loading (MNIST first decode vs. cache hit, scikit-learn digits) and
partitioning.

MNIST comes from the official IDX files (default ``../shared/data/mnist``). The cache entry of
that source is deleted first, so the first load decodes the gzip IDX files and writes the cache;
the next loads read the cache (best of ``--repeat``). Also checks the published counts (60,000
train / 10,000 test, 10 classes, train class counts) and times the four partition schemes on
MNIST's labels (50 clients, 5 ESs).

    python3 bench/data.py [--data-dir DIR] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from fedcure_app.data import clear_cache, load_dataset
from fedcure_app.data.partition import SCHEMES, partition_dataset

ROOT = Path(__file__).resolve().parents[1]

#: Published MNIST training-set class counts (digits 0–9).
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    ap.add_argument("--repeat", type=int, default=5, help="cached loads to time (best of)")
    args = ap.parse_args()

    removed = clear_cache("mnist", args.data_dir)
    print(f"cleared {len(removed)} cache file(s) of {args.data_dir}")
    ds, t_first = _timed(lambda: load_dataset("mnist", args.data_dir))
    assert not ds.from_cache
    cached = []
    for _ in range(max(1, args.repeat)):
        ds2, t = _timed(lambda: load_dataset("mnist", args.data_dir))
        assert ds2.from_cache
        cached.append(t)
    _, t_nocache = _timed(lambda: load_dataset("mnist", args.data_dir, cache=False))
    print(f"MNIST source: {ds.source}")
    print(f"MNIST first load (decode gzip IDX + write cache): {t_first:.3f} s")
    print(f"MNIST decode without cache:                       {t_nocache:.3f} s")
    print(f"MNIST cached load: best {min(cached):.3f} s, median {np.median(cached):.3f} s "
          f"({len(cached)} loads)")

    checks = {
        "train size 60,000": ds.train_size == 60_000,
        "test size 10,000": ds.test_size == 10_000,
        "10 classes": ds.num_classes == 10 and len(np.unique(ds.y_train)) == 10,
        "train class counts": ds.class_counts("train").tolist() == MNIST_TRAIN_COUNTS,
        "test class counts": ds.class_counts("test").tolist() == MNIST_TEST_COUNTS,
        "shape 1×28×28 float32": ds.x_train.shape[1:] == (1, 28, 28)
        and ds.x_train.dtype == np.float32,
        "normalised train mean≈0, std≈1": abs(float(ds.x_train.mean())) < 1e-2
        and abs(float(ds.x_train.std()) - 1) < 1e-2,
        "cache identical to decode": np.array_equal(ds.x_train, ds2.x_train)
        and np.array_equal(ds.y_test, ds2.y_test),
    }
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")

    digits, t_digits = _timed(lambda: load_dataset("digits"))
    _, t_digits2 = _timed(lambda: load_dataset("digits"))
    print(f"digits load: first {t_digits:.3f} s (parses scikit-learn's bundled CSV), "
          f"again {t_digits2:.3f} s ({digits.train_size} train / {digits.test_size} test)")

    for scheme in SCHEMES:
        part, t = _timed(lambda: partition_dataset(ds.y_train, 50, 5, scheme, seed=0))
        print(f"partition {scheme:<11} 50 clients / 5 ESs on MNIST: {1000 * t:6.1f} ms, "
              f"sizes {part.client_sizes.min()}–{part.client_sizes.max()}, "
              f"initial JSD {part.initial_jsd:.4f} nats")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
