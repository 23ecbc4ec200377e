"""Budgets, run specs and the cached runner (tiny digits runs)."""

from __future__ import annotations

import pytest
from rich.progress import Progress

from fedcure_app.config import apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.experiments.budget import base_config, get_budget
from fedcure_app.experiments.runner import Runner, RunSpec, eval_view


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_budgets_follow_the_paper_where_they_claim_to():
    paper = get_budget("paper", "mnist")
    assert (paper.clients, paper.edges, paper.tau_c, paper.tau_e, paper.lr) == (50, 5, 5, 12, 0.01)
    assert get_budget("paper", "svhn").lr == 0.005
    assert get_budget("paper", "cifar10").rounds == 200
    quick = get_budget("quick", "mnist")
    assert quick.rounds < paper.rounds and quick.tau_e < paper.tau_e
    assert get_budget("quick", "digits", seeds=4).seeds == 4
    with pytest.raises(ValueError, match="unknown budget"):
        get_budget("huge", "digits")
    with pytest.raises(ValueError, match="seeds"):
        get_budget("quick", "digits", seeds=0)


def test_run_key_ignores_the_data_dir_but_not_the_seed_or_the_mode():
    b = get_budget("tiny", "digits")
    cfg = base_config("digits", None, b)
    a = RunSpec("a", cfg)
    assert RunSpec("b", apply_flat(cfg, {"data-dir": "/elsewhere"})).key == a.key
    assert RunSpec("a", apply_flat(cfg, {"seed": 1})).key != a.key
    assert RunSpec("a", cfg, schedule_only=True).key != a.key
    assert RunSpec("a", cfg, eval_samples=100).key != a.key


def test_eval_view_is_a_fixed_subset(digits):
    v = eval_view(digits, 50)
    assert v.test_size == 50 and v.train_size == digits.train_size
    assert (eval_view(digits, 50).y_test == v.y_test).all()
    assert eval_view(digits, None) is digits


def test_runner_caches_on_disk_and_schedule_only_keeps_the_schedule(digits, tmp_path,
                                                                    one_thread):
    cfg = base_config("digits", None, get_budget("tiny", "digits"))
    trained, replay = RunSpec("t", cfg), RunSpec("s", cfg, schedule_only=True)
    with Progress(disable=True) as progress:
        first = Runner(digits, tmp_path, progress=progress)
        res = first.run_all([trained, replay, trained])
    assert first.simulated == 2 and len(res) == 2
    a, b = res[trained.key], res[replay.key]
    trace = lambda r: [(x["coalition"], round(x["time_s"], 9)) for x in r["records"]]  # noqa: E731
    assert trace(a) == trace(b)
    assert a["final_accuracy"] is not None and b["final_accuracy"] is None
    second = Runner(digits, tmp_path)
    again = second.run_one(trained)
    assert second.simulated == 0 and second.cached_hits == 1
    assert again["final_accuracy"] == a["final_accuracy"]
    assert Runner(digits, tmp_path, fresh=True).run_one(trained)["label"] == "t"


def test_side_seeds_cut_the_clustering_and_rh_seeds_only():
    from fedcure_app.experiments.budget import get_budget

    b = get_budget("paper", "mnist", seeds=3, side_seeds=1)
    assert (b.seeds, b.side_seeds, b.rounds, b.tau_e) == (3, 1, 100, 12)
    assert get_budget("paper", "mnist", seeds=3).side_seeds == 3
    with pytest.raises(ValueError, match="between 1 and the Table 1 seeds"):
        get_budget("paper", "mnist", seeds=3, side_seeds=4)


def test_experiment_cli_refuses_more_side_seeds_than_seeds(capsys):
    from fedcure_app.cli import main

    assert main(["experiment", "table1", "--budget", "tiny", "--seeds", "2",
                 "--side-seeds", "3"]) == 2
    assert "--side-seeds must be between 1" in capsys.readouterr().err
