"""MNIST IDX reader: layouts, gzip and plain files, and damaged files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from fedcure_app.data import CorruptDatasetError, DatasetError, MissingDatasetError, load_dataset
from fedcure_app.data import mnist
from fedcure_app.data.idx import parse_idx
from tests.data.builders import idx_bytes, write_mnist


@pytest.mark.parametrize("layout", ["MNIST/raw", "raw", "."])
@pytest.mark.parametrize("gz", [True, False])
def test_round_trip_in_every_layout(tmp_path: Path, layout: str, gz: bool):
    x_tr, y_tr, x_te, y_te = write_mnist(tmp_path / layout, gz=gz)
    raw = mnist.read(mnist.locate(tmp_path))
    np.testing.assert_array_equal(raw.x_train[:, 0], x_tr)
    np.testing.assert_array_equal(raw.y_train, y_tr)
    np.testing.assert_array_equal(raw.x_test[:, 0], x_te)
    np.testing.assert_array_equal(raw.y_test, y_te)
    assert raw.x_train.dtype == np.uint8 and raw.y_train.dtype == np.int64


def test_load_dataset_normalises_with_mnist_constants(tmp_path: Path):
    x_tr, y_tr, _, _ = write_mnist(tmp_path / "MNIST" / "raw")
    ds = load_dataset("mnist", tmp_path)
    assert ds.x_train.dtype == np.float32 and ds.x_train.shape == (12, 1, 28, 28)
    expected = (x_tr.astype(np.float64) / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(ds.x_train[:, 0], expected, rtol=1e-5, atol=1e-5)
    assert ds.y_train.dtype == np.int64
    assert (ds.num_classes, ds.input_shape, ds.name) == (10, (1, 28, 28), "mnist")
    assert ds.class_names == tuple(str(d) for d in range(10))
    assert ds.train_size == 12 and ds.test_size == 5
    np.testing.assert_array_equal(ds.class_counts("train"), np.bincount(y_tr, minlength=10))


def test_missing_directory_names_files_and_source(tmp_path: Path):
    with pytest.raises(MissingDatasetError) as err:
        load_dataset("mnist", tmp_path / "nowhere")
    msg = str(err.value)
    assert "train-images-idx3-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg
    assert "does not exist" in msg and "yann.lecun.com" in msg
    assert "\n" not in msg


def test_one_missing_file_is_reported(tmp_path: Path):
    d = tmp_path / "raw"
    write_mnist(d)
    (d / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(MissingDatasetError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", tmp_path)


def test_bad_magic_names_the_file(tmp_path: Path):
    d = tmp_path / "raw"
    write_mnist(d, gz=False)
    target = d / "train-labels-idx1-ubyte"
    target.write_bytes(idx_bytes(np.zeros((12, 28, 28), np.uint8)))  # an images file
    with pytest.raises(CorruptDatasetError) as err:
        load_dataset("mnist", tmp_path)
    assert str(target) in str(err.value) and "bad magic number 0x00000803" in str(err.value)


def test_truncated_file_reports_wrong_length(tmp_path: Path):
    d = tmp_path / "raw"
    write_mnist(d, gz=False)
    target = d / "train-images-idx3-ubyte"
    target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(CorruptDatasetError) as err:
        load_dataset("mnist", tmp_path)
    assert str(target) in str(err.value) and "wrong length" in str(err.value)


def test_truncated_gzip_is_bad_gzip(tmp_path: Path):
    d = tmp_path / "raw"
    write_mnist(d)
    target = d / "t10k-images-idx3-ubyte.gz"
    target.write_bytes(target.read_bytes()[:40])
    with pytest.raises(CorruptDatasetError) as err:
        load_dataset("mnist", tmp_path)
    assert str(target) in str(err.value) and "bad gzip" in str(err.value)


def test_plain_bytes_with_gz_name_is_bad_gzip(tmp_path: Path):
    d = tmp_path / "raw"
    write_mnist(d)
    target = d / "train-labels-idx1-ubyte.gz"
    target.write_bytes(gzip.decompress(target.read_bytes()))
    with pytest.raises(CorruptDatasetError, match="bad gzip"):
        load_dataset("mnist", tmp_path)


def test_label_count_mismatch(tmp_path: Path):
    d = tmp_path / "raw"
    write_mnist(d, gz=False)
    (d / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(11, np.uint8)))
    with pytest.raises(CorruptDatasetError, match="11 labels for 12 images"):
        load_dataset("mnist", tmp_path)


def test_label_out_of_range(tmp_path: Path):
    d = tmp_path / "raw"
    write_mnist(d, gz=False)
    (d / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.full(5, 12, np.uint8)))
    with pytest.raises(CorruptDatasetError, match="label 12"):
        load_dataset("mnist", tmp_path)


def test_parse_idx_short_header():
    with pytest.raises(CorruptDatasetError, match="truncated IDX header"):
        parse_idx(b"\x00\x00\x08", 1, "f")
    with pytest.raises(CorruptDatasetError, match="truncated IDX header"):
        parse_idx(b"\x00\x00\x08\x03\x00\x00", 3, "f")


def test_dataset_error_is_a_value_error():
    assert issubclass(DatasetError, ValueError)
    assert issubclass(CorruptDatasetError, DatasetError)
    assert issubclass(MissingDatasetError, DatasetError)
