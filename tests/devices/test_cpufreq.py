"""CPU-frequency actuators (cpufreq sysfs, emulated, off), device probing, and the sysfs
actuator end to end through the ClientApp and the client CLI
(:mod:`fedcure_app.devices.cpufreq`)."""

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

from fedcure_app import devices
from fedcure_app.devices import (
    PRESETS,
    CpufreqError,
    CpufreqPermissionError,
    EmulatedThrottle,
    NoThrottle,
    SysfsCpufreq,
    make_actuator,
    probe_device,
)


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

REPO = Path(__file__).resolve().parents[2]


def _node_data_file(path: Path, client: int = 1) -> Path:
    """A tiny deployed client's data file (random 8x8 digits, a Raspberry Pi 4 profile)."""
    from fedcure_app.flower.node_data import NodeData, save_node_data

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

    from fedcure_app.flower import client_app
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
    from fedcure_app.flower.node_data import read_applied

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
