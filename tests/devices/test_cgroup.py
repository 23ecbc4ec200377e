"""The CPU-bandwidth actuator (:mod:`fedcure_app.devices.cgroup`): the quota arithmetic, finding
the cgroup controller, the fallback, and (as root) a real cgroup that throttles a busy loop."""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcure_app.devices import PRESETS, EmulatedThrottle, make_actuator
from fedcure_app.devices.cgroup import (
    FLOOR_FRACTION,
    KERNEL_MIN_QUOTA_US,
    MAX_PERIOD_US,
    MIN_FRACTION,
    PERIOD_US,
    ROLE_RESERVE_CORES,
    CgroupCpuBandwidth,
    CgroupError,
    CpuController,
    cores_asked,
    find_cpu_controller,
    oversubscribed,
    period_for,
    plan_quota,
    predicted_samples_per_s,
    quota_fraction,
    quota_us,
    remove_cgroups,
)
from tests.kernel import require_cgroup

_rates = st.floats(1.0, 1e6, allow_nan=False)


@given(st.lists(st.sampled_from(sorted(PRESETS)), min_size=1, max_size=12), _rates)
def test_cores_asked_adds_each_clients_quota_at_f_max(names, host):
    profiles = [PRESETS[n] for n in names]
    asked = cores_asked(profiles, "mnist", host)
    each = [quota_fraction(predicted_samples_per_s(p, "mnist", p.f_max_ghz), host,
                           KERNEL_MIN_QUOTA_US / period_for(p, "mnist", host))
            for p in profiles]
    assert asked == pytest.approx(sum(each))
    assert len(profiles) * MIN_FRACTION - 1e-9 <= asked <= len(profiles) + 1e-9


@given(st.sampled_from(sorted(PRESETS)), st.sampled_from(["digits", "mnist", "cifar10"]),
       _rates)
def test_the_period_keeps_the_quota_at_f_min_above_the_kernels_floor(name, model, host):
    profile = PRESETS[name]
    period = period_for(profile, model, host)
    assert PERIOD_US <= period <= MAX_PERIOD_US
    q, applied = plan_quota(profile, model, profile.f_min_ghz, host, period)
    assert q >= KERNEL_MIN_QUOTA_US
    share = predicted_samples_per_s(profile, model, profile.f_min_ghz) / host
    if MIN_FRACTION <= share <= 1.0:  # neither raised to the floor nor capped at one core
        assert applied == pytest.approx(profile.f_min_ghz, rel=1e-3)
    if share >= FLOOR_FRACTION * 1.001:
        assert period == PERIOD_US


def test_a_device_slower_than_the_default_floor_is_throttled_to_its_own_speed(tmp_path):
    # an rpi3 at f_min on a fast host: 20 ms periods would round its quota up to 1 ms (5 %)
    base = tmp_path / "cpu"
    base.mkdir()
    (base / "cgroup.procs").write_text("")
    rpi3, host = PRESETS["rpi3"], 40_000.0
    share = predicted_samples_per_s(rpi3, "digits", rpi3.f_min_ghz) / host
    assert MIN_FRACTION < share < FLOOR_FRACTION
    act = CgroupCpuBandwidth(rpi3, "digits", host_sps=host, name="tbtest-slow",
                             controller=CpuController(1, base), pid=4243)
    period = int((base / "tbtest-slow" / "cpu.cfs_period_us").read_text())
    assert period > PERIOD_US
    assert act.apply(rpi3.f_min_ghz) == pytest.approx(rpi3.f_min_ghz, rel=1e-3)
    q = int((base / "tbtest-slow" / "cpu.cfs_quota_us").read_text())
    assert q >= KERNEL_MIN_QUOTA_US and q / period == pytest.approx(share, rel=1e-3)


def test_two_full_core_clients_oversubscribe_two_cores_but_two_half_cores_do_not():
    assert oversubscribed(2.0, 2) and oversubscribed(1.0 + 1.0 + 0.1, 2)
    assert not oversubscribed(0.5 + 0.5 + 0.1, 2)
    assert oversubscribed(2.0 - ROLE_RESERVE_CORES + 0.01, 2)
    assert not oversubscribed(2.0 - ROLE_RESERVE_CORES, 2)


def test_the_testbed_warns_when_the_device_mix_oversubscribes_the_host(caplog):
    from fedcure_app.testbed.hostload import warn_oversubscribed

    laptop, rpi4 = PRESETS["laptop"], PRESETS["rpi4"]
    host = predicted_samples_per_s(laptop, "mnist", laptop.f_max_ghz)  # a laptop: one core
    with caplog.at_level(logging.WARNING):
        assert warn_oversubscribed([rpi4, laptop, laptop], "mnist", host, host_cores=2)
    assert "slower than their profiles" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert not warn_oversubscribed([rpi4, laptop], "mnist", host, host_cores=2)
    assert not caplog.text


