"""``fedcure experiment peers --task … --clients-data … --edges M``: the own-data setting runs
with M edge servers (not the budget's), and without ``--edges`` with the budget's at most the
clients."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedcure_app.cli import main
from fedcure_app.cli.experiment_peers import _settings
from tests.data.own_builders import write_classes


def _args(task: Path, clients: Path, edges: int | None) -> argparse.Namespace:
    return argparse.Namespace(task=str(task), clients_data=str(clients), edges=edges,
                              budget="quick", seeds=1, executor=None, dataset="digits",
                              data_dir=None, clients=None)


@pytest.fixture
def own(tmp_path: Path) -> tuple[Path, Path]:
    clients = tmp_path / "clients"
    for i in range(4):
        write_classes(clients / f"client-{i}", {"a": 3, "b": 3, "c": 3}, seed=i)
    task = tmp_path / "task.toml"
    assert main(["task", "init", str(clients), "--out", str(task)]) == 0
    return task, clients


@pytest.mark.parametrize("edges", [1, 2, 3])
def test_own_setting_runs_with_the_edges_asked_for(own, edges):
    task, clients = own
    [(name, _, cfg, _)] = _settings(_args(task, clients, edges))
    assert name == "own"
    assert (cfg.federation.num_clients, cfg.federation.num_edges) == (4, edges)


def test_own_setting_without_edges_keeps_the_budgets_at_most_the_clients(own):
    task, clients = own
    [(_, _, cfg, _)] = _settings(_args(task, clients, None))
    assert (cfg.federation.num_clients, cfg.federation.num_edges) == (4, 4)  # quick: 5 edges
