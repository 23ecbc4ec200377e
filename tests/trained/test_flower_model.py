"""``flwr run``'s ServerApp on own data leaves the model in its run folder: the real ClientApps
(in this process, on a grid double) train per-client digit folders, and ``fedcure model
evaluate`` and a script doing only ``torch.export.load(model.pt2)`` agree on a test folder no
client held."""

from __future__ import annotations

import json
import subprocess
import sys

from fedcure_app.cli import main
from fedcure_app.flower.run import full_run_config
from fedcure_app.flower.server_app import run_simulation_role
from tests.simulation.fake_grid import task_identity
from tests.simulation.test_flower_executor import clientapp_grid
from tests.trained.test_model_files import CLASSES, PLAIN, TASK, digit_folders


def test_the_flower_apps_run_folder_holds_the_model_plain_pytorch_runs(tmp_path, capsys):
    digit_folders(tmp_path / "clients", {f"site-{c}": slice(25 * c, 25 * (c + 1))
                                         for c in range(3)})
    digit_folders(tmp_path, {"test": slice(100, 125)})
    (tmp_path / "task.toml").write_text(TASK)
    out = tmp_path / "flwr"
    rc = full_run_config({"task": str(tmp_path / "task.toml"),
                          "clients-data": str(tmp_path / "clients"), "num-edges": 2,
                          "global-rounds": 4, "tau-e": 2, "tau-c": 5, "lr": 0.1,
                          "eval-every": 2, "out-dir": str(out), "run-folders": True})
    with task_identity():
        result = run_simulation_role(clientapp_grid(rc, 3), rc, run_id=7)
    run = out / (out / "latest").read_text().strip()
    assert run == out / "7"
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
