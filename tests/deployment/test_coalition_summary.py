"""The end-of-run coalition summary of ``fedcure launch``/``fedcure testbed``, from a
``result.json``: each coalition's devices, its mean task latency without its first task, T̂ at
the end, its share of the rounds and the frequencies directed and applied per device; and the
warnings a run printed go into ``result.json``."""

from __future__ import annotations

import json
import logging

import pytest

from fedcure_app.cli.coalition_summary import (
    coalition_rows,
    demonstrated,
    devices_text,
    ghz_text,
    latency_spread,
)
from fedcure_app.cli.launch import WarningLines, add_warnings


def _record(m: int, latency: float, freqs: dict, applied: dict, startup: float = 0.0) -> dict:
    return {"coalition": m, "latency_s": latency, "startup_s": startup,
            "frequencies_ghz": freqs, "applied_ghz": applied}


RESULT = {
    "coalitions": [[0, 1], [2, 3, 4]],
    "clients": [{"id": 0, "edge": 0, "device": "rpi4"}, {"id": 1, "edge": 0, "device": "rpi5"},
                {"id": 2, "edge": 1, "device": "rpi5"}, {"id": 3, "edge": 1, "device": "rpi5"},
                {"id": 4, "edge": 1, "device": "rpi5"}],
    "latency_estimate_s": [9.5, 3.1],
    "records": [
        _record(0, 30.0, {"0": 1.5, "1": 1.0}, {"0": 1.5, "1": 1.0}, startup=12.0),
        _record(1, 20.0, {"2": 2.4, "3": 2.4, "4": 2.4}, {"2": 2.4, "3": 2.4, "4": 2.4}),
        _record(1, 3.0, {"2": 2.0, "3": 2.2, "4": 2.4}, {"2": 2.0, "3": 2.2, "4": 2.3}),
        _record(0, 10.0, {"0": 1.5, "1": 1.2}, {"0": 1.4, "1": 1.2}),
        _record(1, 4.0, {"2": 2.0, "3": 2.2, "4": 2.4}, {"2": 2.0, "3": 2.2, "4": 2.3}),
        _record(0, 8.0, {"0": 1.5, "1": 1.4}, {"0": 1.4, "1": 1.4}),
    ],
}


def test_each_coalition_shows_its_devices_latency_without_the_first_task_and_frequencies():
    rows = coalition_rows(RESULT)
    assert [r["devices"] for r in rows] == [{"rpi4": 1, "rpi5": 1}, {"rpi5": 3}]
    assert [r["tasks"] for r in rows] == [3, 3]
    assert rows[0]["mean_latency_s"] == pytest.approx(9.0)  # (10 + 8) / 2: not the 30 s first
    assert rows[1]["mean_latency_s"] == pytest.approx(3.5)
    assert [r["t_hat_s"] for r in rows] == [9.5, 3.1]
    assert [r["share"] for r in rows] == [0.5, 0.5]
    assert rows[0]["directed_ghz"] == {"rpi4": 1.5, "rpi5": pytest.approx(1.3)}
    assert rows[0]["applied_ghz"] == {"rpi4": 1.4, "rpi5": pytest.approx(1.3)}
    assert rows[1]["directed_ghz"] == {"rpi5": pytest.approx(2.2)}
    assert latency_spread(rows) == pytest.approx(9.0 / 3.5)
    assert devices_text(rows[1]["devices"]) == "rpi5×3"
    assert ghz_text(rows[0]["directed_ghz"]) == "rpi4 1.50, rpi5 1.30"


def test_a_coalition_with_one_task_has_no_mean_and_no_spread():
    one = {**RESULT, "records": RESULT["records"][:2]}
    rows = coalition_rows(one)
    assert [r["mean_latency_s"] for r in rows] == [None, None]
    assert rows[0]["directed_ghz"] == {"rpi4": 1.5, "rpi5": 1.0}  # its only task then
    assert latency_spread(rows) is None


def test_the_summary_says_what_the_run_demonstrated_in_plain_words():
    result = {**RESULT, "initial_jsd": 0.693, "formed_jsd": 0.458,
              "formation": {"initial_assignment": [0, 0, 1, 1, 1],
                            "assignment": [0, 1, 1, 0, 1], "moves": 3},
              "participation": {"share": [0.5, 0.5], "delta": [0.4, 0.6]},
              "initial_accuracy": 0.1, "final_accuracy": 0.62, "rounds": 6}
    said = dict(demonstrated(result))
    assert list(said) == ["latency spread", "formation", "directives", "scheduling", "learning"]
    assert said["latency spread"].startswith(
        "coalition 0 (rpi4, rpi5) took 2.57× as long per task as coalition 1 (rpi5×3)")
    assert "busy" not in said["latency spread"]
    assert said["formation"].startswith("2 of 5 clients moved to another edge server")
    assert "JSD 0.693 → 0.458 nats" in said["formation"]
    # means over every task: rpi4 directed 1.5 and applied 1.5, 1.4, 1.4
    assert "rpi4 1.50 → 1.43" in said["directives"], said["directives"]
    assert said["scheduling"] == ("shares of the rounds 0.50, 0.50 against the targets δ 0.40, "
                                  "0.60 (each coalition's share of the data)")
    assert said["learning"] == "test accuracy 10.0 % → 62.0 % in 6 global rounds"
    busy = {**result, "warnings": [{"kind": "testbed", "detail": "this host is busy: ..."}]}
    assert "this host was busy" in dict(demonstrated(busy))["latency spread"]


def test_a_run_without_formation_or_tasks_says_so():
    said = dict(demonstrated({"coalitions": [[0], [1]], "records": [], "rounds": 0,
                              "clients": [{"id": 0, "edge": 0, "device": "rpi4"},
                                          {"id": 1, "edge": 1, "device": "rpi4"}]}))
    assert said["latency spread"] == "too few tasks per coalition to compare their latencies"
    assert said["formation"].startswith("none")
    assert said["directives"] == "no task was sent"
    assert said["learning"] == "test accuracy - → - in 0 global rounds"


def test_the_warnings_a_run_logs_are_appended_to_result_json(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"warnings": [{"kind": "unreachable-share", "detail": "x"}]}))
    caught = WarningLines()
    logger = logging.getLogger("fedcure.test.summary")
    logger.addHandler(caught)
    try:
        logger.info("not a warning")
        logger.warning("quotas add up to %.2f cores", 2.38)
        logger.error("a role\nfailed")
    finally:
        logger.removeHandler(caught)
    result = add_warnings(path, caught.lines, "testbed")
    assert result == json.loads(path.read_text())
    assert result["warnings"] == [
        {"kind": "unreachable-share", "detail": "x"},
        {"kind": "testbed", "detail": "quotas add up to 2.38 cores"},
        {"kind": "testbed", "detail": "a role failed"}]
