"""Device profiles: presets, validation, population sampling, profile files
(:mod:`fedcure_app.devices.profiles`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from fedcure_app.devices import (
    DEFAULT_DRAW,
    MODEL_ALIASES,
    PRESETS,
    TRAIN_FLOPS_PER_SAMPLE,
    ProfileError,
    energy_joules,
    load_profiles,
    parse_profile,
    sample_population,
)
from fedcure_app.models import ARCHITECTURES, train_flops_per_sample
from tests.devices.helpers import _profile


# ----------------------------------------------------------------------------- profiles, presets


def test_presets_follow_published_clocks() -> None:
    clocks = {k: (p.f_min_ghz, p.f_max_ghz) for k, p in PRESETS.items()}
    assert clocks["rpi4"] == (0.6, 1.5)
    assert clocks["rpi5"] == (1.5, 2.4)
    assert clocks["jetson-nano"][1] == 1.43
    assert clocks["jetson-orin-nano"][1] == 1.5
    assert clocks["laptop"][1] == 4.0
    for name, p in PRESETS.items():
        assert p.name == name
        assert 0 < p.f_min_ghz <= p.f_max_ghz
        assert p.cycles_for("digits") < p.cycles_for("mnist") < p.cycles_for("cifar10")
        assert p.kappa > 0 and p.uplink_mbps > 0 and p.downlink_mbps > 0


def test_preset_speeds_are_plausible() -> None:
    def mnist_rate(name: str) -> float:
        p = PRESETS[name]
        return p.f_max_ghz * 1e9 / p.cycles_for("mnist")  # samples/s at f_max

    rates = [mnist_rate(n) for n in ("jetson-nano", "rpi4", "rpi5", "laptop")]
    assert rates == sorted(rates)
    assert 100 < mnist_rate("rpi4") < 1000


def test_preset_kappa_matches_power_at_fmax() -> None:
    # one second of work at f_max costs the CPU's load power in joules
    p = PRESETS["rpi4"]
    assert energy_joules(p, p.f_max_ghz * 1e9, p.f_max_ghz) == pytest.approx(3.5)


def test_train_flops_constants_match_the_models() -> None:
    for model, flops in TRAIN_FLOPS_PER_SAMPLE.items():
        assert train_flops_per_sample(model) == flops
    for dataset, arch in ARCHITECTURES.items():
        assert MODEL_ALIASES.get(dataset, dataset) == arch


def test_profile_validation() -> None:
    with pytest.raises(ValidationError, match="must not exceed f_max_ghz"):
        _profile(f_min_ghz=3.0)
    for bad in ({"uplink_mbps": 0}, {"downlink_mbps": -1}, {"kappa": 0},
                {"cycles_per_sample": {}}, {"cycles_per_sample": {"mnist": -5}},
                {"jitter": -0.1}, {"f_max_ghz": float("inf")}, {"colour": "red"}):
        with pytest.raises(ValidationError):
            _profile(**bad)


def test_profile_is_frozen() -> None:
    with pytest.raises(ValidationError):
        PRESETS["rpi4"].f_max_ghz = 9.0  # type: ignore[misc]


def test_cycles_for_aliases_and_errors() -> None:
    p = PRESETS["rpi4"]
    assert p.cycles_for("svhn") == p.cycles_for("cinic10") == p.cycles_for("cifar10")
    assert p.cycles_for("MNIST") == p.cycles_for("mnist")
    with pytest.raises(KeyError, match="no cycles for model 'resnet'"):
        p.cycles_for("resnet")


def test_clamp() -> None:
    p = _profile()
    assert (p.clamp(0.1), p.clamp(1.0), p.clamp(9.0)) == (0.5, 1.0, 2.0)


# ----------------------------------------------------------------------------- population


def test_population_is_seeded() -> None:
    a = [p.name for p in sample_population(60, seed=1)]
    b = [p.name for p in sample_population(60, seed=1)]
    c = [p.name for p in sample_population(60, seed=2)]
    assert a == b and a != c
    assert set(a) == set(DEFAULT_DRAW)  # a preset outside the default draw: by name only


def test_a_preset_outside_the_default_draw_is_dealt_by_name():
    assert "rpi3" in PRESETS and "rpi3" not in DEFAULT_DRAW
    assert {p.name for p in sample_population(8, seed=0, mix=["rpi3"])} == {"rpi3"}
    orin, pi3 = PRESETS["jetson-orin-nano"], PRESETS["rpi3"]
    ratio = pi3.cycles_for("mnist") / pi3.f_max_ghz / (orin.cycles_for("mnist") / orin.f_max_ghz)
    assert 7.0 < ratio < 8.5  # the Orin Nano about 7.7x as fast at f_max
    assert sample_population(0) == []


def test_population_mix() -> None:
    only = sample_population(20, seed=0, mix={"rpi4": 1.0, "laptop": 0.0})
    assert {p.name for p in only} == {"rpi4"}
    listed = sample_population(40, seed=0, mix=["rpi5", "jetson-nano"])
    assert {p.name for p in listed} == {"rpi5", "jetson-nano"}
    with pytest.raises(ValueError, match="unknown device preset"):
        sample_population(3, mix=["toaster"])
    with pytest.raises(ValueError, match="not all zero"):
        sample_population(3, mix={"rpi4": 0.0})
    with pytest.raises(ValueError, match="non-negative integer"):
        sample_population(-1)


# ----------------------------------------------------------------------------- profile files


def test_load_json_list_and_dict(tmp_path: Path) -> None:
    entry = _profile().model_dump()
    path = tmp_path / "a.json"
    path.write_text(json.dumps([entry, {"preset": "rpi5", "uplink_mbps": 5}]))
    loaded = load_profiles(path)
    assert loaded[0] == _profile()
    assert loaded[1].name == "rpi5" and loaded[1].uplink_mbps == 5
    assert loaded[1].f_max_ghz == PRESETS["rpi5"].f_max_ghz

    entry.pop("name")
    path2 = tmp_path / "b.json"
    path2.write_text(json.dumps({"profiles": {"pi-in-the-attic": entry}}))
    assert load_profiles(path2)[0].name == "pi-in-the-attic"


def test_load_toml(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        '[[profiles]]\nname = "box"\nf_min_ghz = 1.0\nf_max_ghz = 2.0\nuplink_mbps = 10\n'
        'downlink_mbps = 10\nkappa = 1e-9\n[profiles.cycles_per_sample]\nmnist = 2e6\n'
        '[[profiles]]\npreset = "laptop"\n'
    )
    a, b = load_profiles(path)
    assert a.name == "box" and a.cycles_for("mnist") == 2e6 and a.jitter == 0.1
    assert b == PRESETS["laptop"]
    tables = tmp_path / "t.toml"
    tables.write_text('[edge1]\npreset = "rpi4"\n[edge2]\npreset = "rpi4"\nkappa = 2e-9\n')
    one, two = load_profiles(tables)
    assert (one.name, two.name, two.kappa) == ("edge1", "edge2", 2e-9)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not found"):
        load_profiles(tmp_path / "missing.json")
    odd = tmp_path / "p.yaml"
    odd.write_text("x: 1")
    with pytest.raises(ProfileError, match="unsupported profile file type '.yaml'"):
        load_profiles(odd)
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(ProfileError, match="cannot parse"):
        load_profiles(broken)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ProfileError, match="no device profiles"):
        load_profiles(empty)
    scalar = tmp_path / "scalar.json"
    scalar.write_text("3")
    with pytest.raises(ProfileError, match="expected a list or a mapping"):
        load_profiles(scalar)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"slowpoke": {"preset": "rpi4", "f_min_ghz": 9.0}}))
    with pytest.raises(ProfileError, match=r"bad\.json: profile 'slowpoke': .*must not exceed"):
        load_profiles(bad)
    bad_list = tmp_path / "bad_list.json"
    bad_list.write_text(json.dumps([{"preset": "rpi4"}, {"preset": "rpi4", "speed": 3}]))
    with pytest.raises(ProfileError, match=r"profile #1: speed: unknown key"):
        load_profiles(bad_list)
    with pytest.raises(ProfileError, match="unknown preset 'toaster'"):
        parse_profile({"preset": "toaster"})
    with pytest.raises(ProfileError, match="must be a table"):
        parse_profile([1, 2])  # type: ignore[arg-type]
