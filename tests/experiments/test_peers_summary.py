"""``fedcure experiment peers``' summary (fedcure_app.experiments.peers), on synthetic runs: time
to target within the budget, medians over seeds with seeds that never reach it, the speed-up of
FedCure and the summary's keys."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.experiments import peers


def _run(points: list[tuple[float, float]], initial: float = 0.1) -> dict:
    recs = [{"time_s": t, "accuracy": a, "client_steps": 10, "wan_bytes": 100, "energy_j": 1.0}
            for t, a in points]
    return {"initial_accuracy": initial, "records": recs, "final_accuracy": points[-1][1],
            "simulated_seconds": points[-1][0], "rounds": len(points),
            "config": {"peers": {"peer": "none"}}}


def test_time_to_target_ignores_the_evaluation_past_the_budget():
    run = _run([(1.0, 0.3), (2.0, 0.5), (3.2, 0.9)])
    assert peers.time_to_target(run, 0.5) == 2.0
    assert peers.time_to_target(run, 0.8, budget_s=3.0) is None
    assert peers.time_to_target(run, 0.8) == 3.2
    assert peers.accuracy_at(run, 0.5) == 0.1  # before the first round: the initial model


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(min_value=0.0, max_value=100.0)),
                min_size=1, max_size=7))
def test_median_time_counts_a_seed_that_never_reached_as_later_than_any(times):
    med = peers.median_time(times)
    reached = sorted(t for t in times if t is not None)
    if len(reached) <= len(times) // 2:  # the middle seed(s) include one that never reached
        assert med is None
    else:
        assert med is not None and reached[0] <= med <= reached[-1]


def test_analyse_writes_target_speedups_and_per_seed_numbers(tmp_path):
    fast = [_run([(1.0, 0.6), (2.0, 0.8)]), _run([(1.0, 0.7), (2.0, 0.82)])]
    slow = [_run([(1.0, 0.3), (2.0, 0.7)]), _run([(1.0, 0.2), (2.0, 0.5)])]
    runs = {"fedcure": fast, "fedavg": slow, "hierfavg": slow, "fedbuff": fast, "fedat": slow}
    section = peers.analyse("toy", runs, tmp_path, budget_s=2.0)
    section.save(tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())["data"]
    assert data["target_accuracy"] == pytest.approx(0.9 * 0.81)
    fc = data["methods"]["fedcure"]
    assert set(fc) >= {"time_to_target_s", "final_accuracy", "accuracy_at_budget",
                       "client_steps", "energy_j", "wan_bytes"}
    assert fc["time_to_target_s"] == [2.0, 2.0] and fc["client_steps"] == [20, 20]
    assert data["methods"]["fedavg"]["time_to_target_s"] == [None, None]
    assert data["speedup_of_fedcure"]["fedbuff"] == pytest.approx(1.0)
    assert data["speedup_of_fedcure"]["fedavg"] is None
    assert (tmp_path / "accuracy_time.png").stat().st_size > 0
    assert "| FedCure |" in section.markdown


def test_analyse_lists_the_methods_not_run_yet(tmp_path):
    runs = {"fedcure": [_run([(1.0, 0.6)])], "fedavg": [_run([(1.0, 0.3)])]}
    section = peers.analyse("toy", runs, tmp_path, budget_s=1.0)
    assert section.data["not_run"] == ["hierfavg", "fedbuff", "fedat"]
    assert "Not run yet: HierFAVG, FedBuff, FedAT." in section.markdown


def test_the_option_rows_are_fedcure_with_k_m_and_with_ell_one_and_nothing_else_changed():
    from fedcure_app.config import FedCureConfig

    base = FedCureConfig()
    specs = peers.peer_specs(base, "digits", seeds=2, budget_s=3.0, eval_samples=None,
                             variants=True)
    plain, k_m, ell = (specs[m][1].cfg for m in ("fedcure", "fedcure-all", "fedcure-ell1"))
    assert k_m.method.max_concurrent == base.federation.num_edges
    assert ell.method.ell == 1.0 and plain.method.ell == base.method.ell
    assert ell.method.max_concurrent == plain.method.max_concurrent
    assert [s.cfg.run.seed for s in specs["fedcure-ell1"]] == [0, 1]
    assert "fedcure-ell1" not in peers.peer_specs(base, "digits", 1, 3.0, None)
