"""Device profiles, latency/energy arithmetic and CPU-frequency actuators."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fedcure_app import devices
from fedcure_app.devices import (
    MODEL_ALIASES,
    PRESETS,
    TRAIN_FLOPS_PER_SAMPLE,
    CpufreqError,
    CpufreqPermissionError,
    DeviceProfile,
    EmulatedThrottle,
    NoThrottle,
    PopulationArrays,
    ProfileError,
    SysfsCpufreq,
    client_round_seconds,
    coalition_seconds,
    compute_seconds,
    edge_round_seconds,
    energy_joules,
    load_profiles,
    make_actuator,
    parse_profile,
    probe_device,
    sample_population,
    transfer_seconds,
)
from fedcure_app.models import ARCHITECTURES, train_flops_per_sample


def _profile(**kw: object) -> DeviceProfile:
    base: dict[str, object] = dict(
        name="dev", f_min_ghz=0.5, f_max_ghz=2.0, cycles_per_sample={"mnist": 1e6},
        uplink_mbps=10.0, downlink_mbps=20.0, kappa=1e-9, jitter=0.0,
    )
    base.update(kw)
    return DeviceProfile.model_validate(base)


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
    assert set(a) == set(PRESETS)
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


# ----------------------------------------------------------------------------- actuators


def _fake_cpus(
    root: Path, per_cpu: list[list[int] | tuple[int, int]], governor: str = "ondemand"
) -> Path:
    """A fake /sys/devices/system/cpu: a list of kHz values (available list) or (min, max)."""
    for i, spec in enumerate(per_cpu):
        d = root / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True)
        if isinstance(spec, list):
            (d / "scaling_available_frequencies").write_text(" ".join(map(str, spec)) + " \n")
            lo, hi = min(spec), max(spec)
        else:
            lo, hi = spec
        (d / "cpuinfo_min_freq").write_text(f"{lo}\n")
        (d / "cpuinfo_max_freq").write_text(f"{hi}\n")
        (d / "scaling_max_freq").write_text(f"{hi}\n")
        (d / "scaling_cur_freq").write_text(f"{hi}\n")
        (d / "scaling_governor").write_text(governor + "\n")
    (root / "cpufreq").mkdir(exist_ok=True)  # present on real systems; not a cpu
    return root


def _written(root: Path, cpu: int) -> int:
    return int((root / f"cpu{cpu}" / "cpufreq" / "scaling_max_freq").read_text())


PI4_KHZ = [600_000, 700_000, 800_000, 900_000, 1_000_000, 1_100_000, 1_200_000, 1_300_000,
           1_400_000, 1_500_000]


def test_sysfs_picks_the_nearest_available_frequency(tmp_path: Path) -> None:
    root = _fake_cpus(tmp_path, [PI4_KHZ] * 4)
    act = SysfsCpufreq(root)
    assert act.cpus == (0, 1, 2, 3)
    assert (act.f_min_ghz, act.f_max_ghz) == (0.6, 1.5)
    assert act.apply(1.04) == 1.0
    assert all(_written(root, c) == 1_000_000 for c in range(4))
    assert act.apply(1.26) == 1.3
    assert act.apply(0.05) == 0.6
    assert act.apply(9.0) == 1.5
    assert _written(root, 3) == 1_500_000
    assert act.stretch(2.5, 1.0) == 2.5
    assert act.available_ghz(0)[:2] == [0.6, 0.7]


def test_sysfs_falls_back_to_the_cpuinfo_range(tmp_path: Path) -> None:
    root = _fake_cpus(tmp_path, [(800_000, 3_500_000)] * 2)
    act = SysfsCpufreq(root)
    assert act.available_ghz(0) is None
    assert act.apply(1.2345) == pytest.approx(1.2345)
    assert _written(root, 1) == 1_234_500
    assert act.apply(10.0) == 3.5 and _written(root, 0) == 3_500_000
    assert act.apply(0.1) == 0.8


def test_sysfs_cpu_subset_and_mixed_clusters(tmp_path: Path) -> None:
    little = [500_000, 1_000_000, 1_400_000]
    big = [500_000, 1_200_000, 2_000_000]
    root = _fake_cpus(tmp_path, [little, little, big, big])
    act = SysfsCpufreq(root)
    assert act.apply(1.3) == 1.2  # little → 1.4, big → 1.2: the slowest core is reported
    assert [_written(root, c) for c in range(4)] == [1_400_000, 1_400_000, 1_200_000, 1_200_000]
    only = SysfsCpufreq(root, cpus=[2])
    only.apply(0.4)
    assert _written(root, 2) == 500_000 and _written(root, 3) == 1_200_000
    with pytest.raises(CpufreqError, match=r"cpu\(s\) \[7\]"):
        SysfsCpufreq(root, cpus=[7])


def test_sysfs_absent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(CpufreqError, match="no cpufreq support"):
        SysfsCpufreq(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fedcure_app.devices"):
        act = make_actuator("sysfs", PRESETS["rpi4"], root=tmp_path)
    assert isinstance(act, EmulatedThrottle)
    assert "emulating" in caplog.text


def _deny(errno_code: int) -> Callable[..., Any]:
    """An ``open`` that fails every write with ``errno_code`` (as the kernel would)."""
    real_open = open

    def fake_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            # OSError(EACCES, ...) constructs a PermissionError, as the kernel's refusal does
            raise OSError(errno_code, os.strerror(errno_code), str(path))
        return real_open(path, mode, *args, **kwargs)

    return fake_open


def test_sysfs_permission_failure_and_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = _fake_cpus(tmp_path, [PI4_KHZ] * 2)
    monkeypatch.setattr(devices.cpufreq, "open", _deny(errno.EACCES), raising=False)
    act = SysfsCpufreq(root)  # reading still works
    with pytest.raises(CpufreqPermissionError, match="cannot write .*scaling_max_freq") as info:
        act.apply(1.0)
    assert isinstance(info.value, PermissionError)
    with caplog.at_level(logging.WARNING, logger="fedcure_app.devices"):
        fallback = make_actuator("sysfs", PRESETS["rpi4"], root=root)
    assert isinstance(fallback, EmulatedThrottle)
    assert "cannot write" in caplog.text
    assert _written(root, 0) == 1_500_000  # nothing was changed

    monkeypatch.setattr(devices.cpufreq, "open", _deny(errno.EROFS), raising=False)
    with pytest.raises(CpufreqPermissionError):
        SysfsCpufreq(root).apply(1.0)
    monkeypatch.setattr(devices.cpufreq, "open", _deny(errno.EINVAL), raising=False)
    with pytest.raises(CpufreqError, match="failed"):
        SysfsCpufreq(root).apply(1.0)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes")
def test_sysfs_read_only_files(tmp_path: Path) -> None:
    root = _fake_cpus(tmp_path, [PI4_KHZ])
    (root / "cpu0" / "cpufreq" / "scaling_max_freq").chmod(0o444)
    with pytest.raises(CpufreqPermissionError):
        SysfsCpufreq(root).apply(1.0)


def test_make_actuator_sysfs_when_writable(tmp_path: Path) -> None:
    root = _fake_cpus(tmp_path, [PI4_KHZ] * 2)
    act = make_actuator("sysfs", PRESETS["rpi4"], root=root)
    assert isinstance(act, SysfsCpufreq)
    assert _written(root, 0) == 1_500_000  # the writability check rewrote the same value


def test_emulated_throttle() -> None:
    act = EmulatedThrottle(2.0, f_min_ghz=0.5)
    assert act.apply(1.0) == 1.0
    assert act.apply(0.1) == 0.5
    assert act.apply(3.0) == 2.0
    assert act.stretch(3.0, 1.0) == pytest.approx(6.0)
    assert act.stretch(3.0, 2.0) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="finite number > 0"):
        act.apply(0.0)
    with pytest.raises(ValueError):
        EmulatedThrottle(1.0, f_min_ghz=2.0)


def test_make_actuator_kinds() -> None:
    p = PRESETS["jetson-nano"]
    emu = make_actuator("emulate", p)
    assert isinstance(emu, EmulatedThrottle)
    assert emu.apply(0.01) == p.f_min_ghz and emu.apply(99) == p.f_max_ghz
    off = make_actuator("off", p)
    assert isinstance(off, NoThrottle)
    assert off.apply(0.5) == p.f_max_ghz and off.stretch(1.25, 0.5) == 1.25
    with pytest.raises(ValueError, match="unknown frequency control 'turbo'"):
        make_actuator("turbo", p)


def test_probe_device(tmp_path: Path) -> None:
    root = _fake_cpus(tmp_path / "cpu", [[600_000, 1_500_000], [600_000, 1_800_000]],
                      governor="schedutil")
    proc = tmp_path / "proc"
    (proc / "device-tree").mkdir(parents=True)
    (proc / "device-tree" / "model").write_bytes(b"Raspberry Pi 4 Model B Rev 1.4\x00")
    (proc / "meminfo").write_text("MemTotal:        3884328 kB\nMemAvailable:    3000000 kB\n")
    info = probe_device(root, proc)
    assert info["model"] == "Raspberry Pi 4 Model B Rev 1.4"
    assert info["governor"] == "schedutil"
    assert info["available_ghz"] == [0.6, 1.5, 1.8]
    assert info["cpufreq"][1]["max_ghz"] == 1.8
    assert info["memory_total_bytes"] == 3884328 * 1024
    assert info["memory_available_bytes"] == 3_000_000 * 1024
    assert info["cores"] >= 1 and info["usable_cores"] >= 1
    bare = probe_device(tmp_path / "nothing", tmp_path / "noproc")
    assert bare["cpufreq"] == {} and bare["governor"] is None and bare["memory_total_bytes"] is None


def test_probe_this_machine() -> None:
    info = probe_device()
    assert info["usable_cores"] >= 1
    json.dumps(info)  # serialisable for the --probe CLI


# ------------------------------------------------- the sysfs actuator end to end (ClientApp, CLI)

REPO = Path(__file__).resolve().parents[1]


def _node_data_file(path: Path, client: int = 1) -> Path:
    """A tiny deployed client's data file (random 8x8 digits, a Raspberry Pi 4 profile)."""
    from fedcure_app.node_data import NodeData, save_node_data

    rng = np.random.default_rng(client)
    data = NodeData(x=rng.normal(size=(24, 1, 8, 8)).astype(np.float32),
                    y=rng.integers(0, 10, size=24), dataset="digits", num_classes=10,
                    client_name=f"dev-{client}", partition_id=client, profile=PRESETS["rpi4"])
    return save_node_data(path, data)


