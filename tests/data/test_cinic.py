"""CINIC-10 PNG folders, decoded in a process pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedcure_app.data import CorruptDatasetError, MissingDatasetError, load_dataset
from fedcure_app.data import cinic
from tests.data.builders import write_cinic


@pytest.mark.parametrize("workers", [1, 2])
def test_round_trip_serial_and_pool(tmp_path: Path, workers: int):
    expected = write_cinic(tmp_path / "cinic-10", grey=True)
    raw = cinic.read(cinic.locate(tmp_path), workers=workers)
    np.testing.assert_array_equal(raw.x_train, expected["train"][0])
    np.testing.assert_array_equal(raw.y_train, expected["train"][1])
    np.testing.assert_array_equal(raw.x_test, expected["test"][0])
    np.testing.assert_array_equal(raw.y_test, expected["test"][1])
    assert raw.x_train.shape == (20, 3, 32, 32)


def test_load_dataset_uses_cifar_class_order(tmp_path: Path):
    write_cinic(tmp_path)
    ds = load_dataset("cinic10", tmp_path)
    assert ds.class_names[1] == "automobile" and ds.num_classes == 10
    np.testing.assert_array_equal(ds.class_counts("train"), np.full(10, 2))
    np.testing.assert_array_equal(ds.class_counts("test"), np.full(10, 1))


def test_missing_class_folder(tmp_path: Path):
    write_cinic(tmp_path)
    for p in (tmp_path / "test" / "frog").iterdir():
        p.unlink()
    (tmp_path / "test" / "frog").rmdir()
    with pytest.raises(MissingDatasetError, match=r"test/frog: class folder missing"):
        load_dataset("cinic10", tmp_path)


def test_missing_root_mentions_cinic_source(tmp_path: Path):
    with pytest.raises(MissingDatasetError) as err:
        load_dataset("cinic10", tmp_path)
    assert "datashare.ed.ac.uk" in str(err.value) and "--download" not in str(err.value)


def test_corrupt_png_names_the_file(tmp_path: Path):
    write_cinic(tmp_path)
    target = tmp_path / "train" / "cat" / "img_001.png"
    target.write_bytes(target.read_bytes()[:30])
    with pytest.raises(CorruptDatasetError) as err:
        load_dataset("cinic10", tmp_path)
    assert str(target) in str(err.value)


def test_wrong_size_image_in_pool(tmp_path: Path):
    write_cinic(tmp_path)
    target = tmp_path / "test" / "ship" / "img_000.png"
    Image.fromarray(np.zeros((16, 20, 3), np.uint8)).save(target)
    with pytest.raises(CorruptDatasetError) as err:
        cinic.read(tmp_path, workers=2)
    assert str(target) in str(err.value) and "20×16, expected 32×32" in str(err.value)
