"""CIFAR-10 pickle batches and SVHN .mat files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from fedcure_app.data import CorruptDatasetError, MissingDatasetError, load_dataset
from fedcure_app.data import cifar, svhn
from tests.data.builders import write_cifar, write_svhn


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_round_trip(tmp_path: Path, protocol: int):
    x_tr, y_tr, x_te, y_te = write_cifar(tmp_path / "cifar-10-batches-py", protocol=protocol)
    raw = cifar.read(cifar.locate(tmp_path))
    np.testing.assert_array_equal(raw.x_train, x_tr)
    np.testing.assert_array_equal(raw.y_train, y_tr)
    np.testing.assert_array_equal(raw.x_test, x_te)
    np.testing.assert_array_equal(raw.y_test, y_te)


def test_cifar_load_dataset(tmp_path: Path):
    x_tr, _, _, _ = write_cifar(tmp_path / "cifar-10-batches-py")
    ds = load_dataset("CIFAR-10", tmp_path)
    assert ds.name == "cifar10" and ds.x_train.shape == (20, 3, 32, 32)
    assert ds.class_names[0] == "airplane" and ds.class_names[-1] == "truck"
    # channel planes keep their own mean/std (R plane of the first image)
    r = (x_tr[0, 0].astype(np.float64) / 255 - 0.4914) / 0.2470
    np.testing.assert_allclose(ds.x_train[0, 0], r, rtol=1e-5, atol=1e-5)


def test_cifar_missing_batch(tmp_path: Path):
    d = tmp_path / "cifar-10-batches-py"
    write_cifar(d)
    (d / "data_batch_3").unlink()
    with pytest.raises(MissingDatasetError) as err:
        load_dataset("cifar10", tmp_path)
    assert "data_batch_3" in str(err.value) and "cifar-10-python.tar.gz" in str(err.value)


def test_cifar_truncated_batch(tmp_path: Path):
    d = tmp_path / "cifar-10-batches-py"
    write_cifar(d)
    target = d / "data_batch_2"
    target.write_bytes(target.read_bytes()[:200])
    with pytest.raises(CorruptDatasetError) as err:
        load_dataset("cifar10", tmp_path)
    assert str(target) in str(err.value)


def test_cifar_refuses_code_in_pickles(tmp_path: Path):
    d = tmp_path / "cifar-10-batches-py"
    write_cifar(d)
    target = d / "test_batch"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    target.write_bytes(pickle.dumps({b"data": Evil(), b"labels": [0]}))
    with pytest.raises(CorruptDatasetError, match="refusing to load builtins.print"):
        load_dataset("cifar10", tmp_path)


def test_cifar_wrong_data_shape(tmp_path: Path):
    d = tmp_path / "cifar-10-batches-py"
    write_cifar(d)
    with (d / "data_batch_1").open("wb") as f:
        pickle.dump({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4}, f)
    with pytest.raises(CorruptDatasetError, match="expected uint8 \\(N, 3072\\)"):
        load_dataset("cifar10", tmp_path)


@pytest.mark.parametrize("layout", [".", "svhn"])
def test_svhn_round_trip_maps_10_to_0(tmp_path: Path, layout: str):
    x_tr, y_tr, x_te, y_te = write_svhn(tmp_path / layout)
    raw = svhn.read(svhn.locate(tmp_path))
    np.testing.assert_array_equal(raw.x_train, x_tr)
    np.testing.assert_array_equal(raw.y_train, y_tr)
    np.testing.assert_array_equal(raw.x_test, x_te)
    np.testing.assert_array_equal(raw.y_test, y_te)
    assert raw.y_train.min() == 0 and raw.x_train.flags.c_contiguous


def test_svhn_load_dataset(tmp_path: Path):
    write_svhn(tmp_path)
    ds = load_dataset("svhn", tmp_path)
    assert ds.x_test.shape == (4, 3, 32, 32) and ds.x_test.dtype == np.float32
    assert ds.class_names == tuple(str(d) for d in range(10))


def test_svhn_missing_file(tmp_path: Path):
    write_svhn(tmp_path)
    (tmp_path / "test_32x32.mat").unlink()
    with pytest.raises(MissingDatasetError) as err:
        load_dataset("svhn", tmp_path)
    assert "test_32x32.mat" in str(err.value) and "ufldl.stanford.edu" in str(err.value)


def test_svhn_truncated_file(tmp_path: Path):
    write_svhn(tmp_path)
    target = tmp_path / "train_32x32.mat"
    target.write_bytes(target.read_bytes()[:300])
    with pytest.raises(CorruptDatasetError) as err:
        load_dataset("svhn", tmp_path)
    assert str(target) in str(err.value)


def test_svhn_missing_variable(tmp_path: Path):
    write_svhn(tmp_path)
    scipy.io.savemat(str(tmp_path / "test_32x32.mat"), {"X": np.zeros((32, 32, 3, 2), np.uint8)})
    with pytest.raises(CorruptDatasetError, match="missing variable y"):
        load_dataset("svhn", tmp_path)
