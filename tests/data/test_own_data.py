"""A client's own data (fedcure_app.data.own): every reader, every refusal (one line naming the
file, row, column or class), labels mapped to the task's classes by name, the seeded stratified
hold-out, the normalisation and the task inferred from clients' data."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from fedcure_app.data.own import (
    ClientDataError,
    infer_task,
    normalise_x,
    pixel_norm,
    read_client_data,
    stratified_holdout,
)
from tests.data.own_builders import (
    image_task,
    pixels,
    table_rows,
    table_task,
    write_classes,
    write_csv,
)


def refused(match: str, fn, *args, **kw) -> str:
    """``fn`` raises a one-line ClientDataError containing every ``|``-separated part."""
    with pytest.raises(ClientDataError) as info:
        fn(*args, **kw)
    text = str(info.value)
    assert "\n" not in text
    for part in match.split("|"):
        assert part in text, text
    return text


# ----------------------------------------------------------------------------- class folders


def test_class_folders_read_as_uint8_nchw_with_labels_by_task_name(tmp_path):
    written = write_classes(tmp_path, {"dog": 4, "cat": 3})
    data = read_client_data(tmp_path, image_task(), holdout=0)
    assert data.format == "folders" and data.source == str(tmp_path)
    assert data.x_train.dtype == np.uint8 and data.x_train.shape == (7, 1, 6, 5)
    assert data.y_train.dtype == np.int64
    assert data.y_train.tolist() == [0, 0, 0, 1, 1, 1, 1]  # cat = 0, dog = 1 in the task
    assert np.array_equal(data.x_train[:3, 0], written["cat"])
    assert np.array_equal(data.x_train[3:, 0], written["dog"])
    assert data.x_test.shape == (0, 1, 6, 5) and data.y_test.shape == (0,)


def test_train_and_test_folders_give_the_test_part_and_no_holdout(tmp_path):
    write_classes(tmp_path / "train", {"cat": 5, "dog": 5})
    write_classes(tmp_path / "test", {"dog": 2}, seed=9)
    data = read_client_data(tmp_path, image_task(), holdout=0.5)
    assert len(data.y_train) == 10 and data.y_test.tolist() == [1, 1]


def test_any_case_jpeg_and_png_suffixes_are_read_other_files_skipped(tmp_path):
    write_classes(tmp_path, {"cat": 2}, suffix=".JPG")
    write_classes(tmp_path, {"dog": 2}, suffix=".jpeg", seed=3)
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    (tmp_path / ".DS_Store").write_text("")
    data = read_client_data(tmp_path, image_task(), holdout=0)
    assert data.y_train.tolist() == [0, 0, 1, 1]


def test_with_convert_colour_images_become_greyscale_and_greyscale_rgb_as_pillow_converts(
        tmp_path):
    rgb = write_classes(tmp_path / "c1", {"cat": 2}, channels=3)["cat"]
    grey = read_client_data(tmp_path / "c1", image_task(convert=True), holdout=0).x_train
    want = np.stack([np.asarray(Image.fromarray(a).convert("L")) for a in rgb])
    assert np.array_equal(grey[:, 0], want)
    g = write_classes(tmp_path / "c2", {"cat": 2})["cat"]
    colour = read_client_data(tmp_path / "c2", image_task(shape=(3, 6, 5), convert=True),
                              holdout=0).x_train
    assert colour.shape == (2, 3, 6, 5)
    assert all(np.array_equal(colour[:, c], g) for c in range(3))


def test_resize_true_resizes_bilinearly_with_pillow(tmp_path):
    big = write_classes(tmp_path, {"cat": 2}, hw=(12, 10))["cat"]
    data = read_client_data(tmp_path, image_task(resize=True), holdout=0)
    want = np.stack([np.asarray(Image.fromarray(a).resize((5, 6), Image.Resampling.BILINEAR))
                     for a in big])
    assert np.array_equal(data.x_train[:, 0], want)


def test_two_clients_with_different_classes_agree_on_a_shared_class(tmp_path):
    """ImageFolder's trap: {dog, zebra} would number dog 0 and {cat, dog} dog 1."""
    task = image_task()
    write_classes(tmp_path / "a", {"dog": 3, "zebra": 3})
    write_classes(tmp_path / "b", {"cat": 3, "dog": 3})
    a = read_client_data(tmp_path / "a", task, holdout=0)
    b = read_client_data(tmp_path / "b", task, holdout=0)
    assert set(a.y_train.tolist()) == {1, 2} and set(b.y_train.tolist()) == {0, 1}
    assert a.label_counts(3).tolist() == [0, 3, 3] and b.label_counts(3).tolist() == [3, 3, 0]


