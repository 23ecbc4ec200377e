"""``fedcure task init``: a task file from the clients' own data, what it prints, and its
refusals (one line, exit code 2); and the example generators it is documented with."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fedcure_app.cli import main
from fedcure_app.data.own import infer_task, read_client_data
from fedcure_app.data.task import load_task
from tests.data.own_builders import table_rows, write_classes, write_csv

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_task_init_on_client_folders_writes_the_inferred_task_and_prints_it(tmp_path, capsys):
    write_classes(tmp_path / "data" / "c0", {"dog": 2, "zebra": 2})
    write_classes(tmp_path / "data" / "c1", {"cat": 3, "dog": 1}, seed=4)
    out = tmp_path / "conf" / "task.toml"
    assert main(["task", "init", str(tmp_path / "data"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "found 2 clients" in text and "classes (3): cat, dog, zebra" in text
    assert "[1, 6, 5]" in text and f"wrote {out}" in text
    assert load_task(out) == infer_task(tmp_path / "data")[0]


def test_task_init_on_csv_clients_with_a_label_column_and_model(tmp_path, capsys):
    for i, labels in enumerate((["x", "y"], ["y", "z", "z"])):
        _, rows = table_rows(labels, features=2, seed=i)
        write_csv(tmp_path / "data" / f"c{i}.csv", ["f1", "f2", "kind"], rows)
    out = tmp_path / "task.toml"
    code = main(["task", "init", str(tmp_path / "data"), "--out", str(out), "--label-column",
                 "kind", "--model", "examples.custom_model:factory"])
    assert code == 0 and "features: 2" in capsys.readouterr().out
    task = load_task(out)
    assert task.kind == "tabular" and task.classes == ["x", "y", "z"] and task.features == 2
    assert task.model == "examples.custom_model:factory"


def test_task_init_keeps_an_existing_file_unless_forced(tmp_path, capsys):
    write_classes(tmp_path / "data", {"a": 1, "b": 1})
    out = tmp_path / "task.toml"
    out.write_text("mine")
    assert main(["task", "init", str(tmp_path / "data"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--force" in err and out.read_text() == "mine"
    assert main(["task", "init", str(tmp_path / "data"), "--out", str(out), "--force"]) == 0
    assert load_task(out).classes == ["a", "b"]


@pytest.mark.parametrize("case", ["missing", "empty", "bad-model"])
def test_task_init_errors_are_one_line_with_exit_2(tmp_path, capsys, case):
    (tmp_path / "empty").mkdir()
    write_classes(tmp_path / "data", {"a": 1, "b": 1})
    argv = {"missing": [str(tmp_path / "nowhere")], "empty": [str(tmp_path / "empty")],
            "bad-model": [str(tmp_path / "data"), "--model", "not a model"]}[case]
    out = tmp_path / "task.toml"
    assert main(["task", "init", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("fedcure task: error:")
    assert not out.exists()


def test_digits_folders_example_gives_label_skewed_clients_of_the_asked_size(tmp_path):
    folders = _example("digits_folders").write(tmp_path / "d", clients=4, classes_per_client=3,
                                               size=12, seed=1, test_fraction=0.2)
    assert [f.name for f in folders] == [f"client-0{i}" for i in range(4)]
    task, summary = infer_task(tmp_path / "d")
    assert task.input_shape == [1, 12, 12] and len(task.classes) == 10
    assert all(len(c["classes"]) == 3 and c["test"] > 0 for c in summary["clients"])
    data = read_client_data(folders[0], task)
    assert data.x_train.dtype == np.uint8 and len(np.unique(data.y_train)) == 3


def test_wine_csv_example_splits_every_row_once_with_class_names(tmp_path):
    files = _example("wine_csv").write(tmp_path / "w", clients=3, seed=2, alpha=0.5)
    task, summary = infer_task(tmp_path / "w")
    assert task.classes == ["class_0", "class_1", "class_2"] and task.features == 13
    assert sum(c["train"] for c in summary["clients"]) == 178  # every row, once
    assert all(c["train"] >= 10 for c in summary["clients"])
    assert len(files) == 3


def test_custom_model_factory_builds_for_images_and_tables():
    import torch

    from examples.custom_model import factory

    for shape in ((1, 12, 12), (3, 5, 7), (13,)):
        model = factory(shape, 4)
        assert model(torch.zeros(2, *shape)).shape == (2, 4)
        assert not any(isinstance(m, (torch.nn.Dropout, torch.nn.BatchNorm2d))
                       for m in model.modules())
