"""Virtual queues and the four schedulers (FedCure, Greedy, Fair, Random)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.core.queues import VirtualQueues, queue_deltas
from fedcure_app.core.scheduler import SCHEDULERS, make_scheduler


# ---------------------------------------------------------------- queues
def test_queue_semantics():
    q = VirtualQueues([0.2, 0.5])
    assert np.allclose(q.values, [-0.2, -0.5])  # Λ(−1) = −δ
    assert np.allclose(q.update([]), [0.0, 0.0])  # Λ(0) = 0 without service
    assert np.allclose(q.update([]), [0.2, 0.5])
    assert np.allclose(q.update([1]), [0.4, 0.0])  # max(0.5 + 0.5 − 1, 0)
    assert np.allclose(q.update(np.array([1, 0])), [0.0, 0.5])  # ndarray = indicator
    assert np.allclose(q.update((0, 1)), [0.0, 0.0])
    assert q.rounds == 5
    fresh = VirtualQueues([0.2, 0.5])
    assert np.allclose(fresh.update([0, 1]), [0.0, 0.0])  # round 0 dispatches all: Λ(0) = 0


def test_queue_state_round_trip_and_errors():
    q = VirtualQueues([0.1, 0.3, 0.6])
    for chi in ([], [2], [0, 1], []):
        q.update(chi)
    other = VirtualQueues([0.0, 0.0, 0.0])
    other.load_state_dict(json.loads(json.dumps(q.state_dict())))
    assert np.array_equal(other.values, q.values) and other.rounds == q.rounds
    with pytest.raises(ValueError, match="in \\[0, 3\\)"):
        q.update([3])
    with pytest.raises(ValueError, match="twice"):
        q.update([1, 1])
    with pytest.raises(ValueError, match="shape"):
        q.update(np.array([1, 0]))
    with pytest.raises(ValueError, match="only 0 and 1"):
        q.update(np.array([0.5, 0, 0]))
    with pytest.raises(ValueError, match="non-negative"):
        VirtualQueues([0.1, -0.1])
    with pytest.raises(ValueError, match="NaN"):
        VirtualQueues([np.nan])
    with pytest.raises(ValueError, match="coalitions"):
        other.load_state_dict(VirtualQueues([1.0]).state_dict())


def test_queue_deltas():
    assert np.allclose(queue_deltas([10, 30, 60], 0.9), [0.09, 0.27, 0.54])
    for bad, match in (([0, 0], "all zero"), ([1, -1], "non-negative"), ([], "at least")):
        with pytest.raises(ValueError, match=match):
            queue_deltas(bad, 1.0)
    with pytest.raises(ValueError, match="kappa"):
        queue_deltas([1, 2], 0.0)


# ---------------------------------------------------------------- decisions
@settings(max_examples=50, deadline=None)
@given(data=st.data(), m=st.integers(1, 8), beta=st.sampled_from([0.0, 0.5, 2.0, 10.0]))
def test_decisions_follow_their_rules(data, m, beta):
    avail = sorted(data.draw(st.sets(st.integers(0, m - 1), min_size=1)))
    est = np.array(data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=m,
                                      max_size=m)))
    rounds = data.draw(st.lists(st.sets(st.integers(0, m - 1)), max_size=6))
    delta = np.linspace(0.05, 0.2, m)
    scheds = {name: make_scheduler(name, delta, beta=beta, seed=1) for name in SCHEDULERS}
    for s in scheds.values():
        for chi in rounds:
            s.end_round(sorted(chi))
    lam = scheds["fedcure"].queues.values
    score = {m_: lam[m_] + beta * (1 - est[m_] / est.mean()) for m_ in avail}
    best = max(score.values())
    assert scheds["fedcure"].select(avail, est) == min(k for k, v in score.items() if v == best)
    fastest = min(est[k] for k in avail)
    assert scheds["greedy"].select(avail, est) == min(k for k in avail if est[k] == fastest)
    longest = max(lam[k] for k in avail)
    assert scheds["fair"].select(avail, est) == min(k for k in avail if lam[k] == longest)
    assert scheds["random"].select(avail, est) in avail


def test_random_is_uniform_seeded_and_checkpointed():
    s = make_scheduler("random", [0.1] * 4, seed=5)
    picks = [s.select([0, 2, 3], np.ones(4)) for _ in range(3000)]
    counts = np.bincount(picks, minlength=4)
    assert counts[1] == 0 and np.all(np.abs(counts[[0, 2, 3]] / 3000 - 1 / 3) < 0.04)
    state = json.loads(json.dumps(s.state_dict()))
    t = make_scheduler("random", [0.1] * 4, seed=99)
    t.load_state_dict(state)
    assert [s.select([0, 1, 2, 3], np.ones(4)) for _ in range(20)] == \
        [t.select([0, 1, 2, 3], np.ones(4)) for _ in range(20)]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_state_round_trip(name):
    s = make_scheduler(name, [0.1, 0.2, 0.3], beta=2.0)
    for chi in ([0], [], [1, 2], [2]):
        s.end_round(chi)
    t = make_scheduler(name, [0.1, 0.2, 0.3], beta=0.0)
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert t.beta == 2.0 and np.array_equal(t.queues.values, s.queues.values)
    est = np.array([1.0, 3.0, 2.0])
    assert t.select([0, 1, 2], est) == s.select([0, 1, 2], est)
    with pytest.raises(ValueError, match="scheduler state"):
        other = "fair" if name != "fair" else "greedy"
        make_scheduler(other, [0.1, 0.2, 0.3]).load_state_dict(s.state_dict())


@pytest.mark.parametrize(
    "available, estimates, match",
    [
        ([], [1, 1, 1], "no coalition"),
        ([0, 3], [1, 1, 1], "in \\[0, 3\\)"),
        ([0, 0], [1, 1, 1], "duplicates"),
        ([0.5], [1, 1, 1], "integers"),
        ([0], [1, 1], "shape"),
        ([0], [1, 0, 1], "positive"),
        ([0], [1, np.nan, 1], "positive finite"),
    ],
)
def test_bad_select_inputs(available, estimates, match):
    s = make_scheduler("fedcure", [0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match=match):
        s.select(available, np.array(estimates, dtype=float))


def test_bad_construction():
    with pytest.raises(ValueError, match="unknown scheduler"):
        make_scheduler("fifo", [0.1])
    with pytest.raises(ValueError, match="beta"):
        make_scheduler("fedcure", [0.1], beta=-1)
    with pytest.raises(ValueError, match="seed"):
        make_scheduler("random", [0.1], seed=-1)


# ---------------------------------------------------------------- long-run guarantees
def _long_run(name: str, beta: float, rounds: int, seed: int):
    """One coalition per round from random availability with random latency estimates."""
    sizes = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    delta = queue_deltas(sizes, 0.9)  # Σδ = 0.9 ≤ 1: feasible with one dispatch per round
    s = make_scheduler(name, delta, beta=beta, seed=seed)
    rng = np.random.default_rng(seed)
    served = np.zeros(5)
    speed = np.array([1.0, 2.0, 4.0, 8.0, 16.0])  # coalition 4 is always the slowest
    for _ in range(rounds):
        avail = np.flatnonzero(rng.random(5) < 0.8)
        est = speed * rng.lognormal(0.0, 0.3, size=5)
        chosen = [s.select(avail, est)] if avail.size else []
        served[chosen] += 1
        s.end_round(chosen)
    return delta, served / rounds, s.queues.values


@pytest.mark.parametrize("beta", [0.0, 0.5, 2.0, 10.0])
def test_fedcure_queues_are_mean_rate_stable(beta):
    T = 20_000
    delta, share, lam = _long_run("fedcure", beta, T, seed=int(beta * 10))
    assert lam.max() / T < 0.01
    assert np.all(share >= delta - 0.01), (share, delta)


def test_greedy_starves_the_slow_coalition_while_fair_does_not():
    delta, greedy_share, greedy_lam = _long_run("greedy", 0.5, 5000, seed=1)
    assert greedy_share[4] < delta[4] - 0.1 and greedy_lam[4] / 5000 > 0.1
    delta, fair_share, fair_lam = _long_run("fair", 0.5, 5000, seed=1)
    assert np.all(fair_share >= delta - 0.01) and fair_lam.max() / 5000 < 0.01
