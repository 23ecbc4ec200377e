"""The cloud's side of the trained model: it writes the run folder's model files before
``result.json``, evaluates on a central test set (``N test samples``, per class) and tells the
clients to train on all their data, starts from a start model of its task and refuses one of
another task in one line; ``fedcure launch`` hands it both flags as absolute paths."""

from __future__ import annotations

import argparse
import json
import logging

import numpy as np
import pytest
import torch

from cloud_server.cli import build_parser, main, make_config, make_evaluator
from cloud_server.results import ResultsWriter
from fedcure_app.config import FedCureConfig
from fedcure_app.models import build_model, get_weights
from tests.trained.test_model_files import TASK, digit_folders


def cloud_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["--listen", "127.0.0.1:0", "--expected-clients", "2",
                                      "--edges", "1", "--insecure", *extra])


def test_the_cloud_writes_the_model_files_with_the_result(tmp_path):
    arrays = get_weights(build_model("digits"))
    result = {"rounds": 3, "final_accuracy": 0.5, "evaluation": "central",
              "config": FedCureConfig().model_dump(mode="json", by_alias=True)}
    ResultsWriter(FedCureConfig(), tmp_path, write_plots=False).write(result, None, arrays)
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert list(state) == list(build_model("digits").state_dict())
    assert all(np.array_equal(t.numpy(), a) for t, a in zip(state.values(), arrays))
    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    assert program(torch.rand(2, 1, 8, 8)).shape == (2, 10)
    assert json.loads((tmp_path / "model.json").read_text())["produced_by"] == "fedcure-cloud"
    assert 'model = "digits"' in (tmp_path / "task.toml").read_text()


def test_a_central_test_set_is_counted_as_test_samples_and_scored_per_class(tmp_path, caplog):
    digit_folders(tmp_path, {"test": slice(0, 5)})
    (tmp_path / "task.toml").write_text(TASK)
    cfg, named = make_config(cloud_args("--task", str(tmp_path / "task.toml"), "--test-data",
                                        str(tmp_path / "test")))
    assert named and cfg.data.holdout == 0.0  # the clients, handed cfg, train on all they hold
    with caplog.at_level(logging.INFO):
        evaluator, classes = make_evaluator(cfg, str(tmp_path / "test"))
    assert "20 test samples" in caplog.text and "training" not in caplog.text
    acc, loss, per_class = evaluator(get_weights(build_model(cfg.task)))
    assert classes == 4 and len(per_class) == 4 and 0.0 <= acc <= 1.0


def test_a_holdout_the_user_set_is_kept_with_a_central_test_set(tmp_path):
    digit_folders(tmp_path, {"test": slice(0, 2)})
    (tmp_path / "task.toml").write_text(TASK)
    (tmp_path / "run.toml").write_text("[data]\nholdout = 0.2\n")
    cfg, _ = make_config(cloud_args("--config", str(tmp_path / "run.toml"), "--task",
                                    str(tmp_path / "task.toml"), "--test-data",
                                    str(tmp_path / "test")))
    assert cfg.data.holdout == 0.2


def test_a_start_model_of_another_task_is_one_line(tmp_path, capsys):
    torch.save(build_model("mnist").state_dict(), tmp_path / "model.pt")
    code = main(["--listen", "127.0.0.1:0", "--expected-clients", "2", "--edges", "1",
                 "--insecure", "--dataset", "digits", "--no-eval", "--out",
                 str(tmp_path / "out"), "--init-model", str(tmp_path / "model.pt")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("fedcure-cloud: error: --init-model:") and "shape" in err
    assert not (tmp_path / "out").exists()


def test_the_cloud_starts_from_the_weights_of_a_start_model_of_its_task(tmp_path):
    from cloud_server.cli import init_weights

    model = build_model("digits")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    cfg, _ = make_config(cloud_args("--dataset", "digits"))
    got = init_weights(cloud_args("--init-model", str(tmp_path / "model.pt")), cfg)
    assert all(np.array_equal(a, b) for a, b in zip(got, get_weights(model)))
    assert init_weights(cloud_args(), cfg) is None


def launch_args(tmp_path, *extra: str) -> list[str]:
    digit_folders(tmp_path / "clients", {f"site-{c}": slice(2 * c, 2 * c + 2) for c in range(2)})
    (tmp_path / "task.toml").write_text(TASK)
    return ["launch", "--task", "task.toml", "--clients-data", "clients", "--edges", "1",
            "--no-dashboard", "--no-progress", *extra]


def test_launch_hands_its_cloud_the_test_set_and_the_start_model_as_absolute_paths(
        tmp_path, monkeypatch):
    from fedcure_app.cli import build_parser, launch
    from fedcure_app.data.task import load_task
    from fedcure_app.models import build_task_model
    from tests.launch_children import record_children

    monkeypatch.chdir(tmp_path)
    argv = launch_args(tmp_path, "--test-data", "clients/site-0", "--init-model", "model.pt")
    torch.save(build_task_model(load_task(tmp_path / "task.toml")).state_dict(),
               tmp_path / "model.pt")
    started = record_children(monkeypatch)
    args = build_parser().parse_args(argv)
    cfg = launch.config_from_args(args)
    launch.check_inputs(args, cfg)
    launch.start_roles(cfg, args, tmp_path / "out", launch.Roles())
    cloud = next(c.argv for c in started if c.name == "cloud")
    assert cloud[cloud.index("--test-data") + 1] == str(tmp_path / "clients" / "site-0")
    assert cloud[cloud.index("--init-model") + 1] == str(tmp_path / "model.pt")


def test_launch_refuses_a_start_model_of_another_task_before_it_starts_anything(
        tmp_path, monkeypatch, capsys):
    from fedcure_app.cli import main as fedcure
    from tests.launch_children import record_children

    monkeypatch.chdir(tmp_path)
    argv = launch_args(tmp_path, "--init-model", "model.pt", "--out", "out")
    torch.save(build_model("mnist").state_dict(), tmp_path / "model.pt")
    started = record_children(monkeypatch)
    assert fedcure(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fedcure launch: error: --init-model:") and "shape" in err[-1]
    assert started == [] and not (tmp_path / "out").exists()
