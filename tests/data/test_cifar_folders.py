"""CIFAR-10 from image class folders (``train|test/<class>/*.{jpg,jpeg,png}``): label order,
what ``fedcure data info`` says it found, and one-line errors naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedcure_app.cli import main
from fedcure_app.data import CorruptDatasetError, MissingDatasetError, load_dataset
from fedcure_app.data import cifar
from fedcure_app.data.specs import CIFAR10_CLASSES
from tests.data.builders import write_cifar, write_class_folders


def test_png_folders_decode_exactly_in_the_official_label_order(tmp_path: Path):
    expected = write_class_folders(tmp_path / "cifar10", grey=True)
    raw = cifar.read(cifar.locate(tmp_path), workers=1)
    np.testing.assert_array_equal(raw.x_train, expected["train"][0])
    np.testing.assert_array_equal(raw.y_train, expected["train"][1])
    np.testing.assert_array_equal(raw.x_test, expected["test"][0])
    assert list(CIFAR10_CLASSES) == sorted(CIFAR10_CLASSES)  # official order = alphabetical
    assert raw.y_train.tolist() == [c for c in range(10) for _ in range(2)]


def test_jpeg_folders_load_and_say_they_are_a_re_encoding(tmp_path: Path):
    expected = write_class_folders(tmp_path / "cifar10", suffix=".jpg")
    ds = load_dataset("cifar10", tmp_path, cache=False)
    assert (ds.train_size, ds.test_size) == (20, 10)
    np.testing.assert_array_equal(ds.y_train, expected["train"][1])
    assert "JPEG class folders" in ds.source and "not the official pixels" in ds.source


def test_mixed_suffixes_and_upper_case_are_read(tmp_path: Path):
    write_class_folders(tmp_path, suffix=".jpeg")
    img = tmp_path / "train" / "dog" / "img_000.jpeg"
    img.rename(img.with_name("extra.PNG"))
    raw = cifar.read(cifar.locate(tmp_path), workers=1)
    assert raw.x_train.shape == (20, 3, 32, 32)


def test_official_batches_win_over_folders(tmp_path: Path):
    write_cifar(tmp_path / "cifar10" / "cifar-10-batches-py")
    write_class_folders(tmp_path / "cifar10")
    found = cifar.locate(tmp_path)
    assert found.name == "cifar-10-batches-py"
    assert "official python batches" in cifar.describe(found)


def test_a_missing_class_folder_is_one_line_naming_it(tmp_path: Path):
    write_class_folders(tmp_path / "cifar10")
    for p in (tmp_path / "cifar10" / "train" / "horse").iterdir():
        p.unlink()
    (tmp_path / "cifar10" / "train" / "horse").rmdir()
    with pytest.raises(MissingDatasetError) as err:
        load_dataset("cifar10", tmp_path, cache=False)
    msg = str(err.value)
    assert "train/horse: class folder missing" in msg and "\n" not in msg


def test_an_unreadable_image_is_one_line_naming_the_file(tmp_path: Path):
    write_class_folders(tmp_path / "cifar10", suffix=".jpg")
    target = tmp_path / "cifar10" / "test" / "cat" / "img_000.jpg"
    target.write_bytes(b"not a jpeg")
    with pytest.raises(CorruptDatasetError) as err:
        load_dataset("cifar10", tmp_path, cache=False)
    assert str(target) in str(err.value) and "\n" not in str(err.value)


def test_a_wrong_size_image_names_the_file_and_its_size(tmp_path: Path):
    write_class_folders(tmp_path / "cifar10")
    target = tmp_path / "cifar10" / "train" / "ship" / "img_001.png"
    Image.fromarray(np.zeros((30, 31, 3), np.uint8)).save(target)
    with pytest.raises(CorruptDatasetError) as err:
        cifar.read(tmp_path / "cifar10", workers=1)
    assert str(target) in str(err.value) and "31×30, expected 32×32" in str(err.value)


def test_a_missing_tree_names_both_layouts(tmp_path: Path):
    with pytest.raises(MissingDatasetError) as err:
        load_dataset("cifar10", tmp_path)
    assert "cifar-10-batches-py" in str(err.value) and "train/<class>/*.jpg" in str(err.value)


def test_data_info_says_which_layout_it_found(tmp_path: Path, capsys):
    write_class_folders(tmp_path / "cifar10", suffix=".jpg")
    rc = main(["data", "info", "--dataset", "cifar10", "--data-dir", str(tmp_path),
               "--clients", "4", "--edges", "2"])
    assert rc == 0
    assert "JPEG class folders" in " ".join(capsys.readouterr().out.split())
