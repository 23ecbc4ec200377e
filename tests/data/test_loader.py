"""load_dataset: digits, names, default directory and the optional torchvision download."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from fedcure_app.data import DatasetError, MissingDatasetError, canonical_name, load_dataset
from fedcure_app.data import download as download_mod
from fedcure_app.data.specs import SPECS
from tests.data.builders import write_mnist


def test_digits_split_is_stratified_and_deterministic():
    a = load_dataset("digits")
    b = load_dataset("digits")
    assert (a.train_size, a.test_size) == (1437, 360)
    assert a.x_train.shape == (1437, 1, 8, 8) and a.x_train.dtype == np.float32
    assert a.y_train.dtype == np.int64 and a.num_classes == 10
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    share = a.class_counts("test") / (a.class_counts("test") + a.class_counts("train"))
    assert np.all(np.abs(share - 0.2) < 0.02)


def test_digits_constants_match_the_data():
    from sklearn.datasets import load_digits

    x = load_digits().images / 16.0
    spec = SPECS["digits"]
    assert abs(x.mean() - spec.mean[0]) < 1e-4 and abs(x.std() - spec.std[0]) < 1e-4
    ds = load_dataset("digits")
    both = np.concatenate([ds.x_train, ds.x_test])
    assert abs(both.mean()) < 1e-3 and abs(both.std() - 1.0) < 1e-3


@pytest.mark.parametrize("name, canonical", [("MNIST", "mnist"), ("cifar-10", "cifar10"),
                                             ("CINIC_10", "cinic10"), ("svhn", "svhn")])
def test_names(name, canonical):
    assert canonical_name(name) == canonical


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        load_dataset("imagenet")


def test_default_data_dir_from_environment(tmp_path: Path, monkeypatch):
    write_mnist(tmp_path / "MNIST" / "raw")
    monkeypatch.setenv("FEDCURE_DATA_DIR", str(tmp_path))
    assert load_dataset("mnist").train_size == 12


def test_download_without_torchvision_explains(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(download_mod, "_torchvision_datasets",
                        lambda: (None, "ImportError: broken build"))
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist", tmp_path, download=True)
    msg = str(err.value)
    assert "needs torchvision" in msg and "broken build" in msg and "yann.lecun.com" in msg


def test_download_not_offered_for_cinic(tmp_path: Path):
    with pytest.raises(DatasetError, match="not available for cinic10"):
        load_dataset("cinic10", tmp_path, download=True)


def test_download_through_torchvision_layout(tmp_path: Path, monkeypatch):
    """A stand-in torchvision writes MNIST/raw as the real one does; the reader finds it."""
    calls = []

    class MNIST:
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            write_mnist(Path(root) / "MNIST" / "raw")

    tv = types.ModuleType("torchvision")
    tvd = types.ModuleType("torchvision.datasets")
    tvd.MNIST = MNIST
    tv.datasets = tvd
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", tvd)
    ds = load_dataset("mnist", tmp_path / "new", download=True)
    assert ds.train_size == 12 and [c[1] for c in calls] == [True, False]
    load_dataset("mnist", tmp_path / "new", download=True)
    assert len(calls) == 2  # files present: nothing fetched again


def test_missing_without_download_is_missing_error(tmp_path: Path):
    with pytest.raises(MissingDatasetError, match="--download"):
        load_dataset("svhn", tmp_path)


def test_digits_pixels_equal_load_digits():
    from sklearn.datasets import load_digits

    from fedcure_app.data import digits

    x, y = digits.load_pixels()
    ref = load_digits()
    np.testing.assert_array_equal(x[:, 0].astype(np.float64), ref.images)
    np.testing.assert_array_equal(y, ref.target)


def test_digits_fallback_to_load_digits(monkeypatch):
    from fedcure_app.data import digits

    direct = digits.read()
    monkeypatch.setattr(digits, "bundled_csv", lambda: None)
    fallback = digits.read()
    np.testing.assert_array_equal(direct.x_train, fallback.x_train)
    np.testing.assert_array_equal(direct.y_test, fallback.y_test)


def test_stratified_split_sizes_and_shares():
    from fedcure_app.data.digits import stratified_split

    y = np.repeat(np.arange(3), [7, 11, 13])
    train, test = stratified_split(y, 0.2, seed=5)
    assert test.size == 7 and train.size == 24  # ⌈0.2·31⌉ = 7
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(31))
    # exact shares 7·(7, 11, 13)/31 = 1.58, 2.48, 2.94: floors 1, 2, 2 + the two largest remainders
    assert np.bincount(y[test], minlength=3).tolist() == [2, 2, 3]
    again = stratified_split(y, 0.2, seed=5)
    np.testing.assert_array_equal(test, again[1])
