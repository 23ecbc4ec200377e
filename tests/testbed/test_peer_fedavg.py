"""``fedcure testbed --peer fedavg`` for real (root): Flower's own FedAvg on one stock SuperLink,
the testbed's clients as stock SuperNodes training under their CPU quotas at f_max, compared
with a FedCure run's records (``--against``, here a small FedCure-shaped result so that the test
runs the peer alone); nothing of it is left on the machine afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fedcure_app.config import FedCureConfig
from fedcure_app.testbed import netns
from tests.kernel import require_cgroup, require_netns


def _fedcure_run(folder: Path) -> None:
    """A finished FedCure run's result.json as the comparison reads it."""
    folder.mkdir(parents=True)
    cfg = FedCureConfig().model_dump(mode="json", by_alias=True)
    records = [{"round": 1, "time_s": 4.0, "accuracy": 0.2},
               {"round": 2, "time_s": 8.0, "accuracy": 0.3}]
    (folder / "result.json").write_text(json.dumps({"config": cfg, "records": records,
                                                    "rounds": 2}))


def test_flowers_fedavg_runs_on_the_testbed_and_is_compared_with_fedcure(tmp_path):
    require_netns()
    cgroups = require_cgroup()
    out, against = tmp_path / "cmp", tmp_path / "fedcure"
    _fedcure_run(against)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, "-m", "fedcure_app.cli", "testbed", "--peer", "fedavg", "--against",
         str(against), "--out", str(out), "--prefix", "tbpeer", "--dataset", "digits",
         "--edges", "1", "--clients", "2", "--rounds", "2", "--tau-c", "5", "--mix",
         "rpi4,rpi5", "--host-samples-per-s", "8000", "--no-progress", "--no-dashboard",
         "--timeout", "300"], capture_output=True, text=True, env=env, timeout=500)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    peer = json.loads((out / "fedavg" / "result.json").read_text())
    assert peer["strategy"] == "flwr.serverapp.strategy.fedavg.FedAvg"  # Flower's own
    assert peer["complete"] and [r["round"] for r in peer["records"]] == [0, 1, 2]
    times = [r["time_s"] for r in peer["records"]]
    assert times == sorted(times) and times[-1] > 0
    # every round aggregated at least one reply; Flower's runtime may lose a reply on a loaded
    # host (a flwr-clientapp that starts slower than Flower's heartbeat patience)
    assert 2 <= peer["client_tasks"] <= 2 * 2
    assert peer["client_steps"] == 5 * peer["client_tasks"]
    # every client trained under its CPU quota at its device's top frequency
    profiles = {p["name"]: p for p in json.loads((out / "fedavg" / "profiles.json").read_text())}
    applied = [json.loads(line) for f in (out / "fedavg").glob("work/client*/*.applied.jsonl")
               for line in f.read_text().splitlines()]
    assert len(applied) == peer["client_tasks"] and {a["cpufreq"] for a in applied} == {"cgroup"}
    assert {a["directive_ghz"] for a in applied} == {0.0}  # FedAvg directs no frequency
    for a in applied:  # the quota gives f_max up to its whole microseconds
        f_max = profiles[["rpi4", "rpi5"][a["client"]]]["f_max_ghz"]
        assert abs(a["applied_ghz"] - f_max) < 0.02 * f_max, (a, f_max)
    table = json.loads((out / "peers.json").read_text())
    assert [r["method"] for r in table["rows"]] == ["fedcure", "fedavg"]
    best = max(r["final_accuracy"] for r in table["rows"])
    assert abs(table["target_accuracy"] - 0.9 * best) < 1e-9
    assert table["rows"][0]["time_to_target_s"] in (8.0, None)
    assert "| fedavg |" in (out / "peers.md").read_text()
    assert "fedavg round 2/2" in text
    # the peer's namespaces, cgroups and processes are gone
    assert not [n for n in netns.list_namespaces() if n.startswith("tbpeer")]
    assert not list(cgroups.base.glob("tbpeer*"))
    leftover = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", leftover.stdout