# ----------------------------------------------------------------------------- npz, CSV


@pytest.mark.parametrize("layout", ["nchw", "nhw", "nhwc"])
def test_npz_images_in_each_layout(tmp_path, layout):
    x = pixels(6, (6, 5))
    stored = {"nchw": x[:, None], "nhw": x, "nhwc": x[..., None]}[layout]
    np.savez(tmp_path / "d.npz", x=stored, y=np.array(["cat", "dog"] * 3))
    data = read_client_data(tmp_path / "d.npz", image_task(), holdout=0)
    assert data.format == "npz"
    assert np.array_equal(data.x_train[:, 0], x) and data.y_train.tolist() == [0, 1] * 3


def test_npz_rgb_channels_last_into_an_rgb_task(tmp_path):
    x = pixels(4, (6, 5, 3))
    np.savez(tmp_path / "d.npz", x=x, y=np.array(["cat", "dog"] * 2))
    data = read_client_data(tmp_path / "d.npz", image_task(shape=(3, 6, 5)), holdout=0)
    assert np.array_equal(data.x_train, x.transpose(0, 3, 1, 2))


def test_npz_integer_labels_through_its_classes_array_or_as_names(tmp_path):
    x = pixels(4, (1, 6, 5))
    np.savez(tmp_path / "named.npz", x=x, y=np.array([0, 1, 1, 0]),
             classes=np.array(["zebra", "cat"]))
    named = read_client_data(tmp_path / "named.npz", image_task(), holdout=0)
    assert named.y_train.tolist() == [2, 0, 0, 2]
    np.savez(tmp_path / "digits.npz", x=x, y=np.array([7, 3, 3, 7]))
    task = image_task(classes=[str(d) for d in range(10)])
    assert read_client_data(tmp_path / "digits.npz", task, holdout=0).y_train.tolist() == \
        [7, 3, 3, 7]
    refused("digits.npz|integer labels (3)|classes", read_client_data, tmp_path / "digits.npz",
            image_task(), holdout=0)


def test_npz_with_a_test_part_and_tabular_rows(tmp_path):
    x, _ = table_rows(["a"] * 5)
    np.savez(tmp_path / "t.npz", x=x, y=np.array(["a", "b", "a", "b", "c"]),
             x_test=x[:2], y_test=np.array(["c", "c"]))
    data = read_client_data(tmp_path / "t.npz", table_task(), holdout=0.3)
    assert data.x_train.dtype == np.float32 and np.array_equal(data.x_train, x)
    assert data.y_train.tolist() == [0, 1, 0, 1, 2] and data.y_test.tolist() == [2, 2]


def test_csv_rows_are_raw_float32_features_and_labels_by_name(tmp_path):
    x, rows = table_rows(["c", "a", "b", "a"])
    path = write_csv(tmp_path / "d.csv", ["f1", "f2", "f3", "label"], rows)
    data = read_client_data(path, table_task(), holdout=0)
    assert data.format == "csv" and np.array_equal(data.x_train, x)
    assert data.y_train.tolist() == [2, 0, 1, 0]


def test_csv_label_column_anywhere_and_named(tmp_path):
    rows = [["class_1", "1.5", "2"], ["class_0", "3", "4"]]
    path = write_csv(tmp_path / "d.csv", ["kind", "x", "y"], rows)
    data = read_client_data(path, table_task(["class_0", "class_1"], features=2),
                            label_column="kind", holdout=0)
    assert data.x_train.tolist() == [[1.5, 2.0], [3.0, 4.0]] and data.y_train.tolist() == [1, 0]


