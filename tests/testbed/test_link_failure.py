"""A client's link fails mid edge round and comes back (root; ``fedcure testbed``): its veth is
set down while it trains, the edge round goes on without it once the edge timeout passes, the
client (its processes untouched) rejoins and trains in later tasks, and no update is lost or
counted twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from fedcure_app.flower.node_data import read_applied
from fedcure_app.testbed import netns
from fedcure_app.testbed.plan import make_plan, run_prefix
from tests.interrupts import end_process
from tests.kernel import require_cgroup, require_netns

ROUNDS, TAU_E, VICTIM, EDGE_TIMEOUT = 4, 3, 2, 15.0


def _grep(out: Path, text: str) -> bool:
    for f in out.rglob("*.log"):
        try:
            if text in f.read_text(errors="replace"):
                return True
        except OSError:
            pass
    return False


def test_a_link_down_mid_round_drops_the_client_for_that_task_and_it_rejoins(tmp_path):
    require_netns()
    require_cgroup()
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedcure_app.cli", "testbed", "--out", str(out), "--prefix",
         "tblink", "--edges", "1", "--clients", "3", "--rounds", str(ROUNDS), "--dataset",
         "digits", "--partition", "iid", "--tau-e", str(TAU_E), "--tau-c", "10", "--lr", "0.1",
         "--eval-every", "1", "--edge-timeout", str(EDGE_TIMEOUT), "--no-progress",
         "--timeout", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    prefix = run_prefix("tblink", proc.pid)
    # the plan's names depend only on the prefix and the counts (fedcure_app.testbed.plan)
    from fedcure_app.devices import PRESETS

    plan = make_plan(prefix, 1, [PRESETS["rpi4"]] * 3, None)
    victim = plan.clients[VICTIM]
    data_file = out / "work" / f"client{VICTIM}" / "node-data.npz"
    try:
        end = time.monotonic() + 300
        while not (data_file.exists() and any(a["edge_round"] == 0
                                              for a in read_applied(data_file))):
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        first_task = read_applied(data_file)[0]["task"]
        netns.set_link(plan, victim, up=False)
        down_at = time.monotonic()
        while not _grep(out, f"client {VICTIM} dropped"):
            assert proc.poll() is None and time.monotonic() - down_at < EDGE_TIMEOUT + 60, \
                "the edge did not drop the unreachable client"
            time.sleep(0.5)
        dropped_after = time.monotonic() - down_at
        time.sleep(3.0)
        netns.set_link(plan, victim, up=True)
        text, _ = proc.communicate(timeout=600)
    finally:
        end_process(proc)  # SIGTERM: it removes its namespaces and stops its roles
    assert proc.returncode == 0, text[-3000:]
    # the round went on without it within the edge timeout (plus the time its round took)
    assert dropped_after <= EDGE_TIMEOUT + 20, dropped_after
    result = json.loads((out / "result.json").read_text())
    records = result["records"]
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    assert len({r["task_id"] for r in records}) == ROUNDS
    first = next(r for r in records if r["task_id"] == first_task)
    assert VICTIM in first["dropped"], first
    applied = read_applied(data_file)
    # counted once: the victim trained each edge round of each task at most once
    twice = [k for k, n in Counter((a["task"], a["edge_round"]) for a in applied).items()
             if n > 1]
    assert twice == []
    # rejoined: later tasks it was not dropped from have every edge round of its training
    later = [r for r in records if r["round"] > first["round"] and VICTIM not in r["dropped"]]
    assert later, [(r["round"], r["dropped"]) for r in records]
    for r in later:
        assert str(VICTIM) in r["frequencies_ghz"], r
        rounds = sorted(a["edge_round"] for a in applied if a["task"] == r["task_id"])
        assert rounds == list(range(TAU_E)), (r["task_id"], rounds)  # nothing lost
    assert not [n for n in netns.list_namespaces() if n.startswith(prefix)]
