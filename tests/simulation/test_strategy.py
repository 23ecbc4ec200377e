"""The cloud strategy as a pure state machine: rounds, slots, staleness, queues, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.config import MethodConfig
from fedcure_app.strategy import EdgeUpdate, FedCureStrategy


def make_strategy(m: int = 4, k: int | None = None, scheduler: str = "fedcure",
                  beta: float = 0.5, sizes=None, kappa: float = 1.0,
                  warmup_tasks: int = 0) -> FedCureStrategy:
    per = 3
    coalitions = [list(range(i * per, (i + 1) * per)) for i in range(m)]
    n = m * per
    samples = np.full(n, 10.0) if sizes is None else np.repeat(np.asarray(sizes, float), per)
    return FedCureStrategy(
        MethodConfig(scheduler=scheduler, beta=beta, tau_e=4, kappa=kappa),
        coalitions,
        samples,
        np.full(n, 2e9),
        np.tile([0.6, 1.5], (n, 1)),
        np.linspace(10.0, 40.0, m),
        [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)],
        max_concurrent=k,
        seed=0,
        warmup_tasks=warmup_tasks,
    )


def arrive(s: FedCureStrategy, m: int, value: float = 1.0, latency: float = 5.0):
    d = s.in_flight[m]
    arrays = [np.full_like(a, value) for a in s.global_arrays]
    return s.on_arrival(EdgeUpdate(m, d.version, arrays, 30, latency))


def test_round_zero_dispatches_every_coalition_then_keeps_at_most_k_training():
    s = make_strategy(m=4, k=2)
    first = s.dispatch()
    assert sorted(d.coalition for d in first) == [0, 1, 2, 3]
    assert all(d.version == 0 for d in first)
    # drain: arrivals free slots, but nothing is refilled while >= K are training
    arrive(s, 0)
    assert s.dispatch() == []
    arrive(s, 1)
    assert s.dispatch() == []  # 2 still training == K
    arrive(s, 2)
    new = s.dispatch()
    assert len(new) == 1 and len(s.in_flight) == 2


def test_staleness_weight_is_applied_to_the_global_model():
    s = make_strategy(m=3, k=3)
    s.dispatch()
    arrive(s, 0, value=1.0)  # staleness 0: ξ = ℓ
    assert np.allclose(s.global_arrays[0], 0.2)
    rec = arrive(s, 1, value=1.0)  # trained from v0, global is v1: φ = 1
    assert rec.staleness == 1
    assert rec.xi == pytest.approx(0.2 * 0.95)
    assert np.allclose(s.global_arrays[0], (1 - rec.xi) * 0.2 + rec.xi * 1.0)
    assert s.version == 2 and s.round == 2


def test_arrival_from_an_idle_coalition_or_wrong_version_is_refused_and_changes_nothing():
    s = make_strategy(m=3, k=3)
    s.dispatch()
    arrive(s, 0)
    before = [a.copy() for a in s.global_arrays], s.version
    with pytest.raises(ValueError, match="not training"):
        s.on_arrival(EdgeUpdate(0, 0, [a + 1 for a in s.global_arrays], 1, 1.0))
    with pytest.raises(ValueError, match="version"):
        s.on_arrival(EdgeUpdate(1, 7, [a + 1 for a in s.global_arrays], 1, 1.0))
    with pytest.raises(ValueError, match="tensors"):
        s.on_arrival(EdgeUpdate(1, 0, s.global_arrays[:1], 1, 1.0))
    assert s.version == before[1]
    assert all(np.array_equal(a, b) for a, b in zip(s.global_arrays, before[0]))


def test_frequency_directives_stay_in_each_clients_range():
    s = make_strategy(m=3, k=3)
    for d in s.dispatch():
        assert set(d.frequencies_ghz) == set(d.clients)
        assert all(0.6 <= f <= 1.5 for f in d.frequencies_ghz.values())
        assert d.t_hat_round_s == pytest.approx(d.t_hat_s / 4)


def test_checkpoint_round_trip_resumes_identically():
    a = make_strategy(m=4, k=2, scheduler="random")
    a.dispatch()
    for m in (0, 1, 2):
        arrive(a, m, value=float(m))
        a.dispatch()
    state = a.state_dict()
    b = make_strategy(m=4, k=2, scheduler="random")
    b.load_state_dict(state)
    for s in (a, b):
        for m in sorted(s.in_flight):
            arrive(s, m, value=3.0, latency=7.0)
            s.dispatch()
    assert a.version == b.version
    assert sorted(a.in_flight) == sorted(b.in_flight)
    assert np.allclose(a.scheduler.queues.values, b.scheduler.queues.values)
    assert all(np.array_equal(x, y) for x, y in zip(a.global_arrays, b.global_arrays))


@settings(max_examples=6, deadline=None)
@given(beta=st.sampled_from([0.0, 0.5, 2.0, 10.0]), seed=st.integers(0, 1000))
def test_queues_stay_mean_rate_stable_in_a_long_asynchronous_run(beta, seed):
    """Many arrivals with random latencies: every coalition keeps its share δ_m, Λ/T → 0.

    The targets are feasible (κ = 0.5 < 1 and a 3x speed spread with K = 2), as the Lyapunov
    argument requires; an infeasible δ cannot be met by any scheduler.
    """
    sizes = [1, 2, 3, 4]
    s = make_strategy(m=4, k=2, beta=beta, sizes=sizes, kappa=0.5)
    rng = np.random.default_rng(seed)
    speed = np.array([1.0, 1.5, 2.0, 3.0])  # coalition 3 is 3x slower
    clock = {}
    now = 0.0
    for d in s.dispatch():
        clock[d.coalition] = now + speed[d.coalition] * rng.lognormal(0, 0.2)
    rounds = 3000
    for _ in range(rounds):
        m = min(clock, key=clock.get)
        now = clock.pop(m)
        arrive(s, m, latency=float(speed[m]))
        for d in s.dispatch():
            clock[d.coalition] = now + speed[d.coalition] * rng.lognormal(0, 0.2)
    share = s.participation / s.participation.sum()
    assert np.all(share >= s.delta - 0.02), (share, s.delta)
    assert s.scheduler.queues.values.max() / rounds < 0.01


@given(warmup=st.integers(0, 3), latencies=st.lists(st.floats(0.5, 50.0), min_size=1,
                                                    max_size=8))
@settings(max_examples=40, deadline=None)
def test_the_estimator_learns_a_coalitions_arrivals_only_after_its_warmup_tasks(warmup,
                                                                              latencies):
    """Every arrival is aggregated; the estimator counts only those after the coalition's
    first ``warmup_tasks``, and learns them exactly as a strategy without warm-up would."""
    s = make_strategy(m=1, k=1, warmup_tasks=warmup)
    plain = make_strategy(m=1, k=1)
    s.dispatch()
    plain.dispatch()
    for i, t in enumerate(latencies):
        rec = arrive(s, 0, latency=t)
        assert rec.round == i + 1 and rec.extra.get("warmup", False) == (i < warmup)
        if i >= warmup:
            arrive(plain, 0, latency=t)
            plain.dispatch()
        s.dispatch()
    assert s.estimator.count[0] == max(0, len(latencies) - warmup)
    np.testing.assert_allclose(s.estimator.mean(), plain.estimator.mean())


def test_warmup_defaults_to_one_task_deployed_and_none_simulated():
    from fedcure_app.config import DevicesConfig

    assert DevicesConfig().warmups(deployed=True) == 1
    assert DevicesConfig().warmups(deployed=False) == 0
    assert DevicesConfig(warmup_tasks=3).warmups(deployed=False) == 3
    with pytest.raises(ValueError):
        DevicesConfig(warmup_tasks=-1)
    with pytest.raises(ValueError):
        make_strategy(warmup_tasks=-1)
