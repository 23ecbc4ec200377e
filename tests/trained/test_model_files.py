"""The trained model in the user's hands: a finished ``fedcure simulate`` leaves ``model.pt``,
``model.pt2`` and ``task.toml``; plain PyTorch runs ``model.pt2`` without FedCure and finds the
accuracy ``fedcure model evaluate`` reports; ``predict``, ``export`` and ``info`` work on it;
each wrong input is one line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcure_app.cli import main
from fedcure_app.data.task import load_task
from fedcure_app.models import build_task_model

CLASSES = ("zero", "one", "two", "three")
TASK = ('[task]\nkind = "image"\nclasses = ["zero", "one", "two", "three"]\n'
        'input-shape = [1, 8, 8]\nmean = [0.3]\nstd = [0.37]\n')
#: a script that knows nothing of FedCure: torch.export.load, the pixels / 255, argmax
PLAIN = textwrap.dedent('''
    import json, sys
    sys.modules["fedcure_app"] = None  # importing FedCure would fail here
    from pathlib import Path
    import numpy as np, torch
    from PIL import Image
    run, test, classes = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    model = torch.export.load(str(run / "model.pt2")).module()
    xs, ys = [], []
    for k, name in enumerate(classes):
        for f in sorted((test / name).glob("*.png")):
            xs.append(np.asarray(Image.open(f), dtype=np.float32)[None] / 255)
            ys.append(k)
    with torch.no_grad():
        pred = model(torch.from_numpy(np.stack(xs))).argmax(1).numpy()
    print(100 * float((pred == np.array(ys)).mean()))
''')


def digit_folders(root: Path, picks: dict[str, slice]) -> None:
    """``root/<name>/<class>/<i>.png``: scikit-learn digits 0-3 as 8×8 PNGs, each folder
    its own slice of every digit's images (the test folder's unseen by any client)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for name, rows in picks.items():
        for k, cls in enumerate(CLASSES):
            folder = root / name / cls
            folder.mkdir(parents=True)
            for i in np.flatnonzero(d.target == k)[rows]:
                Image.fromarray((d.images[i] * 255 / 16).astype(np.uint8)).save(
                    folder / f"{i}.png")


