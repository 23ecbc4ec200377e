"""Latency and energy arithmetic, jitter, and the vectorised population model
(:mod:`fedcure_app.devices.latency`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.devices import (
    PRESETS,
    PopulationArrays,
    access_caps,
    client_round_seconds,
    coalition_seconds,
    compute_seconds,
    edge_round_seconds,
    energy_joules,
    sample_population,
    transfer_seconds,
)
from tests.devices.helpers import _profile


# ----------------------------------------------------------------------------- arithmetic


def test_latency_arithmetic() -> None:
    assert compute_seconds(1.5e9, 1.5) == pytest.approx(1.0)
    assert transfer_seconds(1_000_000, 8.0) == pytest.approx(1.0)
    p = _profile()  # 1e6 cycles/sample, up 10, down 20 Mbit/s
    t = client_round_seconds(p, "mnist", 160, 250_000, 1.0)
    assert t == pytest.approx(0.16 + 0.1 + 0.2)
    assert edge_round_seconds([0.3, 1.2, 0.7]) == 1.2
    assert coalition_seconds([1.0, 2.0, 3.0], 1_000_000, 80.0) == pytest.approx(6.2)
    assert coalition_seconds(1.5, 1_000_000, 80.0, tau_e=12) == pytest.approx(18.2)
    assert coalition_seconds(1.5, 1_000_000, 80.0, tau_e=12, transfers=0) == pytest.approx(18.0)
    assert energy_joules(p, 2e9, 1.5) == pytest.approx(1e-9 * 2e9 * 2.25)
    np.testing.assert_allclose(compute_seconds(np.array([1e9, 2e9]), 2.0), [0.5, 1.0])


def test_arithmetic_errors() -> None:
    with pytest.raises(ValueError, match="f_ghz"):
        compute_seconds(1e9, 0.0)
    with pytest.raises(ValueError, match="mbps"):
        transfer_seconds(10, -1.0)
    with pytest.raises(ValueError, match="at least one client"):
        edge_round_seconds([])
    with pytest.raises(ValueError, match="tau_e"):
        coalition_seconds([1.0, 2.0], 10, 1.0, tau_e=2)
    with pytest.raises(ValueError, match="edge-round latencies"):
        coalition_seconds([], 10, 1.0)


@settings(max_examples=60, deadline=None)
@given(
    cycles=st.floats(1e3, 1e12),
    f1=st.floats(0.1, 5.0),
    factor=st.floats(1.01, 10.0),
)
def test_higher_frequency_is_faster_and_costlier(cycles: float, f1: float, factor: float) -> None:
    f2 = f1 * factor
    p = PRESETS["rpi5"]
    assert compute_seconds(cycles, f2) < compute_seconds(cycles, f1)
    assert energy_joules(p, cycles, f2) > energy_joules(p, cycles, f1)
    assert client_round_seconds(p, "mnist", 160, 250_000, f2) < client_round_seconds(
        p, "mnist", 160, 250_000, f1
    )
    # compute time × frequency is the work, whatever f
    assert compute_seconds(cycles, f1) * f1 == pytest.approx(compute_seconds(cycles, f2) * f2)


def test_jitter_is_mean_one_and_seeded() -> None:
    p = _profile(jitter=0.3)
    base = client_round_seconds(p, "mnist", 160, 250_000, 1.0)
    rng = np.random.default_rng(0)
    draws = np.array(
        [client_round_seconds(p, "mnist", 160, 250_000, 1.0, rng) for _ in range(4000)]
    )
    assert draws.min() > 0
    assert draws.mean() == pytest.approx(base, rel=0.03)
    assert np.std(np.log(draws)) == pytest.approx(0.3, rel=0.05)
    again = np.random.default_rng(0)
    assert client_round_seconds(p, "mnist", 160, 250_000, 1.0, again) == draws[0]
    still = _profile(jitter=0.0)
    assert client_round_seconds(still, "mnist", 160, 250_000, 1.0, np.random.default_rng(5)) == \
        pytest.approx(base)


def test_population_arrays_agree_with_the_scalar_model() -> None:
    pop = sample_population(25, seed=3)
    arr = PopulationArrays.from_profiles(pop, "cifar10")
    f = arr.clamp(np.linspace(0.1, 5.0, 25))
    scalar = [client_round_seconds(p, "cifar10", 160, 4_969_512, fi) for p, fi in zip(pop, f)]
    np.testing.assert_allclose(arr.round_seconds(160, 4_969_512, f), scalar, rtol=1e-12)
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    jittered = [
        client_round_seconds(p, "cifar10", 160, 4_969_512, fi, rng_a) for p, fi in zip(pop, f)
    ]
    np.testing.assert_allclose(arr.round_seconds(160, 4_969_512, f, rng_b), jittered, rtol=1e-12)
    energy = [energy_joules(p, p.cycles_for("cifar10") * 160, fi) for p, fi in zip(pop, f)]
    np.testing.assert_allclose(arr.energy_joules(160, f), energy, rtol=1e-12)
    idx = np.array([2, 5])
    np.testing.assert_allclose(arr.round_seconds(160, 4_969_512, f[idx], idx=idx),
                               np.array(scalar)[idx], rtol=1e-12)
    assert len(arr) == 25
    assert np.all(arr.clamp(100.0) == arr.f_max_ghz)


# ----------------------------------------------------------------------------- ES access caps


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=30),
    st.lists(st.floats(0.5, 500.0), min_size=1, max_size=6),
)
def test_access_caps_cap_each_client_at_its_es_networks_rate(es, caps) -> None:
    pop = PopulationArrays.from_profiles(sample_population(len(es), seed=len(caps)), "mnist")
    cap = access_caps(es, caps)
    np.testing.assert_array_equal(cap, [caps[m % len(caps)] for m in es])
    capped = pop.with_link_caps(cap)
    np.testing.assert_array_equal(capped.uplink_mbps, np.minimum(pop.uplink_mbps, cap))
    np.testing.assert_array_equal(capped.downlink_mbps, np.minimum(pop.downlink_mbps, cap))
    # compute is untouched, and a capped link is never faster than the device's own radio
    np.testing.assert_array_equal(capped.cycles_per_sample, pop.cycles_per_sample)
    assert np.all(capped.round_seconds(160, 250_000, pop.f_max_ghz)
                  >= pop.round_seconds(160, 250_000, pop.f_max_ghz))


def test_no_access_caps_leave_the_links_as_the_devices_have_them() -> None:
    pop = PopulationArrays.from_profiles(sample_population(7, seed=1), "digits")
    cap = access_caps([0, 1, 2, 0, 1, 2, 0], [])
    assert np.all(np.isinf(cap))
    np.testing.assert_array_equal(pop.with_link_caps(cap).uplink_mbps, pop.uplink_mbps)


def test_access_caps_refuse_bad_input() -> None:
    pop = PopulationArrays.from_profiles(sample_population(3, seed=1), "digits")
    with pytest.raises(ValueError, match="one cap per client"):
        pop.with_link_caps(np.ones(2))
    with pytest.raises(ValueError, match="> 0"):
        pop.with_link_caps(np.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="caps_mbps"):
        access_caps([0, 1], [10.0, -1.0])
