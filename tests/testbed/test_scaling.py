"""Scaling device profiles to one host (pure): one common factor keeps the devices' speed
ratios, the clients' quotas at f_max fit the host's cores less the roles' reserve, no client asks
more than one core, and ``--client-cores C`` puts the fastest at C cores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.devices import PRESETS
from fedcure_app.devices.cgroup import ROLE_RESERVE_CORES, cores_asked, oversubscribed
from fedcure_app.testbed.scaling import host_cores_at_fmax, scale_factor, scale_profiles

NAMES = sorted(PRESETS)


@settings(max_examples=60, deadline=None)
@given(names=st.lists(st.sampled_from(NAMES), min_size=1, max_size=24),
       host=st.floats(200, 50_000), cores=st.integers(1, 16))
def test_auto_scaling_keeps_the_ratios_and_fits_the_host(names, host, cores):
    profiles = [PRESETS[n] for n in names]
    sc = scale_profiles(profiles, "digits", host, cores)
    before = [host_cores_at_fmax(p, "digits", host) for p in profiles]
    after = [host_cores_at_fmax(p, "digits", host) for p in sc.profiles]
    assert 0 < sc.factor <= 1
    for b, a, c in zip(before, after, sc.cores):
        assert a == pytest.approx(b * sc.factor, rel=1e-9) == pytest.approx(c, rel=1e-9)
    assert max(after) <= 1 + 1e-9
    room = max(cores - ROLE_RESERVE_CORES, 0.05 * len(profiles))
    assert sum(after) <= room + 1e-9
    if sum(after) >= 0.05 * len(profiles) and min(after) >= 0.05:
        assert not oversubscribed(cores_asked(list(sc.profiles), "digits", host), cores)
    # the largest such factor: one of the two bounds is tight, or nothing needed slowing
    assert sc.factor == 1 or max(after) == pytest.approx(1) or sum(after) == pytest.approx(room)


def test_a_mix_that_already_fits_is_left_as_is():
    rpi4 = PRESETS["rpi4"]
    host = 500 * rpi4.f_max_ghz * 1e9 / rpi4.cycles_for("mnist")  # rpi4 = 0.2 % of a core
    sc = scale_profiles([rpi4] * 3, "mnist", host, 2)
    assert sc.factor == 1 and sc.profiles == (rpi4,) * 3
    assert sc.below_floor == ("rpi4",)  # under the actuator's 0.5 % floor: said so
    slower = scale_profiles([rpi4] * 3, "mnist", host / 5, 2)  # 1 %: a longer CPU period
    assert slower.below_floor == ()


def test_client_cores_puts_the_fastest_client_at_that_share():
    profiles = [PRESETS["rpi4"], PRESETS["rpi5"], PRESETS["laptop"]]
    sc = scale_profiles(profiles, "mnist", 2_600.0, 2, client_cores=0.5)
    assert max(sc.cores) == pytest.approx(0.5)
    ratio = (host_cores_at_fmax(PRESETS["laptop"], "mnist", 2_600.0)
             / host_cores_at_fmax(PRESETS["rpi4"], "mnist", 2_600.0))
    assert sc.cores[2] / sc.cores[0] == pytest.approx(ratio)
    assert sc.profiles[0].cycles_for("mnist") > PRESETS["rpi4"].cycles_for("mnist")
    assert sc.profiles[0].cycles_for("cifar10") == PRESETS["rpi4"].cycles_for("cifar10")


@pytest.mark.parametrize("shares, cores, client_cores", [([], 2, None), ([0.5, 0.0], 2, None),
                                                         ([0.5], 2, 0.0), ([0.5], 2, 1.5)])
def test_bad_scaling_inputs_raise(shares, cores, client_cores):
    with pytest.raises(ValueError):
        scale_factor(shares, cores, client_cores)
