"""bench/testbed_memory.py: which role a process belongs to and the table's arithmetic."""

from __future__ import annotations

import pytest

from bench.testbed_memory import MIB, classify, summarise, table


def test_processes_are_told_apart_by_command_line_and_a_forked_trainer_by_its_name():
    assert classify("python3 -m client.executor --runtime-api-address-file f", "python3") == (
        "client", "executor")
    assert classify("python3 -m client.executor --runtime-api-address-file f",
                    "fedcure-trainer") == ("client", "trainer")
    assert classify("python3 /usr/bin/flower-superlink --host 10.0.0.2", "flower-superlink") == (
        "edge", "superlink")
    assert classify("python3 -m cloud_server.cli --listen x", "python3") == ("cloud", "role")
    assert classify("ip netns exec x tc qdisc", "ip") is None


def test_each_kind_is_the_mean_of_its_processes_medians_inside_the_training_window():
    c = ("client", "role")
    t = ("client", "trainer")
    e = ("edge", "role")
    series = [
        (0.0, {1: (*c, 500 * MIB)}),  # before the window: left out
        (1.0, {1: (*c, 10 * MIB), 2: (*c, 30 * MIB), 3: (*t, 100 * MIB), 9: (*e, 40 * MIB)}),
        (2.0, {1: (*c, 20 * MIB), 2: (*c, 30 * MIB), 3: (*t, 120 * MIB), 9: (*e, 40 * MIB)}),
        (3.0, {1: (*c, 30 * MIB), 2: (*c, 30 * MIB), 3: (*t, 110 * MIB), 9: (*e, 40 * MIB)}),
        (4.0, {1: (*c, 900 * MIB)}),  # after it: left out
    ]
    got = summarise(series, {"start": 1.0, "end": 3.0})
    rows = {(r["role"], r["kind"]): r for r in got["rows"]}
    # medians: client 1 → 20, client 2 → 30; one trainer → 110; two clients share one trainer
    assert rows[c]["processes"] == 2 and rows[c]["each"] == pytest.approx(25 * MIB)
    assert rows[t]["each"] == pytest.approx(110 * MIB)
    assert rows[t]["per_instance"] == pytest.approx(55 * MIB)
    assert got["instances"] == {"client": 2, "edge": 1}
    assert got["peak_total"] == (20 + 30 + 120 + 40) * MIB
    text = table(got)
    assert "| **per client** | **80** |" in text and "| edge | `fedcure-edge` (1) | 40 |" in text


def test_a_window_without_samples_is_an_error_not_an_empty_table():
    with pytest.raises(SystemExit, match="no sample"):
        summarise([(0.0, {})], {"start": 1.0, "end": 2.0})