def clientapp_train(data_file: Path, cpu_root: Path, directives: list[float],
                    client: int = 1) -> list[float]:
    """Run the deployed ClientApp (node config ``cpufreq=sysfs``, ``cpufreq-root``) on one train
    message per directive (GHz); return the ``f-applied-ghz`` of each reply."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

    from fedcure_app import client_app
    from fedcure_app.models import build_model, get_weights
    from tests.simulation.fake_grid import task_identity

    ctx = Context(run_id=1, node_id=100 + client, state=RecordDict(), run_config={},
                  node_config={"client-id": client, "cpufreq": "sysfs",
                               "cpufreq-root": str(cpu_root), "data-file": str(data_file)})
    weights = get_weights(build_model("digits", 10))
    applied = []
    with task_identity():
        for i, f in enumerate(directives):
            config = ConfigRecord({"client-id": client, "tau-c": 1, "lr": 0.05,
                                   "batch-size": 8, "freq-ghz": f, "seed": 3, "edge-round": i,
                                   "task-id": "t1"})
            msg = Message(RecordDict({"arrays": ArrayRecord(weights), "config": config}),
                          dst_node_id=100 + client, message_type=MessageType.TRAIN,
                          group_id="g")
            reply = client_app.app(msg, ctx)
            assert not reply.has_error(), reply.error
            applied.append(float(reply.content["metrics"]["f-applied-ghz"]))
    return applied


def test_clientapp_writes_the_cap_of_each_directive_under_cpufreq_root(tmp_path: Path) -> None:
    from fedcure_app.node_data import read_applied

    little = [600_000, 1_000_000, 1_400_000]
    root = _fake_cpus(tmp_path / "cpu", [PI4_KHZ, PI4_KHZ, little, little],
                      governor="schedutil")
    data_file = _node_data_file(tmp_path / "node.npz")
    directives = [1.04, 0.64, 1.26, 9.0, 0.05]
    # each CPU gets its nearest available frequency; the reply carries the slowest core's
    want_pi4 = [1_000_000, 600_000, 1_300_000, 1_500_000, 600_000]
    want_little = [1_000_000, 600_000, 1_400_000, 1_400_000, 600_000]
    applied = clientapp_train(data_file, root, directives)
    assert applied == [min(a, b) / 1e6 for a, b in zip(want_pi4, want_little)]
    assert [_written(root, c) for c in range(4)] == [want_pi4[-1]] * 2 + [want_little[-1]] * 2
    log = read_applied(data_file)
    assert [e["directive_ghz"] for e in log] == directives
    assert [e["applied_ghz"] for e in log] == applied
    assert all(e["cpufreq"] == "sysfs" for e in log)
    # the hardware really runs at the cap: no emulated stretch
    assert all(e["seconds"] == e["measured_s"] for e in log)
    # the governor and the other files are left alone
    for c in range(4):
        d = root / f"cpu{c}" / "cpufreq"
        assert (d / "scaling_governor").read_text() == "schedutil\n"
        assert int((d / "cpuinfo_max_freq").read_text()) == max(PI4_KHZ if c < 2 else little)


def test_clientapp_caps_follow_every_directive_in_turn(tmp_path: Path) -> None:
    root = _fake_cpus(tmp_path / "cpu", [PI4_KHZ] * 2)
    data_file = _node_data_file(tmp_path / "node.npz", client=2)
    for f, khz in [(0.71, 700_000), (1.44, 1_400_000), (0.86, 900_000)]:
        assert clientapp_train(data_file, root, [f], client=2) == [khz / 1e6]
        assert [_written(root, c) for c in range(2)] == [khz, khz]


def test_clientapp_without_cpufreq_under_its_root_emulates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "no-cpufreq"
    empty.mkdir()
    data_file = _node_data_file(tmp_path / "node.npz", client=3)
    with caplog.at_level(logging.WARNING, logger="fedcure_app.devices"):
        applied = clientapp_train(data_file, empty, [1.04, 0.1], client=3)
    assert applied == [1.04, PRESETS["rpi4"].f_min_ghz]  # the profile's range, emulated
    assert (f"cpufreq control unavailable ([Errno 2] no cpufreq support under {empty}); "
            "emulating the throttle instead") in caplog.text


def test_sysfs_on_an_unwritable_tree_falls_back_with_the_documented_warning(
    tmp_path: Path,
) -> None:
    """scaling_max_freq mode 0444, written by a process without the right to override file
    modes (root loses CAP_DAC_OVERRIDE through setpriv): the kernel's EACCES, for real, and
    the ClientApp's fallback (:func:`make_actuator`) emulates each directive instead."""
    import shutil
    import subprocess
    import sys

    root = _fake_cpus(tmp_path / "cpu", [PI4_KHZ] * 2)
    for c in range(2):
        (root / f"cpu{c}" / "cpufreq" / "scaling_max_freq").chmod(0o444)
    argv = [sys.executable, "-c",
            "import json, logging, sys\n"
            "logging.basicConfig(level=logging.WARNING, "
            "format='%(levelname)s %(name)s: %(message)s')\n"
            "from fedcure_app.devices import PRESETS, make_actuator\n"
            "act = make_actuator('sysfs', PRESETS['rpi4'], root=sys.argv[1])\n"
            "print(json.dumps([type(act).__name__, act.apply(1.04), act.apply(0.1), "
            "act.stretch(2.0, 1.0)]))",
            str(root)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root ignores file modes and setpriv (util-linux) is not installed")
        argv = ["setpriv", "--bounding-set=-dac_override", *argv]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    # emulated within the Pi 4 profile (0.6-1.5 GHz): t·f_max/f
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["EmulatedThrottle", 1.04, 0.6,
                                                               3.0]
    assert ("WARNING fedcure_app.devices: cpufreq control unavailable (cannot write "
            f"{root}/cpu0/cpufreq/scaling_max_freq: Permission denied; run as root, grant write "
            "access to cpufreq (e.g. a udev rule), or use the emulated throttle); emulating the "
            "throttle instead") in out.stderr
    assert [_written(root, c) for c in range(2)] == [1_500_000, 1_500_000]  # untouched


def test_client_cli_passes_cpufreq_root_to_the_supernode_and_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from client.cli import build_parser, main, supernode_argv

    root = _fake_cpus(tmp_path / "cpu", [PI4_KHZ], governor="performance")
    args = build_parser().parse_args(["--cloud", "127.0.0.1:1", "--insecure", "--cpufreq",
                                      "sysfs", "--cpufreq-root", str(root)])
    args.secret_file = tmp_path / "secret"  # set by run_client for the warm runtime
    argv = supernode_argv("127.0.0.1:2", 3, 7, args.cpufreq, tmp_path / "d.npz", args)
    node_config = argv[argv.index("--node-config") + 1]
    assert f'cpufreq-root="{root}"' in node_config and 'cpufreq="sysfs"' in node_config
    default = build_parser().parse_args(["--cloud", "127.0.0.1:1", "--insecure"])
    default.secret_file = tmp_path / "secret"
    assert "cpufreq-root" not in " ".join(
        supernode_argv("127.0.0.1:2", 3, 7, "sysfs", tmp_path / "d.npz", default))
    assert main(["--probe", "--cpufreq-root", str(root)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["available_ghz"] == [k / 1e6 for k in PI4_KHZ]
    assert info["governor"] == "performance" and info["cpufreq"]["0"]["writable"] is True