def test_a_folder_holding_one_csv_reads_that_file(tmp_path):
    _, rows = table_rows(["a", "b"])
    write_csv(tmp_path / "client" / "mine.csv", ["f1", "f2", "f3", "label"], rows)
    data = read_client_data(tmp_path / "client", table_task(), holdout=0)
    assert data.source == str(tmp_path / "client" / "mine.csv")


# ----------------------------------------------------------------------------- datasets


def _hf_images(labels, names, hw=(6, 5)):
    datasets = pytest.importorskip("datasets")
    arr = pixels(len(labels), hw)
    feats = datasets.Features({"image": datasets.Image(),
                               "label": datasets.ClassLabel(names=names)})
    ds = datasets.Dataset.from_dict({"image": [Image.fromarray(a) for a in arr],
                                     "label": labels}, features=feats)
    return ds, arr


def test_datasets_folder_with_classlabel_names(tmp_path):
    ds, arr = _hf_images([0, 1, 1, 0], ["zebra", "dog"])
    ds.save_to_disk(str(tmp_path / "hf"))
    data = read_client_data(tmp_path / "hf", image_task(), holdout=0)
    assert data.format == "datasets"
    assert np.array_equal(data.x_train[:, 0], arr) and data.y_train.tolist() == [2, 1, 1, 2]


def test_datasets_dict_gives_train_and_test_and_tables_with_string_labels(tmp_path):
    datasets = pytest.importorskip("datasets")
    tr, _ = _hf_images([0, 1, 0], ["cat", "dog"])
    te, _ = _hf_images([1], ["cat", "dog"])
    datasets.DatasetDict({"train": tr, "test": te}).save_to_disk(str(tmp_path / "dd"))
    data = read_client_data(tmp_path / "dd", image_task(), holdout=0.5)
    assert data.y_train.tolist() == [0, 1, 0] and data.y_test.tolist() == [1]
    rows = datasets.Dataset.from_dict({"f1": [1.0, 2.0], "f2": [3, 4], "label": ["b", "a"]})
    rows.save_to_disk(str(tmp_path / "rows"))
    tab = read_client_data(tmp_path / "rows", table_task(features=2), holdout=0)
    assert tab.x_train.tolist() == [[1.0, 3.0], [2.0, 4.0]] and tab.y_train.tolist() == [1, 0]


def test_infer_task_reads_datasets_folders_and_their_label_column(tmp_path):
    ds, arr = _hf_images([0, 1, 1], ["zebra", "dog"], hw=(4, 3))
    ds.save_to_disk(str(tmp_path / "clients" / "hf"))
    write_classes(tmp_path / "clients" / "plain", {"cat": 2}, hw=(4, 3))
    task, summary = infer_task(tmp_path / "clients")
    assert task.classes == ["cat", "dog", "zebra"] and task.input_shape == [1, 4, 3]
    assert summary["clients"][0]["format"] == "datasets"
    assert summary["clients"][0]["classes"] == {"dog": 2, "zebra": 1}
    refused("no label column 'kind'", read_client_data, tmp_path / "clients" / "hf", task,
            label_column="kind")