def simulate(*extra: str) -> int:
    return main(["simulate", "--edges", "2", "--rounds", "4", "--tau-e", "2", "--tau-c", "5",
                 "--lr", "0.1", "--workers", "1", "--no-progress", *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("trained")
    digit_folders(base / "clients", {f"site-{c}": slice(25 * c, 25 * (c + 1)) for c in range(3)})
    digit_folders(base, {"test": slice(100, 125)})
    (base / "task.toml").write_text(TASK)
    code = simulate("--task", str(base / "task.toml"), "--clients-data", str(base / "clients"),
                    "--out", str(base / "R"))
    assert code == 0
    return base


def report(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_plain_pytorch_finds_the_accuracy_fedcure_model_evaluate_reports(run, capsys):
    got = report(capsys, "model", "evaluate", str(run / "R"), "--data", str(run / "test"),
                 "--json")
    plain = subprocess.run([sys.executable, "-c", PLAIN, str(run / "R"), str(run / "test"),
                            json.dumps(CLASSES)], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert abs(float(plain.stdout.strip()) - 100 * got["accuracy"]) < 0.1
    assert got["samples"] == 100 and got["accuracy"] > 0.5  # it learnt something
    assert [c["name"] for c in got["classes"]] == list(CLASSES)
    assert [c["support"] for c in got["classes"]] == [25] * 4
    assert np.asarray(got["confusion"]).sum() == 100


def test_model_pt_is_a_state_dict_of_the_tasks_model_loaded_with_weights_only(run):
    state = torch.load(run / "R" / "model.pt", weights_only=True)
    model = build_task_model(load_task(run / "R" / "task.toml"))
    assert list(state) == list(model.state_dict())  # the model's own tensor names
    model.load_state_dict(state)
    program = torch.export.load(str(run / "R" / "model.pt2")).module()
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(program(x), model((x - 0.3) / 0.37))


def test_the_result_names_each_class_and_the_model_file_says_what_produced_it(run):
    result = json.loads((run / "R" / "result.json").read_text())
    assert list(result["class_accuracy_by_name"]) == list(CLASSES)
    info = json.loads((run / "R" / "model.json").read_text())
    assert info["produced_by"] == "fedcure simulate" and info["rounds"] == 4


def test_predict_prints_a_class_name_per_image(run, capsys):
    files = sorted((run / "test" / "two").glob("*.png"))[:3]
    capsys.readouterr()
    assert main(["model", "predict", str(run / "R"), *map(str, files), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for f, line in zip(files, lines):
        name, _, rest = line.partition(": ")
        assert name == str(f)
        top = [part.rsplit(" ", 1) for part in rest.split(", ")]
        assert len(top) == 2 and all(c in CLASSES for c, _ in top)
        assert float(top[0][1]) >= float(top[1][1])


def test_info_names_the_task_and_the_runs_accuracy(run, capsys):
    got = report(capsys, "model", "info", str(run / "R"), "--json")
    result = json.loads((run / "R" / "result.json").read_text())
    assert got["classes"] == list(CLASSES) and got["input"].startswith("float32 N×1×8×8")
    assert got["final_accuracy"] == result["final_accuracy"]
    assert got["produced_by"] == "fedcure simulate"
    assert got["parameters"] == sum(p.numel() for p in build_task_model(
        load_task(run / "R" / "task.toml")).parameters())


def test_a_torchscript_export_gives_the_programs_logits(run, tmp_path, capsys):
    out = tmp_path / "m.ts"
    assert main(["model", "export", str(run / "R"), "--format", "torchscript", "--out",
                 str(out)]) == 0
    x = torch.rand(4, 1, 8, 8)
    program = torch.export.load(str(run / "R" / "model.pt2")).module()
    torch.testing.assert_close(torch.jit.load(str(out))(x), program(x))


def test_an_onnx_export_gives_the_programs_logits_and_says_one_line(run, tmp_path, capfd):
    """With the onnx extra (``pip install 'fedcure[onnx]'``); onnx's reference evaluator runs
    the file. The exporter's progress lines and warnings are not shown."""
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    out = tmp_path / "m.onnx"
    capfd.readouterr()
    assert main(["model", "export", str(run / "R"), "--format", "onnx", "--out",
                 str(out)]) == 0
    said = capfd.readouterr()
    assert said.out.startswith(f"wrote {out} (onnx") and len(said.out.splitlines()) == 1
    assert said.err == ""
    x = torch.rand(4, 1, 8, 8)
    got = ReferenceEvaluator(onnx.load(str(out))).run(None, {"x": x.numpy()})[0]
    program = torch.export.load(str(run / "R" / "model.pt2")).module()
    np.testing.assert_allclose(got, program(x).detach().numpy(), atol=1e-5)


def one_line_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_folder_without_a_model_is_one_line(run, tmp_path, capsys):
    err = one_line_error(capsys, ["model", "info", str(tmp_path)])
    assert f"{tmp_path}: no model.pt" in err


def test_a_flwr_run_out_dir_is_refused_naming_its_latest_run_folder(run, tmp_path, capsys):
    import shutil

    shutil.copytree(run / "R", tmp_path / "123")
    (tmp_path / "latest").write_text("123\n")  # flwr run's out-dir: one folder per run
    err = one_line_error(capsys, ["model", "evaluate", str(tmp_path), "--data",
                                  str(run / "test")])
    assert f"{tmp_path}: no model.pt" in err and f"the latest is {tmp_path / '123'}" in err


def test_data_with_a_class_the_task_lacks_is_refused_naming_the_folder(run, tmp_path, capsys):
    digit_folders(tmp_path, {"odd": slice(0, 2)})
    (tmp_path / "odd" / "three").rename(tmp_path / "odd" / "four")
    err = one_line_error(capsys, ["model", "evaluate", str(run / "R"), "--data",
                                  str(tmp_path / "odd")])
    assert "class 'four' is not in the task's classes" in err
    assert str(tmp_path / "odd" / "four") in err


def test_predict_on_a_folder_predicts_every_image_in_it_in_chunks(run, tmp_path, capsys,
                                                                   monkeypatch):
    import shutil

    from fedcure_app.trained import use

    folder = tmp_path / "test"
    shutil.copytree(run / "test", folder)
    files = sorted(folder.rglob("*.png"))
    capsys.readouterr()
    assert main(["model", "predict", str(run / "R"), *map(str, files), "--json"]) == 0
    one_by_one = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(use, "PREDICT_CHUNK", 7)  # several chunks, the last one short
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "x.png").write_bytes(b"not an image")  # left out
    (folder / "notes.txt").write_text("left out")
    assert main(["model", "predict", str(run / "R"), str(folder), "--json"]) == 0
    from_folder = json.loads(capsys.readouterr().out)
    assert [r["input"] for r in from_folder] == [str(f) for f in files]
    for a, b in zip(one_by_one, from_folder):
        assert a["top"][0]["class"] == b["top"][0]["class"]
        assert abs(a["top"][0]["probability"] - b["top"][0]["probability"]) < 1e-5
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "a.txt").write_text("no image")
    err = one_line_error(capsys, ["model", "predict", str(run / "R"), str(tmp_path / "empty")])
    assert f"{tmp_path / 'empty'}: a folder with no png/jpg/jpeg files in it" in err
    err = one_line_error(capsys, ["model", "predict", str(run / "R"), str(files[0]),
                                  str(tmp_path / "gone.png")])
    assert f"{tmp_path / 'gone.png'}: no such file" in err


def test_images_of_another_size_are_refused_naming_the_file(run, tmp_path, capsys):
    from PIL import Image

    (tmp_path / "big" / "one").mkdir(parents=True)
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(tmp_path / "big" / "one" / "a.png")
    err = one_line_error(capsys, ["model", "evaluate", str(run / "R"), "--data",
                                  str(tmp_path / "big")])
    assert str(tmp_path / "big" / "one" / "a.png") in err
    err = one_line_error(capsys, ["model", "predict", str(run / "R"),
                                  str(tmp_path / "big" / "one" / "a.png")])
    assert str(tmp_path / "big" / "one" / "a.png") in err


def test_a_model_file_that_does_not_match_the_task_is_one_line(run, tmp_path, capsys):
    import shutil

    folder = tmp_path / "R"
    shutil.copytree(run / "R", folder)
    (folder / "task.toml").write_text(TASK.replace('"three"]', '"three", "four"]'))
    err = one_line_error(capsys, ["model", "evaluate", str(folder), "--data",
                                  str(run / "test")])
    assert "model.pt: tensor" in err and "5 classes" in err


def test_onnx_without_its_extra_is_one_line(run, tmp_path, capsys, monkeypatch):
    import importlib.util

    find = importlib.util.find_spec  # the extra hidden, whether installed here or not
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxscript" else find(name, *a))
    err = one_line_error(capsys, ["model", "export", str(run / "R"), "--format", "onnx",
                                  "--out", str(tmp_path / "m.onnx")])
    assert "pip install 'fedcure[onnx]'" in err and not (tmp_path / "m.onnx").exists()


def test_a_central_test_set_and_a_start_model(run, tmp_path, capsys):
    """--test-data: evaluated there, the clients train on all they hold; --init-model: the
    run starts from the given model (its initial accuracy is that model's)."""
    out = tmp_path / "R2"
    assert simulate("--task", str(run / "task.toml"), "--clients-data", str(run / "clients"),
                    "--test-data", str(run / "test"), "--init-model",
                    str(run / "R" / "model.pt2"), "--out", str(out)) == 0
    images = sum(1 for f in (run / "test").rglob("*") if f.is_file())
    assert f"{images} test samples" in " ".join(capsys.readouterr().err.split())
    result = json.loads((out / "result.json").read_text())
    assert result["evaluation"] == "central" and result["config"]["data"]["holdout"] == 0.0
    before = report(capsys, "model", "evaluate", str(run / "R"), "--data", str(run / "test"),
                    "--json")
    assert abs(result["initial_accuracy"] - before["accuracy"]) < 1e-3
    assert (out / "model.pt2").is_file()


def test_a_start_model_of_another_task_is_refused_before_the_run(run, tmp_path, capsys):
    other = tmp_path / "other.toml"
    other.write_text(TASK.replace("[1, 8, 8]", "[1, 12, 12]"))
    err = one_line_error(capsys, ["simulate", "--task", str(other), "--clients-data",
                                  str(run / "clients"), "--init-model",
                                  str(run / "R" / "model.pt"), "--out", str(tmp_path / "x")])
    assert err.startswith("fedcure simulate: error: --init-model:") and "shape" in err
    assert not (tmp_path / "x").exists()
