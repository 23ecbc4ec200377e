"""Coalition formation: preference rules, stability, constraints, incremental evaluation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.core.coalition import FormationResult, form_coalitions, is_stable, run_formation
from fedcure_app.core.layout import synthetic_label_counts
from fedcure_app.core.partition_state import PartitionState
from fedcure_app.core.screening import Screen
from tests.core.helpers import brute_force_improving, mean_jsd_to_others, phi, random_instance

LN2 = math.log(2)


def _check_trajectory(res: FormationResult, counts, initial, m):
    traj = np.array(res.jsd_trajectory)
    assert len(traj) == res.moves + 1
    assert traj[0] == pytest.approx(phi(counts, initial, m), abs=1e-12)
    assert traj[-1] == pytest.approx(phi(counts, res.assignment, m), abs=1e-10)
    return traj


# ---------------------------------------------------------------- the paper's setting
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paper_setting_reaches_near_zero_jsd(seed):
    counts, initial = synthetic_label_counts(50, 5, 10, "edge-noniid", seed=seed)
    res = form_coalitions(counts, initial, 5, "fedcure", seed=seed)
    traj = _check_trajectory(res, counts, initial, 5)
    assert abs(res.initial_jsd - LN2) <= 0.01
    assert res.final_jsd <= 0.01
    assert res.stable
    assert np.all(np.diff(traj) <= 0)
    assert np.bincount(res.assignment, minlength=5).min() >= 1


# ---------------------------------------------------------------- stability by brute force
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), rule=st.sampled_from(["fedcure", "pareto"]))
def test_descent_is_monotone_and_stable_by_brute_force(seed, rule):
    counts, initial, m = random_instance(seed)
    res = form_coalitions(counts, initial, m, rule, seed=seed)
    traj = _check_trajectory(res, counts, initial, m)
    assert np.all(np.diff(traj) < 0)
    assert res.stable
    assert brute_force_improving(counts, res.assignment, m, rule) == []
    assert is_stable(counts, res.assignment, m, rule)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_screened_method_reaches_a_brute_force_stable_partition(seed):
    counts, initial, m = random_instance(seed, n_max=60, m_max=6)
    res = form_coalitions(counts, initial, m, "fedcure", seed=seed, method="screened")
    traj = _check_trajectory(res, counts, initial, m)
    assert np.all(np.diff(traj) < 0)
    assert res.stable
    assert brute_force_improving(counts, res.assignment, m) == []


@pytest.mark.parametrize("rule", ["fedcure", "pareto", "selfish"])
def test_history_replays_to_the_result(rule):
    counts, initial = synthetic_label_counts(30, 3, 6, "dirichlet", alpha=0.3, seed=4)
    res = form_coalitions(counts, initial, 3, rule, seed=1)
    assert len(res.history) == res.moves >= 1
    current = initial.copy()
    for step, (n, b, a) in enumerate(res.history, start=1):
        assert current[n] == b and a != b
        before_mu = mean_jsd_to_others(counts, current, 3)
        current[n] = a
        assert res.jsd_trajectory[step] == pytest.approx(phi(counts, current, 3), abs=1e-12)
        if rule == "pareto":  # neither coalition's mean JSD to the others got worse
            after_mu = mean_jsd_to_others(counts, current, 3)
            assert after_mu[a] <= before_mu[a] + 1e-12
            assert after_mu[b] <= before_mu[b] + 1e-12
    assert np.array_equal(current, res.assignment)


def test_is_stable_detects_an_improving_move():
    counts, initial = synthetic_label_counts(20, 2, 4, "edge-noniid")
    assert not is_stable(counts, initial, 2)
    res = form_coalitions(counts, initial, 2)
    assert is_stable(counts, res.assignment, 2)


# ---------------------------------------------------------------- bound and incremental checks
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_lower_bound_never_exceeds_the_exact_change(seed):
    counts, initial, m = random_instance(seed, n_max=50, m_max=6, c_max=7,
                                         alpha=[0.1, 1.0, 10.0][seed % 3])
    state = PartitionState(counts, initial, m)
    L = Screen(state).lower_bounds()
    n = np.repeat(np.arange(len(initial)), m)
    a = np.tile(np.arange(m), len(initial))
    ok = (a != state.assign[n]) & state.can_leave(n)
    ev = state.evaluate(n[ok], a[ok])
    bound = L.ravel()[ok]
    assert np.all(bound <= ev.d_f + 1e-15)
    # and the exact incremental ΔΦ equals Eq. 3 recomputed from scratch
    base = phi(counts, initial, m)
    for i in range(0, ok.sum(), 7):
        moved = initial.copy()
        moved[ev.n[i]] = ev.a[i]
        assert ev.d_f[i] * state.scale == pytest.approx(phi(counts, moved, m) - base, abs=1e-12)


def test_refresh_matches_a_fresh_evaluation():
    counts, initial = synthetic_label_counts(60, 6, 5, "dirichlet", alpha=0.5, seed=3)
    state = PartitionState(counts, initial, 6)
    n = np.array([0, 11, 22, 33, 44])  # ESs 0, 1, 2, 3, 4
    a = np.array([1, 5, 3, 4, 5])
    ev = state.evaluate(n, a)
    state.apply(ev, 0)  # client 0: ES 0 -> 1 changes coalitions 0 and 1
    keep = np.array([2, 3])  # candidates not touching ES 0 or 1
    refreshed = state.refresh(ev, keep, np.array([0, 1]))
    fresh = state.evaluate(n[keep], a[keep])
    assert np.allclose(refreshed.d_f, fresh.d_f, rtol=0, atol=1e-15)
    assert np.allclose(refreshed.rows, fresh.rows, rtol=0, atol=1e-15)


# ---------------------------------------------------------------- constraints
def test_allowed_and_capacity_are_respected_and_stability_is_relative_to_them():
    counts, initial = synthetic_label_counts(40, 4, 8, "edge-noniid", seed=0)
    rng = np.random.default_rng(0)
    allowed = rng.random((40, 4)) < 0.6
    allowed[np.arange(40), initial] = True
    capacity = np.array([11, 12, 10, 13])
    for method in ("sweep", "screened"):
        res = form_coalitions(counts, initial, 4, allowed=allowed, capacity=capacity,
                              method=method)
        assert np.all(allowed[np.arange(40), res.assignment])
        sizes = np.bincount(res.assignment, minlength=4)
        assert np.all(sizes <= capacity) and sizes.min() >= 1
        assert res.stable
        assert brute_force_improving(counts, res.assignment, 4, allowed=allowed,
                                     capacity=capacity) == []


def test_allowed_lists_equal_the_matrix_form():
    counts, initial = synthetic_label_counts(20, 4, 8, "edge-noniid")
    lists = [[int(b), (int(b) + 1) % 4] for b in initial]
    matrix = np.zeros((20, 4), bool)
    for n, ess in enumerate(lists):
        matrix[n, ess] = True
    r1 = form_coalitions(counts, initial, 4, allowed=lists, seed=3)
    r2 = form_coalitions(counts, initial, 4, allowed=matrix, seed=3)
    assert np.array_equal(r1.assignment, r2.assignment)
    assert all(r1.assignment[n] in lists[n] for n in range(20))


def test_never_empties_a_coalition():
    # two coalitions; the only way to lower JSD would be to move the lone client of ES 1
    counts = np.array([[10, 0], [10, 0], [0, 10], [5, 5]])
    res = form_coalitions(counts, np.array([0, 0, 0, 1]), 2)
    assert np.bincount(res.assignment, minlength=2).min() >= 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(allowed=np.ones((20, 4), bool) & (np.arange(4) != 0)), "not allowed"),
        (dict(capacity=4), "above its capacity"),
        (dict(capacity=[5, 5, 5]), "shape"),
        (dict(capacity=0), ">= 1"),
        (dict(allowed=np.ones((19, 4), bool)), "shape"),
        (dict(allowed=[[0]] * 19), "list of 20"),
        (dict(allowed=[[7]] * 20), "out of range"),
    ],
)
def test_initial_must_respect_constraints(kwargs, match):
    counts, initial = synthetic_label_counts(20, 4, 8, "edge-noniid")
    with pytest.raises(ValueError, match=match):
        form_coalitions(counts, initial, 4, **kwargs)


# ---------------------------------------------------------------- other rules and options
def test_selfish_rule_joins_look_alikes_and_reports_stability_honestly():
    counts, initial = synthetic_label_counts(40, 4, 6, "dirichlet", alpha=0.2, seed=5)
    res = form_coalitions(counts, initial, 4, "selfish", seed=0)
    _check_trajectory(res, counts, initial, 4)
    assert res.final_jsd > res.initial_jsd  # homophily raises heterogeneity across ESs
    if res.stable:
        assert is_stable(counts, res.assignment, 4, "selfish")
    capped = form_coalitions(counts, initial, 4, "selfish", seed=0, max_moves=3)
    assert capped.moves <= 3
    assert capped.stable == is_stable(counts, capped.assignment, 4, "selfish")


def test_max_moves_and_determinism():
    counts, initial = synthetic_label_counts(50, 5, 10, "edge-noniid")
    none = form_coalitions(counts, initial, 5, max_moves=0)
    assert none.moves == 0 and none.jsd_trajectory == [none.initial_jsd] and not none.stable
    few = form_coalitions(counts, initial, 5, max_moves=5)
    assert few.moves == 5 and not few.stable
    a = form_coalitions(counts, initial, 5, seed=7)
    b = form_coalitions(counts, initial, 5, seed=7)
    assert np.array_equal(a.assignment, b.assignment)
    assert a.jsd_trajectory == b.jsd_trajectory


def test_result_is_json_safe_and_consistent():
    counts, initial = synthetic_label_counts(50, 5, 10, "edge-noniid")
    res = form_coalitions(counts, initial, 5)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["moves"] == res.moves and d["stable"] is True
    assert d["initial_jsd"] == res.initial_jsd and d["final_jsd"] == res.final_jsd
    assert sorted(sum(res.coalitions(5), [])) == list(range(50))
    assert res.assignment.dtype == np.int64


@pytest.mark.parametrize("rule", ["none", "kmeans", "meanshift"])
def test_run_formation_covers_baselines(rule):
    counts, initial = synthetic_label_counts(30, 3, 6, "dirichlet", alpha=0.3, seed=2)
    res = run_formation(counts, initial, 3, rule, seed=0)
    assert len(res.jsd_trajectory) == 2
    assert res.final_jsd == pytest.approx(phi(counts, res.assignment, 3), abs=1e-12)
    assert np.bincount(res.assignment, minlength=3).min() >= 1
    assert res.stable == is_stable(counts, res.assignment, 3)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((np.ones((4, 2)), [0, 1, 0, 1], 2), dict(rule="nash"), "unknown formation rule"),
        ((-np.ones((4, 2)), [0, 1, 0, 1], 2), {}, "non-negative"),
        ((np.full((4, 2), np.nan), [0, 1, 0, 1], 2), {}, "NaN"),
        ((np.ones(4), [0, 1, 0, 1], 2), {}, "2-D"),
        ((np.ones((4, 2)), [0, 1, 0, 2], 2), {}, "outside"),
        ((np.ones((4, 2)), [0, 1, 0], 2), {}, "shape"),
        ((np.ones((4, 2)), [0, 0, 0, 0], 2), {}, "without clients"),
        ((np.ones((2, 2)), [0, 1], 3), {}, "every ES needs a client"),
        ((np.array([[1, 0], [0, 0]]), [0, 1], 2), {}, "no samples"),
        ((np.ones((4, 2)), [0, 1, 0, 1], 2), dict(max_moves=-1), "max_moves"),
        ((np.ones((4, 2)), [0, 1, 0, 1], 2), dict(seed=-3), "seed"),
        ((np.ones((4, 2)), [0, 1, 0, 1], 2), dict(method="magic"), "formation method"),
    ],
)
def test_bad_input_is_rejected(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        form_coalitions(*args, **kwargs)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), descend=st.booleans())
def test_certificate_agrees_with_brute_force(seed, descend):
    from fedcure_app.core.constraints import Constraints
    from fedcure_app.core.screened import certify

    counts, initial, m = random_instance(seed, n_max=30, m_max=5)
    assignment = initial
    if descend:  # a partition that is stable, or nearly so after a few moves
        assignment = form_coalitions(counts, initial, m, max_moves=seed % 7 + 1).assignment
    state = PartitionState(counts, assignment, m)
    stable, _ = certify(state, Constraints.build(len(assignment), m), 1e-12)
    assert stable == (brute_force_improving(counts, assignment, m) == [])


def test_degenerate_instances():
    one = form_coalitions(np.ones((5, 3)), np.zeros(5, int), 1)
    assert one.stable and one.moves == 0 and one.final_jsd == 0.0
    # a client without samples never moves and never blocks stability
    counts = np.array([[5, 0], [0, 5], [0, 0], [3, 3]])
    res = form_coalitions(counts, np.array([0, 0, 1, 1]), 2)
    assert res.stable and res.assignment[2] == 1
    state = PartitionState(counts, np.array([0, 0, 1, 1]), 2)
    assert state.evaluate(np.array([], int), np.array([], int)).d_f.shape == (0,)
