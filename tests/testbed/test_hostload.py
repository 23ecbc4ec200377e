"""How busy the host is before a testbed starts: /proc/stat parsing, busy cores, the warning."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcure_app.testbed.hostload import (
    BUSY_WARN_CORES,
    CpuTimes,
    busy_cores,
    is_busy,
    measure_busy_cores,
    parse_proc_stat,
)

STAT = """cpu  100 5 50 800 20 3 2 10 0 0
cpu0 50 2 25 400 10 1 1 5 0 0
cpu1 50 3 25 400 10 2 1 5 0 0
intr 12345
"""


def test_the_aggregate_cpu_line_splits_into_busy_and_idle_jiffies():
    # busy: user 100 + nice 5 + system 50 + irq 3 + softirq 2 + steal 10; idle 800 + iowait 20
    assert parse_proc_stat(STAT) == CpuTimes(busy=170, total=990)


def test_a_stat_without_an_aggregate_line_or_with_garbage_is_refused():
    with pytest.raises(ValueError, match="no aggregate"):
        parse_proc_stat("cpu0 1 2 3 4\n")
    with pytest.raises(ValueError, match="unreadable"):
        parse_proc_stat("cpu  1 x 3 4\n")
    with pytest.raises(ValueError, match="unreadable"):
        parse_proc_stat("cpu  1 2\n")


def test_one_core_of_two_busy_reads_as_one_core():
    assert busy_cores(CpuTimes(0, 0), CpuTimes(100, 200), 2) == pytest.approx(1.0)
    assert busy_cores(CpuTimes(5, 10), CpuTimes(5, 10), 2) == 0.0  # no time elapsed
    with pytest.raises(ValueError):
        busy_cores(CpuTimes(0, 0), CpuTimes(1, 2), 0)


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**6),
       st.integers(0, 10**6), st.sampled_from([1, 2, 4, 16]))
def test_busy_cores_are_the_busy_share_of_the_elapsed_time_within_zero_and_all_cores(
        b0, i0, db, di, cores):
    before = CpuTimes(b0, b0 + i0)
    after = CpuTimes(b0 + db, b0 + i0 + db + di)
    got = busy_cores(before, after, cores)
    assert 0.0 <= got <= cores
    if db + di:
        assert got == pytest.approx(cores * db / (db + di))


def test_the_measurement_reads_the_stat_around_its_sleep():
    reads = iter(["cpu  0 0 0 0\n", "cpu  150 0 0 50\n"])
    slept = []
    got = measure_busy_cores(2, 0.5, read=lambda: next(reads), sleep=slept.append)
    assert slept == [0.5] and got == pytest.approx(1.5)
    assert is_busy(got) and not is_busy(BUSY_WARN_CORES / 2) and not is_busy(None)


def test_an_unreadable_stat_measures_nothing():
    def gone() -> str:
        raise OSError("no /proc")

    assert measure_busy_cores(2, 0.1, read=gone, sleep=lambda s: None) is None
    with pytest.raises(ValueError):
        measure_busy_cores(2, 0)


def test_this_host_reads_as_between_idle_and_all_cores():
    got = measure_busy_cores(2, 0.05)
    assert got is None or 0.0 <= got <= 2


def test_the_testbed_warns_when_other_work_leaves_too_few_cores_for_the_quotas(caplog):
    from fedcure_app.testbed.hostload import warn_oversubscribed
    from fedcure_app.devices.cgroup import predicted_samples_per_s
    from fedcure_app.devices import PRESETS

    rpi4, laptop = PRESETS["rpi4"], PRESETS["laptop"]
    host = predicted_samples_per_s(laptop, "mnist", laptop.f_max_ghz)  # a laptop: one core
    # rpi4 + laptop ask about 1.3 cores: they fit an idle 2-core host...
    with caplog.at_level(logging.WARNING):
        assert not warn_oversubscribed([rpi4, laptop], "mnist", host, host_cores=2,
                                       busy_cores=0.1)
    assert not caplog.text
    # ...but not one where another process keeps a core busy
    with caplog.at_level(logging.WARNING):
        assert warn_oversubscribed([rpi4, laptop], "mnist", host, host_cores=2, busy_cores=1.0)
    assert "this host is busy" in caplog.text and "1.00 of its 2 cores" in caplog.text
