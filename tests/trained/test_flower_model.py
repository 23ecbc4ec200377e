"""``flwr run``'s ServerApp on own data leaves the model in its run folder: the real ClientApps
(in this process, on a grid double) train per-client digit folders, and ``fedcure model
evaluate`` and a script doing only ``torch.export.load(model.pt2)`` agree on a test folder no
client held; the run config's ``init-model`` starts a run from that model, and refuses a file
of another model in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedcure_app.cli import main
from fedcure_app.config import ConfigError
from fedcure_app.flower.run import full_run_config
from fedcure_app.flower.server_app import run_simulation_role
from tests.simulation.fake_grid import task_identity
from tests.simulation.test_flower_executor import clientapp_grid
from tests.trained.test_model_files import CLASSES, PLAIN, TASK, digit_folders


def run_config(tmp_path, **extra) -> dict:
    return full_run_config({"task": str(tmp_path / "task.toml"),
                            "clients-data": str(tmp_path / "clients"), "num-edges": 2,
                            "global-rounds": 4, "tau-e": 2, "tau-c": 5, "lr": 0.1,
                            "eval-every": 2, "run-folders": True, **extra})


@pytest.fixture(scope="module")
def flwr_run(tmp_path_factory):
    """One finished ``flwr run`` on three digit folders: (folder, its run folder, result)."""
    tmp_path = tmp_path_factory.mktemp("flwr-model")
    digit_folders(tmp_path / "clients", {f"site-{c}": slice(25 * c, 25 * (c + 1))
                                         for c in range(3)})
    digit_folders(tmp_path, {"test": slice(100, 125)})
    (tmp_path / "task.toml").write_text(TASK)
    out = tmp_path / "flwr"
    rc = run_config(tmp_path, **{"out-dir": str(out)})
    with task_identity():
        result = run_simulation_role(clientapp_grid(rc, 3), rc, run_id=7)
    return tmp_path, out / (out / "latest").read_text().strip(), result


def test_the_flower_apps_run_folder_holds_the_model_plain_pytorch_runs(flwr_run, capsys):
    tmp_path, run, result = flwr_run
    assert run == tmp_path / "flwr" / "7"
    assert list(result["class_accuracy_by_name"]) == list(CLASSES)
    assert json.loads((run / "model.json").read_text())["produced_by"] == "flwr run"
    capsys.readouterr()
    assert main(["model", "evaluate", str(run), "--data", str(tmp_path / "test"),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    plain = subprocess.run([sys.executable, "-c", PLAIN, str(run), str(tmp_path / "test"),
                            json.dumps(CLASSES)], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert abs(float(plain.stdout.strip()) - 100 * got["accuracy"]) < 0.1
    assert got["samples"] == 100 and got["accuracy"] > 0.4  # it learnt something (4 classes)


def test_init_model_starts_a_flower_run_from_the_finished_runs_model(flwr_run):
    tmp_path, run, first = flwr_run
    rc = run_config(tmp_path, **{"out-dir": str(tmp_path / "again"),
                                 "init-model": str(run / "model.pt"), "global-rounds": 2})
    with task_identity():
        result = run_simulation_role(clientapp_grid(rc, 3), rc, run_id=8)
    # the same held-out parts (the same seed): the start is the first run's final model
    assert result["initial_accuracy"] == pytest.approx(first["final_accuracy"], abs=1e-6)
    assert first["initial_accuracy"] < first["final_accuracy"]


def test_init_model_of_another_model_is_refused_in_one_line(flwr_run):
    tmp_path, run, _ = flwr_run
    other = tmp_path / "other.toml"
    other.write_text(TASK.replace("[1, 8, 8]", "[1, 12, 12]"))
    rc = run_config(tmp_path, **{"out-dir": str(tmp_path / "other"), "task": str(other),
                                 "init-model": str(run / "model.pt")})
    with pytest.raises(ConfigError, match=r"^init-model: .*shape") as info:
        with task_identity():
            run_simulation_role(clientapp_grid(rc, 3), rc, run_id=9)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^init-model: .*no such file"):
        rc["init-model"] = str(tmp_path / "missing.pt")
        with task_identity():
            run_simulation_role(clientapp_grid(rc, 3), rc, run_id=10)


def test_the_server_apps_entry_point_is_main():
    """``flwr run`` calls ``app``'s registered function with (grid, context): it must be
    ``main`` (a helper defined between the decorator and ``main`` once took its place)."""
    from fedcure_app.flower import server_app

    assert server_app.app._main is server_app.main