def test_datasets_folder_without_the_package_names_pip_install(tmp_path, monkeypatch):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_info.json").write_text("{}")
    (tmp_path / "hf" / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    refused("hf|pip install datasets", read_client_data, tmp_path / "hf", image_task())


# ----------------------------------------------------------------------------- refusals


def test_missing_or_empty_path_is_refused(tmp_path):
    refused("nowhere|no such file", read_client_data, tmp_path / "nowhere", image_task())
    (tmp_path / "empty").mkdir()
    refused("empty|empty folder", read_client_data, tmp_path / "empty", image_task())
    (tmp_path / "none" / "cat").mkdir(parents=True)
    refused("none|no png/jpg/jpeg images", read_client_data, tmp_path / "none", image_task())
    (tmp_path / "e.csv").write_text("")
    refused("e.csv|empty file", read_client_data, tmp_path / "e.csv", table_task())


def test_images_without_class_folders_are_refused(tmp_path):
    write_classes(tmp_path, {"cat": 1})
    (tmp_path / "cat" / "000.png").rename(tmp_path / "loose.png")
    (tmp_path / "cat").rmdir()
    refused("loose.png|folder named after the class", read_client_data, tmp_path, image_task())


def test_unreadable_image_is_named(tmp_path):
    write_classes(tmp_path, {"cat": 2})
    (tmp_path / "cat" / "broken.png").write_bytes(b"\x89PNG not really")
    refused("broken.png|cannot read image", read_client_data, tmp_path, image_task())


def test_image_of_another_size_names_the_file_and_both_sizes(tmp_path):
    write_classes(tmp_path, {"cat": 1})
    write_classes(tmp_path, {"dog": 1}, hw=(32, 32))
    refused("000.png|32×32|5×6|resize", read_client_data, tmp_path, image_task())


def test_class_not_in_the_task_is_named_with_its_folder(tmp_path):
    write_classes(tmp_path, {"cat": 1, "unicorn": 1})
    refused(f"{tmp_path / 'unicorn'}|'unicorn'|not in the task", read_client_data, tmp_path,
            image_task())
    np.savez(tmp_path / "d.npz", x=pixels(1, (6, 5)), y=np.array(["yak"]))
    refused("d.npz|'yak'", read_client_data, tmp_path / "d.npz", image_task())


def test_csv_refusals_name_the_row_and_column(tmp_path):
    header = ["f1", "f2", "f3", "label"]
    task = table_task()
    path = write_csv(tmp_path / "nolabel.csv", ["f1", "f2", "f3", "y"], [[1, 2, 3, "a"]])
    refused("nolabel.csv|no label column 'label'|--label-column", read_client_data, path, task)
    path = write_csv(tmp_path / "text.csv", header, [[1, 2, 3, "a"], [1, "oops", 3, "b"]])
    refused("text.csv|row 2|column 'f2'|'oops'", read_client_data, path, task)
    path = write_csv(tmp_path / "nan.csv", header, [[1, 2, "nan", "a"]])
    refused("nan.csv|row 1|column 'f3'", read_client_data, path, task)
    path = write_csv(tmp_path / "wide.csv", ["f1", "f2", "label"], [[1, 2, "a"]])
    refused("wide.csv|2 feature columns|features = 3", read_client_data, path, task)
    path = write_csv(tmp_path / "unknown.csv", header, [[1, 2, 3, "z"]])
    refused("unknown.csv|'z'|not in the task", read_client_data, path, task)
    path = write_csv(tmp_path / "short.csv", header, [[1, 2, "a"]])
    refused("short.csv|row 1 has 3 cells", read_client_data, path, task)


def test_npz_refusals(tmp_path):
    np.savez(tmp_path / "nox.npz", y=np.array(["cat"]))
    refused("nox.npz|no array 'x'", read_client_data, tmp_path / "nox.npz", image_task())
    np.savez(tmp_path / "noy.npz", x=pixels(1, (6, 5)))
    refused("noy.npz|no array 'y'", read_client_data, tmp_path / "noy.npz", image_task())
    np.savez(tmp_path / "len.npz", x=pixels(3, (6, 5)), y=np.array(["cat", "dog"]))
    refused("len.npz|3 samples|2 labels", read_client_data, tmp_path / "len.npz", image_task())
    np.savez(tmp_path / "shape.npz", x=pixels(2, (7, 7)), y=np.array(["cat", "dog"]))
    refused("shape.npz|7×7|5×6", read_client_data, tmp_path / "shape.npz", image_task())
    np.savez(tmp_path / "flat.npz", x=np.zeros(2), y=np.array(["a", "b"]))
    refused("flat.npz|shape [2]", read_client_data, tmp_path / "flat.npz", table_task())
    np.savez(tmp_path / "nan.npz", x=np.array([[0, 1, 2], [0, np.nan, 2]]), y=np.array(["a", "b"]))
    refused("nan.npz|row 2, feature 2", read_client_data, tmp_path / "nan.npz", table_task())
    np.savez(tmp_path / "float.npz", x=np.zeros((2, 6, 5)), y=np.array(["cat", "dog"]))
    refused("float.npz|uint8", read_client_data, tmp_path / "float.npz", image_task())
    np.savez(tmp_path / "obj.npz", x=pixels(2, (6, 5)),
             y=np.array(["cat", None], dtype=object))
    refused("obj.npz|pickled", read_client_data, tmp_path / "obj.npz", image_task())
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    refused("junk.npz|cannot read .npz", read_client_data, tmp_path / "junk.npz", image_task())


def test_data_of_the_other_kind_is_refused(tmp_path):
    write_classes(tmp_path / "img", {"a": 1})
    refused("img|kind is tabular", read_client_data, tmp_path / "img", table_task())
    path = write_csv(tmp_path / "d.csv", ["f", "label"], [[1, "cat"]])
    refused("d.csv|kind is image", read_client_data, path, image_task())


# ----------------------------------------------------------------------------- hold-out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=60),
       st.floats(0.0, 0.95, exclude_max=False), st.integers(0, 2**31))
