"""The simulation engine end to end on the offline digits data (in-process executor)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcure_app.cli import main
from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.simulation.engine import simulate

TINY = {
    "dataset": "digits", "num-clients": 8, "num-edges": 3, "global-rounds": 6,
    "tau-c": 2, "tau-e": 2, "eval-every": 3, "seed": 1, "lr": 0.05,
}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def tiny(**over) -> FedCureConfig:
    return apply_flat(FedCureConfig(), {**TINY, **over})


def test_every_global_round_leaves_a_record_and_evaluations_follow_eval_every(digits):
    res = simulate(tiny(), dataset=digits)
    recs = res["records"]
    assert [r["round"] for r in recs] == list(range(1, 7))
    assert [r["accuracy"] is not None for r in recs] == [False, False, True, False, False, True]
    times = [r["time_s"] for r in recs]
    assert times == sorted(times) and times[0] > 0
    for r in recs:
        assert 0 < r["xi"] <= 0.2 and r["staleness"] >= 0 and r["energy_j"] > 0
        assert len(r["queues"]) == 3
    for key in ("final_accuracy", "rounds", "participation", "latency_cov", "energy_j",
                "wall_seconds", "best_accuracy", "simulated_seconds"):
        assert key in res
    assert sum(res["participation"]["rounds"]) == 6


def test_same_seed_same_schedule_and_model_different_seed_differs(digits):
    a = simulate(tiny(), dataset=digits)
    b = simulate(tiny(), dataset=digits)
    c = simulate(tiny(seed=2), dataset=digits)
    trace = lambda r: [(x["coalition"], round(x["time_s"], 9)) for x in r["records"]]  # noqa: E731
    assert trace(a) == trace(b)
    assert a["final_accuracy"] == b["final_accuracy"]
    assert trace(a) != trace(c)


@pytest.mark.parametrize("method", ["greedy", "fair", "fedgreedy", "fedfair", "fedcure"])
def test_each_of_the_papers_methods_runs_end_to_end(digits, method):
    res = simulate(tiny(method=method), dataset=digits)
    assert res["rounds"] == 6
    assert 0.0 <= res["final_accuracy"] <= 1.0
    if method.startswith("fed"):
        assert res["formed_jsd"] < res["initial_jsd"]
    else:
        assert res["formed_jsd"] == pytest.approx(res["initial_jsd"])


def test_greedy_scheduler_favours_the_fastest_coalition(digits):
    res = simulate(tiny(method="greedy", **{"global-rounds": 20, "max-concurrent": 1}),
                   dataset=digits)
    share = np.array(res["participation"]["share"])
    est = [r["estimate_s"] for r in res["records"]]
    assert share.max() > 0.5, share  # one coalition dominates
    assert len(est) == 20


def test_each_es_access_network_makes_the_coalitions_differ_in_speed(digits):
    """The default population: coalitions of the same device mix differ in speed by their
    ES's access network (docs/DESIGN.md, 'Simulated devices and networks'); without caps the
    slowest preset in nearly every coalition makes them alike."""
    from fedcure_app.simulation.engine import build_federation

    flat = {"num-clients": 50, "num-edges": 5, "tau-c": 5, "tau-e": 12}
    capped = build_federation(tiny(**flat), digits)
    plain = build_federation(tiny(**flat, **{"edge-access-mbps": []}), digits)
    spread = lambda fed: fed.prior_latency().max() / fed.prior_latency().min()  # noqa: E731
    assert spread(capped) > 1.5 > 1.2 > spread(plain)
    # the ES with the slowest access network (5 Mbit/s: coalition 4) is the slowest coalition
    assert int(np.argmax(capped.prior_latency())) == 4
    np.testing.assert_array_equal(capped.population.cycles_per_sample,
                                  plain.population.cycles_per_sample)


def test_simulate_cli_writes_json_and_plots(tmp_path):
    out = tmp_path / "run"
    rc = main(["simulate", "--dataset", "digits", "--clients", "6", "--edges", "2",
               "--rounds", "3", "--tau-c", "1", "--tau-e", "1", "--eval-every", "1",
               "--out", str(out), "--json", str(tmp_path / "r.json"), "--no-progress"])
    assert rc == 0
    res = json.loads((tmp_path / "r.json").read_text())
    for key in ("final_accuracy", "rounds", "participation", "latency_cov", "energy_j",
                "wall_seconds"):
        assert key in res
    for png in ("accuracy.png", "queues.png", "participation.png"):
        assert (out / png).stat().st_size > 1000


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--max-concurrent", "9", "--edges", "3"], "--max-concurrent"),
        (["--beta", "-1"], "beta"),
        (["--dataset", "mnist", "--data-dir", "{tmp}"], "mnist"),
        (["--clients", "0"], "--clients"),
    ],
)
def test_bad_configuration_is_one_line_naming_the_fix(tmp_path, capsys, argv, needle):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = main(["simulate", "--rounds", "1", "--no-progress", "--out", str(tmp_path / "o"),
               *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and needle in err.lower(), err


def test_unknown_method_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--method", "fedmagic"])
    assert exc.value.code == 2
    assert "fedmagic" in capsys.readouterr().err


def test_simulate_with_the_flower_executor_runs_on_virtual_supernodes(tmp_path):
    out = tmp_path / "fl"
    rc = main(["simulate", "--executor", "flower", "--clients", "4", "--edges", "2",
               "--rounds", "2", "--tau-c", "1", "--tau-e", "1", "--eval-every", "1",
               "--no-progress", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "result.json").read_text())
    assert res["rounds"] == 2
    assert "flower" in res  # written by the ServerApp, not by the in-process engine


def test_with_one_worker_only_the_tasks_that_arrive_are_trained(digits):
    """Round 0 dispatches every coalition, so some tasks are still in flight when the run ends:
    with one worker each task trains when it arrives, so exactly one task per global round is
    trained, in the order of the arrivals."""
    from fedcure_app.simulation.engine import SimulationEngine, build_federation, \
        make_inprocess_executor

    cfg = tiny()
    fed = build_federation(cfg, digits)
    executor = make_inprocess_executor(fed)
    trained = []
    run = executor.run
    executor.run = lambda task: trained.append(task.coalition) or run(task)
    res = SimulationEngine(fed, executor).run()
    assert len(res["records"]) == cfg.run.global_rounds
    assert trained == [r["coalition"] for r in res["records"]]
    assert sum(len(r["dispatched"]) for r in res["records"]) + fed.cfg.federation.num_edges \
        > len(trained)  # some dispatched tasks never arrived, and were never trained
