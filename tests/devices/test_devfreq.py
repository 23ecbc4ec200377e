"""The GPU-clock actuator on a fake devfreq tree (:mod:`fedcure_app.devices.devfreq`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from fedcure_app.devices.devfreq import SysfsDevfreq, find_gpu, make_gpu_actuator

#: a Jetson Orin Nano's GPU steps (Hz)
STEPS = [306_000_000, 408_000_000, 510_000_000, 612_000_000, 624_750_000]


def _fake_devfreq(root: Path, name: str = "17000000.gpu", steps: list[int] = STEPS) -> Path:
    """A fake /sys/class/devfreq with one GPU device (min at the lowest, max at the top)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "available_frequencies").write_text(" ".join(map(str, steps)) + "\n")
    (d / "min_freq").write_text(f"{steps[0]}\n")
    (d / "max_freq").write_text(f"{steps[-1]}\n")
    (d / "cur_freq").write_text(f"{steps[-1]}\n")
    (root / "soc:emc").mkdir()  # another devfreq device, not the GPU
    return d


def test_finds_the_gpu_device_among_devfreq_devices(tmp_path: Path) -> None:
    d = _fake_devfreq(tmp_path)
    assert find_gpu(tmp_path) == d


@pytest.mark.parametrize("directive, want", [
    (1.5, STEPS[-1]),          # the profile's top: the GPU's top
    (0.115, STEPS[0]),         # the profile's bottom: the GPU's lowest step
    (0.8075, 510_000_000),     # half way (465.4 MHz) is nearest 510 MHz
    (5.0, STEPS[-1]),          # above the range: clamped
])
def test_directive_is_pinned_to_the_nearest_step_of_its_fraction(
        tmp_path: Path, directive: float, want: int) -> None:
    d = _fake_devfreq(tmp_path)
    act = SysfsDevfreq(d, 0.115, 1.5)
    assert act.apply(directive) == want
    assert int((d / "min_freq").read_text()) == want
    assert int((d / "max_freq").read_text()) == want
    assert act.applied_hz == want


def test_going_up_after_going_down_keeps_both_files_on_the_step(tmp_path: Path) -> None:
    d = _fake_devfreq(tmp_path)
    act = SysfsDevfreq(d, 0.5, 1.5)
    act.apply(0.5)
    assert int((d / "max_freq").read_text()) == STEPS[0]
    act.apply(1.5)
    assert (int((d / "min_freq").read_text()), int((d / "max_freq").read_text())) == \
        (STEPS[-1], STEPS[-1])


def test_off_gives_no_actuator(tmp_path: Path) -> None:
    _fake_devfreq(tmp_path)
    assert make_gpu_actuator("off", 0.1, 1.5, tmp_path) is None


def test_missing_tree_falls_back_with_one_line(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fedcure_app.devices"):
        assert make_gpu_actuator("devfreq", 0.1, 1.5, tmp_path / "nothing") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "GPU devfreq control unavailable" in lines[0]
    assert "no devfreq folder" in lines[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_read_only_tree_falls_back_with_one_line_saying_why(tmp_path: Path, caplog) -> None:
    d = _fake_devfreq(tmp_path)
    for f in ("min_freq", "max_freq"):
        (d / f).chmod(0o444)
    with caplog.at_level(logging.WARNING, logger="fedcure_app.devices"):
        assert make_gpu_actuator("devfreq", 0.1, 1.5, tmp_path) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "Permission denied" in lines[0]


def test_unwritable_max_freq_falls_back_with_one_line(tmp_path: Path, caplog) -> None:
    """Also as root: a max_freq the kernel refuses (here a folder) means no GPU control."""
    d = _fake_devfreq(tmp_path)
    (d / "max_freq").unlink()
    (d / "max_freq").mkdir()
    with caplog.at_level(logging.WARNING, logger="fedcure_app.devices"):
        assert make_gpu_actuator("devfreq", 0.1, 1.5, tmp_path) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "max_freq" in lines[0]


def test_writable_tree_gives_the_actuator(tmp_path: Path) -> None:
    _fake_devfreq(tmp_path)
    act = make_gpu_actuator("devfreq", 0.1, 1.5, tmp_path)
    assert isinstance(act, SysfsDevfreq) and act.available_hz == STEPS