def test_stratified_holdout_is_disjoint_covering_stratified_and_seeded(labels, fraction, seed):
    y = np.asarray(labels, dtype=np.int64)
    tr, te = stratified_holdout(y, fraction, seed)
    assert tr.dtype == np.int64 and te.dtype == np.int64
    assert np.all(np.diff(tr) > 0) and np.all(np.diff(te) > 0)  # sorted, no repeats
    assert not set(tr.tolist()) & set(te.tolist())
    assert sorted(tr.tolist() + te.tolist()) == list(range(len(y)))
    for cls in np.unique(y):
        n = int((y == cls).sum())
        if n >= 2 and fraction > 0:
            assert (y[tr] == cls).any() and (y[te] == cls).any()
    again = stratified_holdout(y, fraction, seed)
    assert np.array_equal(again[0], tr) and np.array_equal(again[1], te)
    if fraction == 0:
        assert len(te) == 0
    elif len(y) >= 2:
        assert len(te) >= 1 and len(tr) >= 1


def test_holdout_size_follows_the_fraction_per_class_and_seed_changes_the_draw():
    y = np.repeat(np.arange(3), 40)
    tr, te = stratified_holdout(y, 0.25, 0)
    assert np.bincount(y[te]).tolist() == [10, 10, 10]
    assert not np.array_equal(stratified_holdout(y, 0.25, 1)[1], te)
    with pytest.raises(ValueError, match="hold-out"):
        stratified_holdout(y, 1.0, 0)


def test_read_client_data_holds_out_a_seeded_stratified_part(tmp_path):
    write_classes(tmp_path, {"cat": 10, "dog": 10})
    a = read_client_data(tmp_path, image_task(), holdout=0.2, seed=4)
    b = read_client_data(tmp_path, image_task(), holdout=0.2, seed=4)
    assert a.y_test.tolist() == [0, 0, 1, 1] and len(a.y_train) == 16
    assert np.array_equal(a.x_test, b.x_test)


# ----------------------------------------------------------------------------- normalisation


def test_normalise_images_per_channel_and_pixel_norm_matches_pixelnorm():
    import torch

    from fedcure_app.training import PixelNorm

    task = image_task(shape=(3, 2, 2), mean=[0.1, 0.5, 0.9], std=[0.2, 0.25, 0.5])
    x = pixels(4, (3, 2, 2))
    out = normalise_x(x, task)
    want = (x / 255.0 - np.array([0.1, 0.5, 0.9])[None, :, None, None]) / \
        np.array([0.2, 0.25, 0.5])[None, :, None, None]
    assert out.dtype == np.float32 and np.allclose(out, want, atol=1e-5)
    scale, shift = pixel_norm(task)
    assert scale.dtype == np.float32 and shift.dtype == np.float32
    batch = PixelNorm(scale, shift)(torch.from_numpy(x)).numpy()
    assert np.array_equal(batch, out)  # bit for bit: one convention


def test_normalise_tables_per_feature():
    task = table_task(features=2, mean=[1.0, -2.0], std=[2.0, 0.5])
    x = np.array([[3.0, -2.0], [1.0, -1.0]], dtype=np.float32)
    assert np.allclose(normalise_x(x, task), [[1.0, 0.0], [0.0, 2.0]])
    assert np.allclose(normalise_x(x, table_task(features=2)), x)  # no mean/std: unchanged


