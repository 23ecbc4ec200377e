"""The deployment's messaging per edge round (``devices.edge_round_overhead_s``): the simulated
clock and the latency prior add τ_e times it to every coalition task, and nothing else moves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.config import ConfigError, FedCureConfig, apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.devices import PRESETS, PopulationArrays
from fedcure_app.federation import prior_latency
from fedcure_app.simulation.engine import SimulationEngine, build_federation, make_executor
from fedcure_app.strategy import Dispatch

TINY = {"dataset": "digits", "num-clients": 6, "num-edges": 2, "global-rounds": 2,
        "tau-c": 2, "tau-e": 3, "eval-every": 2, "seed": 1}


@settings(max_examples=60, deadline=None)
@given(tau_e=st.integers(1, 20), overhead=st.floats(0.0, 100.0),
       samples=st.integers(1, 5000), link=st.floats(1.0, 1000.0))
def test_the_prior_grows_by_tau_e_times_the_overhead_for_every_coalition(
        tau_e, overhead, samples, link):
    pop = PopulationArrays.from_profiles(
        [PRESETS[n] for n in ("rpi4", "laptop", "jetson-nano", "rpi5")], "mnist")
    coalitions = [[0, 1], [2], [3]]
    base = prior_latency(pop, coalitions, samples, 400_000, tau_e, link)
    more = prior_latency(pop, coalitions, samples, 400_000, tau_e, link, overhead)
    np.testing.assert_allclose(more - base, tau_e * overhead, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), 3601.0])
def test_a_negative_or_unbounded_overhead_is_refused(bad):
    with pytest.raises((ConfigError, ValueError)):
        apply_flat(FedCureConfig(), {"edge-round-overhead-s": bad})


def _first_task(digits, **flat) -> tuple[tuple[float, float], np.ndarray]:
    """(latency s, energy J) of coalition 0's task at 1 GHz on the simulated clock, and the
    latency prior, for TINY with ``flat``."""
    fed = build_federation(apply_flat(FedCureConfig(), {**TINY, **flat}), digits)
    ex = make_executor(fed, workers=1)
    try:
        eng = SimulationEngine(fed, ex)
        clients = tuple(fed.coalitions[0])
        d = Dispatch(round=0, coalition=0, version=0, clients=clients,
                     frequencies_ghz={c: 1.0 for c in clients}, t_hat_round_s=1.0, t_hat_s=3.0)
        return eng._simulated_latency(d), fed.prior_latency()
    finally:
        ex.close()


def test_the_simulated_clock_adds_tau_e_times_the_overhead_to_a_task():
    digits = load_dataset("digits")
    (base, _), base_prior = _first_task(digits)
    (more, _), prior = _first_task(digits, **{"edge-round-overhead-s": 1.25})
    # the same clock draws (the jitter RNG is seeded alike), plus τ_e = 3 times 1.25 s
    assert more - base == pytest.approx(3 * 1.25)
    assert prior == pytest.approx(base_prior + 3 * 1.25)


@settings(max_examples=60, deadline=None)
@given(tau_e=st.integers(1, 20), extra=st.integers(0, 100_000), samples=st.integers(1, 5000))
def test_a_clients_own_work_per_edge_round_costs_its_devices_time_in_the_prior(
        tau_e, extra, samples):
    """Single-client coalitions: τ_e · c · S / f_max more, so a slow device pays more of it."""
    profiles = [PRESETS[n] for n in ("rpi4", "laptop")]
    pop = PopulationArrays.from_profiles(profiles, "mnist")
    base = prior_latency(pop, [[0], [1]], samples, 400_000, tau_e, 100.0)
    more = prior_latency(pop, [[0], [1]], samples, 400_000, tau_e, 100.0, 0.0, extra)
    want = tau_e * pop.cycles_per_sample * extra / (pop.f_max_ghz * 1e9)
    np.testing.assert_allclose(more - base, want, rtol=1e-9, atol=1e-9)
    if extra:
        assert (more - base)[0] > (more - base)[1]  # the Pi 4 is slower per sample


def test_the_simulated_clock_charges_a_clients_own_work_at_its_frequency():
    digits = load_dataset("digits")
    (t0, e0), _ = _first_task(digits)
    (t1, e1), _ = _first_task(digits, **{"edge-round-client-samples": 5000})
    fed = build_federation(apply_flat(FedCureConfig(), TINY), digits)
    # the same jitter draws: every client's edge round is longer, so the slowest one is too,
    # by about τ_e · c · S / f at f = 1 GHz (c: the coalition's fewest cycles per sample; the
    # jitter factor stays above 0.5); and the work costs energy
    c_min = float(fed.population.cycles_per_sample[list(fed.coalitions[0])].min())
    assert t1 - t0 >= 3 * c_min * 5000 / 1e9 * 0.5
    assert e1 > e0