@given(_rates, _rates)
def test_quota_fraction_is_the_speed_ratio_between_the_floor_and_one_core(pred, host):
    frac = quota_fraction(pred, host)
    assert FLOOR_FRACTION <= frac <= 1.0
    if FLOOR_FRACTION <= pred / host <= 1.0:
        assert frac == pytest.approx(pred / host)


@given(_rates, _rates, _rates)
def test_a_faster_predicted_device_never_gets_a_smaller_quota(a, b, host):
    lo, hi = sorted((a, b))
    assert quota_fraction(lo, host) <= quota_fraction(hi, host)


@given(st.floats(1e-6, 1.0, allow_nan=False), st.integers(KERNEL_MIN_QUOTA_US, 1_000_000))
def test_quota_us_is_the_fraction_of_the_period_and_never_under_the_kernel_minimum(frac, period):
    q = quota_us(frac, period)
    assert q >= KERNEL_MIN_QUOTA_US
    assert q <= period
    if frac * period >= KERNEL_MIN_QUOTA_US:
        assert abs(q - frac * period) <= 0.5


@given(st.sampled_from(sorted(PRESETS)), st.sampled_from(["digits", "mnist", "cifar10"]),
       st.floats(0.05, 5.0), st.floats(10.0, 1e5))
def test_applied_frequency_is_what_the_quota_computes(name, model, f, host):
    profile = PRESETS[name]
    q, applied = plan_quota(profile, model, f, host)
    # the quota gives back `applied`: its predicted speed is exactly the quota's share of host
    assert predicted_samples_per_s(profile, model, applied) == pytest.approx(q / PERIOD_US * host)
    wanted = profile.clamp(f)
    frac = predicted_samples_per_s(profile, model, wanted) / host
    if FLOOR_FRACTION * 1.01 < frac < 0.99:  # neither capped nor raised: the directive itself
        assert applied == pytest.approx(wanted, rel=1e-3)
    if frac >= 1.0:  # capped at one core: never claims more than the host computes
        assert applied <= wanted * (1 + 1e-9)
        assert q == PERIOD_US


@given(st.floats(1.2, 1.5), st.floats(50.0, 2000.0))  # f/2 stays >= rpi4 f_min
def test_halving_the_directive_halves_the_quota_between_floor_and_cap(f, host):
    rpi4 = PRESETS["rpi4"]
    sps = predicted_samples_per_s(rpi4, "mnist", f)
    if not (2 * FLOOR_FRACTION < sps / host / 2 and sps / host < 1.0):
        return
    q_full, _ = plan_quota(rpi4, "mnist", f, host)
    q_half, _ = plan_quota(rpi4, "mnist", f / 2, host)
    assert q_half == pytest.approx(q_full / 2, abs=1)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_nonsense_speeds_are_refused(bad):
    with pytest.raises(ValueError):
        quota_fraction(bad, 100.0)
    with pytest.raises(ValueError):
        quota_fraction(100.0, bad)


def _tree(tmp_path: Path, mounts: str, cgroup: str) -> tuple[Path, Path]:
    m, c = tmp_path / "mounts", tmp_path / "cgroup"
    m.write_text(mounts)
    c.write_text(cgroup)
    return m, c


def test_v1_cpu_controller_is_found_under_this_process_cgroup(tmp_path):
    cpu = tmp_path / "cpu"
    (cpu / "job").mkdir(parents=True)
    (cpu / "job" / "cpu.cfs_quota_us").write_text("-1\n")
    m, c = _tree(tmp_path, f"cgroup {cpu} cgroup rw,nosuid,cpu,cpuacct 0 0\n"
                 "cgroup2 /nowhere cgroup2 rw 0 0\n",
                 "4:cpu,cpuacct:/job\n0::/\n")
    ctl = find_cpu_controller(m, c)
    assert ctl == CpuController(1, cpu / "job")


def test_v2_with_cpu_is_preferred_over_v1(tmp_path):
    unified = tmp_path / "unified"
    (unified / "a").mkdir(parents=True)
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    m, c = _tree(tmp_path, f"cgroup2 {unified} cgroup2 rw 0 0\ncgroup {cpu} cgroup rw,cpu 0 0\n",
                 "3:cpu:/\n0::/a\n")
    assert find_cpu_controller(m, c) == CpuController(2, unified / "a")


def test_no_cpu_controller_says_why_in_one_line(tmp_path):
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("memory pids\n")
    m, c = _tree(tmp_path, f"cgroup2 {unified} cgroup2 rw 0 0\n", "0::/\n")
    with pytest.raises(CgroupError) as err:
        find_cpu_controller(m, c)
    assert "no cpu controller" in str(err.value) and "\n" not in str(err.value)


def test_cgroup_falls_back_to_emulation_with_one_warning_when_unavailable(monkeypatch, caplog):
    import fedcure_app.devices.cgroup as cg

    def missing(*_a, **_k):
        raise CgroupError(2, "no cgroup cpu controller is mounted")

    monkeypatch.setattr(cg, "find_cpu_controller", missing)
    with caplog.at_level(logging.WARNING, logger="fedcure_app.devices"):
        act = make_actuator("cgroup", PRESETS["rpi4"], model="mnist", host_sps=500.0)
    assert isinstance(act, EmulatedThrottle)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "no cgroup cpu controller" in lines[0]


