"""The hop table's math on synthetic events, and the trace files it reads."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcure_app.runtime import tracing
from fedcure_app.runtime.hops import MESSAGE_HOPS, hop_table, message_times, round_hops, stats

# one message's path: (event, seconds after the push); sn.sending/sn.sent carry the reply id
PATH = [("edge.push", 0.0), ("sn.receive", 0.030), ("sn.received", 0.040),
        ("exe.acquired", 0.045), ("exe.input", 0.060), ("app.start", 0.065),
        ("app.train_start", 0.070), ("app.train_end", 0.090), ("app.end", 0.095),
        ("exe.push", 0.105), ("sn.sending", 0.115), ("sn.sent", 0.125),
        ("edge.pulled", 0.140)]


def round_events(task: str, r: int, t0: float, delays: dict[str, float]) -> list[dict]:
    """An edge round starting at t0: its push begins after 5 ms and returns after 25 ms, each
    message's PATH is shifted by its client's extra delay (added to the SuperNode pull), 3 ms
    to aggregate after the last pull."""
    key = f"{task}/e{r}"
    out = [{"t": t0, "ev": "edge.round_start", "key": key},
           {"t": t0 + 0.025, "ev": "edge.pushed", "key": key}]
    last = 0.0
    for client, extra in delays.items():
        mid, rid = f"m-{key}-{client}", f"r-{key}-{client}"
        for ev, dt in PATH:
            t = t0 + 0.005 + dt + (extra if ev != "edge.push" else 0.0)
            e = {"t": t, "ev": ev, "key": rid if ev in ("sn.sending", "sn.sent") else mid}
            if ev == "edge.push":
                e.update(round=key, node=7)
            if ev == "edge.pulled":
                e["reply"] = rid
                last = max(last, t)
            out.append(e)
    out.append({"t": last + 0.003, "ev": "edge.round_done", "key": key})
    return out


def test_each_hop_is_the_time_between_its_two_events_and_reply_ids_map_to_their_message():
    events = round_events("r0-c0-v0", 0, 100.0, {"a": 0.0, "b": 0.050})
    times = message_times(events)
    assert set(times) == {"m-r0-c0-v0/e0-a", "m-r0-c0-v0/e0-b"}
    msgs, rounds = hop_table(events)
    by = {h.hop: h for h in msgs}
    expected = dict(zip([h for h, _, _ in MESSAGE_HOPS],
                        np.diff([t for ev, t in PATH if ev != "sn.received"])))
    expected["edge push -> SuperNode pull"] = 0.030  # client b's extra 50 ms land here
    for hop, want in expected.items():
        assert by[hop].count == 2
        if hop == "edge push -> SuperNode pull":
            assert by[hop].median_s == pytest.approx((0.030 + 0.080) / 2)
        else:
            assert by[hop].median_s == pytest.approx(want), hop
    r = {h.hop: h for h in rounds}
    assert r["edge ServerApp send"].median_s == pytest.approx(0.025)
    assert r["slowest message"].median_s == pytest.approx(0.140 + 0.050)
    assert r["edge aggregates"].median_s == pytest.approx(0.003)
    assert r["round wall"].median_s == pytest.approx(0.005 + 0.190 + 0.003)
    assert r["round overhead"].median_s == pytest.approx(0.198 - 0.020)


def test_missing_events_leave_a_hop_out_instead_of_guessing():
    events = [e for e in round_events("t", 0, 5.0, {"a": 0.0})
              if e["ev"] not in ("exe.acquired", "sn.sent")]
    by = {h.hop: h for h in hop_table(events)[0]}
    assert by["SuperNode task -> executor"].count == 0
    assert np.isnan(by["SuperNode task -> executor"].median_s)
    assert by["SuperLink -> edge pull"].count == 0
    assert by["training"].count == 1
    # a round never finished (no round_done) is not a round
    partial = [e for e in round_events("t", 1, 9.0, {"a": 0.0}) if e["ev"] != "edge.round_done"]
    assert round_hops(partial)["round wall"] == []


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=50))
def test_stats_are_numpys_median_and_95th_percentile(values):
    s = stats("x", values)
    assert s.count == len(values)
    assert s.median_s == pytest.approx(float(np.median(values)))
    assert s.p95_s == pytest.approx(float(np.percentile(values, 95)))
    assert min(values) <= s.median_s <= s.p95_s <= max(values)


@given(st.lists(st.floats(0.0, 0.5), min_size=1, max_size=6),
       st.floats(0.0, 1e6, allow_nan=False))
def test_the_slowest_message_and_the_wall_follow_the_latest_client(delays, t0):
    events = round_events("t", 0, t0, {str(i): d for i, d in enumerate(delays)})
    r = round_hops(events)
    assert r["slowest message"][0] == pytest.approx(0.140 + max(delays), abs=1e-6)
    assert r["round wall"][0] == pytest.approx(0.148 + max(delays), abs=1e-6)


def test_trace_writes_one_file_per_process_only_when_enabled(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(tracing.TRACE_ENV, raising=False)
    tracing.trace("edge.push", "m1")
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(tracing.TRACE_ENV, str(tmp_path / "trace"))
    tracing.set_role("edge0")
    tracing.trace("edge.push", "m1", round="t/e0", node=3)
    tracing.trace("edge.pulled", "m1", t=12.5, reply="r1")
    (tmp_path / "trace" / "broken.jsonl").write_text('{"t": 1, "ev": "x", "key"\n')
    events = tracing.load_events(tmp_path / "trace")
    assert [e["ev"] for e in events] == ["edge.pulled", "edge.push"]  # sorted by time
    assert events[0]["t"] == 12.5 and events[0]["reply"] == "r1"
    assert events[1]["proc"].startswith("edge0-") and events[1]["node"] == 3


def test_flowers_supernode_log_lines_become_events(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(tracing.TRACE_ENV, str(tmp_path))
    logger = logging.getLogger("test-flwr-tracer")
    logger.setLevel(logging.INFO)
    handler = tracing.trace_flower_log("test-flwr-tracer")
    try:
        logger.info("Receiving: %s message (ID: %s)", "train", "ab12")
        logger.info("Received successfully")
        logger.info("Sending: %s message (ID: %s)", "train", "cd34")
        logger.info("Sent successfully")
        logger.info("something else")
    finally:
        logger.removeHandler(handler)
    got = [(e["ev"], e["key"]) for e in tracing.load_events(tmp_path)]
    assert got == [("sn.receive", "ab12"), ("sn.received", "ab12"), ("sn.sending", "cd34"),
                   ("sn.sent", "cd34")]


def test_the_supernode_log_lines_the_tracer_reads_are_still_flowers():
    """Tracing reads the pinned Flower's SuperNode log lines; this fails when Flower changes them
    (the hop table would lose its SuperNode events, nothing else)."""
    import inspect

    from flwr.supernode import start_client_internal

    from fedcure_app.flower.fastpath.gate import version_problem

    assert version_problem(env={}) is None
    source = inspect.getsource(start_client_internal)
    for text in ('"Receiving: %s message (ID: %s)"', '"Received successfully"',
                 '"Sending: %s message (ID: %s)"', '"Sent successfully"'):
        assert text in source, text


def test_the_executors_first_heartbeat_comes_well_before_flower_expires_the_task():
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

    from client.executor import HEARTBEAT_DELAY_S

    assert HEARTBEAT_DELAY_S <= HEARTBEAT_DEFAULT_INTERVAL * HEARTBEAT_PATIENCE / 4
