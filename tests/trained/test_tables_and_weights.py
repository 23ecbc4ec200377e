"""A tabular task's model: predictions per CSV row (label column or not), evaluation on a CSV;
and the weight files ``--init-model`` takes, each checked against the task's model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcure_app.cli import main
from fedcure_app.models import build_task_model, get_weights
from fedcure_app.protocol.codec import encode_arrays
from fedcure_app.trained.files import ModelFileError, load_weights, write_model_files
from tests.data.own_builders import table_rows, table_task, write_csv


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    base = tmp_path_factory.mktemp("tables")
    task = table_task(mean=[1.0, 0.0, -1.0], std=[2.0, 1.0, 0.5])
    torch.manual_seed(0)
    arrays = get_weights(build_task_model(task))
    write_model_files(base / "R", arrays, task, {"produced_by": "test"})
    labels = ["a", "b", "c", "a", "b"]
    x, rows = table_rows(labels)
    write_csv(base / "rows.csv", ["f0", "f1", "f2", "label"], rows)
    write_csv(base / "bare.csv", ["f0", "f1", "f2"], [r[:3] for r in rows])
    return base, task, arrays, x, labels


def test_predict_gives_one_line_per_row_with_or_without_the_label_column(tables, capsys):
    base, task, arrays, x, _ = tables
    model = build_task_model(task)
    model.load_state_dict(torch.load(base / "R" / "model.pt", weights_only=True))
    mean, std = torch.tensor(task.mean_values), torch.tensor(task.std_values)
    want = torch.softmax(model((torch.from_numpy(x) - mean) / std), 1).argmax(1).tolist()
    for name in ("rows.csv", "bare.csv"):
        capsys.readouterr()
        assert main(["model", "predict", str(base / "R"), str(base / name), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert [g["input"] for g in got] == [f"{base / name}:{i}" for i in range(1, 6)]
        assert [task.classes.index(g["top"][0]["class"]) for g in got] == want


def test_predict_on_a_folder_takes_every_csv_in_it(tables, tmp_path, capsys):
    import shutil

    base = tables[0]
    for name in ("rows.csv", "bare.csv"):
        shutil.copy(base / name, tmp_path / name)
    (tmp_path / "readme.txt").write_text("left out")
    capsys.readouterr()
    assert main(["model", "predict", str(base / "R"), str(tmp_path), "--json"]) == 0
    got = [g["input"] for g in json.loads(capsys.readouterr().out)]
    assert got == [f"{tmp_path / n}:{i}" for n in ("bare.csv", "rows.csv") for i in range(1, 6)]


def test_evaluate_scores_every_row_of_a_csv(tables, capsys):
    base, _, _, _, labels = tables
    capsys.readouterr()
    assert main(["model", "evaluate", str(base / "R"), "--data", str(base / "rows.csv"),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["samples"] == 5
    assert [c["support"] for c in got["classes"]] == [labels.count(c) for c in ("a", "b", "c")]


def test_a_csv_of_another_width_is_refused_naming_it(tables, tmp_path, capsys):
    base = tables[0]
    write_csv(tmp_path / "wide.csv", ["f0", "f1", "f2", "f3"], [[0, 1, 2, 3]])
    capsys.readouterr()
    assert main(["model", "predict", str(base / "R"), str(tmp_path / "wide.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{tmp_path / 'wide.csv'}: 4 feature columns" in err


def test_every_weight_file_kind_loads_the_same_weights(tables, tmp_path):
    from safetensors.torch import save_file

    base, task, arrays, _, _ = tables
    (tmp_path / "cloud.safetensors").write_bytes(encode_arrays(arrays))  # tensors 0000, 0001…
    save_file(build_task_model(task).state_dict(), str(tmp_path / "named.safetensors"))
    for path in (base / "R" / "model.pt", base / "R" / "model.pt2",
                 tmp_path / "cloud.safetensors"):
        got = load_weights(path, task)
        assert all(np.array_equal(a, b) for a, b in zip(got, arrays)), path
    assert len(load_weights(tmp_path / "named.safetensors", task)) == len(arrays)


def test_weights_of_another_model_name_the_first_tensor_that_differs(tables, tmp_path):
    base, task, _, _, _ = tables
    wider = table_task(features=4)
    with pytest.raises(ModelFileError, match=r"tensor '1.weight' has shape \[64, 3\]"):
        load_weights(base / "R" / "model.pt", wider)
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="cannot read it"):
        load_weights(tmp_path / "junk.pt", task)
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(ModelFileError, match="not a .pt, .pt2, .safetensors file"):
        load_weights(tmp_path / "m.onnx", task)