# ----------------------------------------------------------------------------- infer_task


def test_infer_task_on_a_folder_of_client_folders(tmp_path):
    a = write_classes(tmp_path / "a", {"dog": 3, "zebra": 2})
    b = write_classes(tmp_path / "b" / "train", {"cat": 4}, seed=5)
    write_classes(tmp_path / "b" / "test", {"cat": 1}, seed=6)
    write_classes(tmp_path / "c", {"cat": 1}, hw=(8, 8), seed=7)
    task, summary = infer_task(tmp_path)
    assert task.kind == "image" and task.classes == ["cat", "dog", "zebra"]
    assert task.input_shape == [1, 6, 5] and task.model == "cnn" and not task.resize
    assert [c["name"] for c in summary["clients"]] == ["a", "b", "c"]
    assert [c["train"] for c in summary["clients"]] == [5, 4, 1]
    assert summary["clients"][1]["test"] == 1
    assert summary["clients"][0]["classes"] == {"dog": 3, "zebra": 2}
    assert summary["sizes"] == {"5×6": 10, "8×8": 1}
    big = write_classes(tmp_path / "x", {"cat": 1}, hw=(8, 8), seed=7)["cat"]
    small = np.asarray(Image.fromarray(big[0]).resize((5, 6), Image.Resampling.BILINEAR))
    train = np.concatenate([a["dog"].ravel(), a["zebra"].ravel(), b["cat"].ravel(),
                            small.ravel()]) / 255.0  # test/ left out, other sizes resized
    assert task.mean[0] == pytest.approx(train.mean(), rel=1e-5)
    assert task.std[0] == pytest.approx(train.std(), rel=1e-5)


def test_infer_task_colour_if_any_image_is_colour_and_given_model(tmp_path):
    write_classes(tmp_path / "a", {"cat": 2})
    write_classes(tmp_path / "b", {"dog": 2}, channels=3)
    task, summary = infer_task(tmp_path, "examples.custom_model:factory")
    assert task.input_shape == [3, 6, 5] and len(task.mean) == 3
    assert task.model == "examples.custom_model:factory"
    assert summary["modes"] == {"L": 2, "RGB": 2}


def test_infer_task_on_csv_clients_and_one_npz_client(tmp_path):
    xa, rows_a = table_rows(["a", "b", "a"], seed=1)
    xb, rows_b = table_rows(["c", "c"], seed=2)
    write_csv(tmp_path / "csv" / "one.csv", ["f1", "f2", "f3", "label"], rows_a)
    write_csv(tmp_path / "csv" / "two.csv", ["f1", "f2", "f3", "label"], rows_b)
    (tmp_path / "csv" / "README.md").write_text("not a client")
    task, summary = infer_task(tmp_path / "csv")
    assert task.kind == "tabular" and task.features == 3 and task.model == "mlp"
    assert task.classes == ["a", "b", "c"] and len(summary["clients"]) == 2
    both = np.concatenate([xa, xb]).astype(np.float64)
    assert np.allclose(task.mean, both.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert np.allclose(task.std, both.std(axis=0), rtol=1e-5)
    np.savez(tmp_path / "one.npz", x=pixels(4, (6, 5, 3)), y=np.array([1, 2, 1, 2]))
    task, summary = infer_task(tmp_path / "one.npz")
    assert task.classes == ["1", "2"] and task.input_shape == [3, 6, 5]
    assert len(summary["clients"]) == 1


def test_infer_task_refuses_mixed_kinds_and_a_single_class(tmp_path):
    write_classes(tmp_path / "mixed" / "a", {"cat": 1, "dog": 1})
    write_csv(tmp_path / "mixed" / "b.csv", ["f", "label"], [[1, "cat"]])
    refused("holds images|table rows", infer_task, tmp_path / "mixed")
    write_classes(tmp_path / "one", {"cat": 2})
    refused("at least 2", infer_task, tmp_path / "one")