def test_cgroup_on_a_fake_v1_tree_writes_period_quota_and_the_pid(tmp_path):
    base = tmp_path / "cpu"
    base.mkdir()
    (base / "cgroup.procs").write_text("")
    ctl = CpuController(1, base)
    act = CgroupCpuBandwidth(PRESETS["rpi4"], "mnist", host_sps=1000.0, name="tbtest-fake",
                             controller=ctl, pid=4242)
    d = base / "tbtest-fake"
    assert (d / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
    assert (d / "cgroup.procs").read_text() == "4242"
    applied = act.apply(1.5)
    q = int((d / "cpu.cfs_quota_us").read_text())
    sps = predicted_samples_per_s(PRESETS["rpi4"], "mnist", 1.5)
    assert q == round(sps / 1000.0 * PERIOD_US)
    assert applied == pytest.approx(1.5, rel=1e-3)
    assert act.stretch(2.5, applied) == 2.5


# ----------------------------------------------------------------------- a real cgroup (root)

_BUSY = """
import sys, time
for line in sys.stdin:
    n = int(line)
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    for i in range(n):
        x += i * i
    print(time.perf_counter() - t0, time.process_time() - c0, flush=True)
"""


def _busy_child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _BUSY], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def _run(child: subprocess.Popen, n: int) -> float:
    """Wall seconds of ``n`` iterations per CPU second they used: the slowdown the quota (and
    nothing else) imposes, whatever else makes an iteration slower on a busy machine."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"{n}\n")
    child.stdin.flush()
    wall, cpu = map(float, child.stdout.readline().split())
    return wall / cpu


def test_halving_the_directive_really_doubles_a_busy_loop_time():
    ctl = require_cgroup()
    child = _busy_child()
    act = None
    try:
        # how fast an unthrottled core runs the loop: the loop plays the model, rpi4 the device
        n = 200_000
        t0 = time.perf_counter()
        _run(child, n)
        while time.perf_counter() - t0 < 0.05:
            n *= 2
            t0 = time.perf_counter()
            _run(child, n)
        rpi4 = PRESETS["rpi4"]
        # host speed set so that rpi4 at f_max needs an eighth of a core, at f_max/2 a
        # sixteenth (small shares, so that other load on the machine does not decide the times)
        host = 8 * predicted_samples_per_s(rpi4, "mnist", rpi4.f_max_ghz)
        act = CgroupCpuBandwidth(rpi4, "mnist", host, name=f"tbtest-busy-{os.getpid()}",
                                 controller=ctl, pid=child.pid)
        # the quota is under test, not the scheduler's fairness: other load on this machine
        # must not keep the loop from the share the quota allows
        os.setpriority(os.PRIO_PROCESS, child.pid, -10)
        # and on one CPU, so that the quota is not spent on two CPUs' runqueues at once
        os.sched_setaffinity(child.pid, {0})
        assert str(child.pid) in (act.path / "cgroup.procs").read_text().split()
        work = n * 2  # about 0.1 s of one free core: 0.8 s at an eighth of it
        full, ratios = [], []
        for _ in range(5):  # interleaved pairs, so that a burst of other load hits both alike
            act.apply(rpi4.f_max_ghz)
            full.append(_run(child, work))
            act.apply(rpi4.f_max_ghz / 2)
            ratios.append(_run(child, work) / full[-1])
        # an eighth of a core: about 8x longer. The kernel enforces a quota at its tick, so one
        # run may get a little more than its share; the median pair says what a directive does
        # (the 1.7-2.3x), not the luckiest run of either kind
        assert 6.0 <= statistics.median(full) <= 10.0, (full, os.getloadavg())
        assert 1.7 <= statistics.median(ratios) <= 2.3, (full, ratios, os.getloadavg())
    finally:
        if act is not None:
            act.close()
        child.kill()
        child.wait()
    assert act is not None and not act.path.exists()


def test_remove_cgroups_removes_only_the_prefix_it_is_given():
    ctl = require_cgroup()
    tag = f"tbtest-rm-{os.getpid()}"
    mine, other = ctl.base / f"{tag}-a", ctl.base / f"x{tag}"
    mine.mkdir()
    other.mkdir()
    try:
        assert remove_cgroups(tag, ctl) == [mine]
        assert not mine.exists() and other.exists()
    finally:
        for d in (mine, other):
            if d.exists():
                d.rmdir()


def test_a_cgroup_whose_process_exits_is_removed_at_close():
    ctl = require_cgroup()
    child = _busy_child()
    act = CgroupCpuBandwidth(PRESETS["laptop"], "mnist", 100.0,
                             name=f"tbtest-exit-{os.getpid()}", controller=ctl, pid=child.pid)
    child.kill()
    child.wait()
    deadline = time.monotonic() + 5
    act.close()
    while act.path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not act.path.exists()
