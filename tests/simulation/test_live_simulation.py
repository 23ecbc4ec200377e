"""`fedcure simulate --dashboard`: the simulation engine feeds the same live view as the cloud,
on its simulated clock, and the page shows exactly the rounds the engine recorded."""

from __future__ import annotations

import json
import urllib.request

import pytest

from fedcure_app.cli import main
from fedcure_app.federation import profiles_for
from fedcure_app.live.server import LiveServer
from fedcure_app.live.simulation import SimulationFeed
from fedcure_app.simulation.engine import simulate
from tests.simulation.test_engine import digits, tiny  # noqa: F401 - the fixture


def fetch(url: str):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def test_the_live_view_follows_the_engine_round_by_round(digits):  # noqa: F811
    cfg = tiny(**{"global-rounds": 6, "eval-every": 2})
    feed = SimulationFeed(cfg)
    server = LiveServer(feed, "127.0.0.1", 0)
    server.start()
    seen = []

    def on_state(strategy, records, now, acc0):
        feed.update(strategy, records, now, acc0)
        state = json.loads(fetch(server.url + "api/state"))
        assert state["source"] == "simulation" and state["clock"] == "simulated"
        assert state["mode"] == "simulation"  # what the page's title calls the run
        # the model version is the global round: one edge model mixed in per round
        assert state["version"] == state["round"]
        assert state["round"] == len(records) == strategy.round
        assert state["version"] == strategy.version
        assert state["elapsed_s"] == pytest.approx(now, abs=1e-3)
        assert {c["coalition"] for c in state["coalitions"] if c["state"] == "training"} == set(
            strategy.in_flight)
        # each client's device type: the profile the engine simulates it with
        assert [c["device"] for c in state["clients"]] == [
            p.name for p in profiles_for(cfg)][:len(state["clients"])]
        if records:
            fields = state["round_fields"]
            last = dict(zip(fields, state["history"][-1]))
            assert last["queues"] == pytest.approx(records[-1]["queues"])
            assert last["latency_s"] == pytest.approx(records[-1]["latency_s"])
            assert last["accuracy"] == (None if records[-1]["accuracy"] is None
                                        else pytest.approx(records[-1]["accuracy"]))
        seen.append(state["round"])

    try:
        result = simulate(cfg, dataset=digits, on_state=on_state)
        feed.finish()
        assert seen == list(range(0, 7))
        assert json.loads(fetch(server.url + "api/state"))["phase"] == "done"
        text = fetch(server.url + "metrics")
        assert 'fedcure_info{clock="simulated",mode="simulation",source="simulation"} 1.0' in text
        assert f"fedcure_global_version {float(result['records'][-1]['version'])}" in text
    finally:
        server.stop()


def test_simulate_refuses_an_exposed_dashboard_without_a_token(tmp_path, capsys):
    code = main(["simulate", "--dataset", "digits", "--rounds", "2", "--out", str(tmp_path),
                 "--dashboard", "0.0.0.0:0", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dashboard-token" in err[0], err
    assert not any(tmp_path.iterdir())
