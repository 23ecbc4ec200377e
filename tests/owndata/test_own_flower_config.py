"""Flower's run config names a task (a task file, or its JSON inline) and the clients' data
folder: the configuration then runs that task with one client per entry, and the run config
that ``fedcure simulate --executor flower`` hands Flower carries the task back unchanged."""

from __future__ import annotations

import numpy as np

from fedcure_app.data.task import parse_task, task_toml
from fedcure_app.flower.app_config import (
    client_fingerprint,
    config_from_run_config,
    run_config_from_config,
)

TASK = parse_task({"classes": ["lo", "hi"], "kind": "tabular", "features": 2})


def write_clients(root, n=3):
    root.mkdir()
    for i in range(n):
        rows = "\n".join(f"{j},{j * i},{'lo' if j % 2 else 'hi'}" for j in range(10))
        (root / f"site-{i}.csv").write_text("a,b,label\n" + rows + "\n")


def test_a_task_file_and_a_clients_folder_set_the_classes_and_the_clients(tmp_path):
    (tmp_path / "task.toml").write_text(task_toml(TASK))
    write_clients(tmp_path / "clients")
    cfg = config_from_run_config({"task": str(tmp_path / "task.toml"),
                                  "clients-data": str(tmp_path / "clients"),
                                  "num-clients": 10, "num-edges": 2})
    assert cfg.task == TASK
    assert cfg.federation.num_clients == 3 and cfg.federation.num_classes == 2
    assert cfg.federation.num_edges == 2


def test_the_task_travels_inline_and_changes_the_client_fingerprint(tmp_path):
    (tmp_path / "task.toml").write_text(task_toml(TASK))
    write_clients(tmp_path / "clients")
    cfg = config_from_run_config({"task": str(tmp_path / "task.toml"),
                                  "clients-data": str(tmp_path / "clients"),
                                  "num-edges": 2})
    rc = run_config_from_config(cfg)
    assert rc["task"].startswith("{")
    again = config_from_run_config(rc)
    assert again.task == cfg.task and again.data.clients_data == cfg.data.clients_data
    other = config_from_run_config({**rc, "holdout": 0.3})
    assert client_fingerprint(other) != client_fingerprint(cfg)


def test_an_empty_task_keeps_the_built_in_dataset():
    cfg = config_from_run_config({"task": "", "clients-data": "", "dataset": "digits"})
    assert cfg.task is None and cfg.data.dataset == "digits"
    assert np.isclose(cfg.data.holdout, 0.1)
