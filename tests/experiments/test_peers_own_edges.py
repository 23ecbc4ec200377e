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


def test_each_seed_of_the_own_setting_holds_out_its_own_split(own, monkeypatch):
    """The runs of seed S read the folders with seed S, as ``fedcure simulate --seed S`` does
    (not seed 0's held-out split for every seed), and their cache keys say so."""
    import numpy as np

    import fedcure_app.simulation.engine as engine
    from fedcure_app.config import apply_flat
    from fedcure_app.data.own_federation import load_federation_data
    from fedcure_app.experiments.runner import Runner, RunSpec

    task, clients = own
    [(_, dataset, cfg, _)] = _settings(_args(task, clients, 2))
    seen: dict[int, object] = {}

    def recorded(run_cfg, dataset, **_kw):
        seen[run_cfg.run.seed] = dataset
        return {}

    monkeypatch.setattr(engine, "simulate", recorded)
    runner = Runner(dataset)
    specs = [RunSpec(f"seed {s}", apply_flat(cfg, {"seed": s})) for s in (0, 1, 2)]
    for spec in specs:
        runner.run_one(spec)
    for s in (0, 1, 2):
        want = load_federation_data(apply_flat(cfg, {"seed": s}))
        assert np.array_equal(seen[s].x_test, want.x_test)
    assert not all(np.array_equal(seen[0].x_test, seen[s].x_test) for s in (1, 2))
    assert len({spec.key for spec in specs}) == 3 and all(spec.own_data for spec in specs)
