"""A client dies mid edge round (kill -9 of the client and its Flower SuperNode, real processes
on loopback): its edge server finishes the round with the clients that answered (Flower reports
the dead SuperNode once its heartbeat lapses; ``--edge-timeout`` bounds a hung one), with the
FedAvg weights renormalised over them, reports the drop-out to the cloud, the run goes on, and
the client, started again, rejoins its coalition and trains in later tasks."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from fedcure_app.flower.node_data import read_applied
from fedcure_app.runtime.processes import Child, alive, descendants

ROUNDS, TAU_E, VICTIM = 4, 12, 2  # τ_e: the kill lands mid-task (an edge round is ~0.1 s)


def _launch_args(out: Path) -> argparse.Namespace:
    from fedcure_app.cli.launch import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args([
        "launch", "--edges", "1", "--clients", "3", "--rounds", str(ROUNDS),
        "--dataset", "digits", "--partition", "iid", "--tau-e", str(TAU_E), "--tau-c", "10",
        "--lr", "0.1", "--eval-every", "1", "--edge-timeout", "60", "--no-progress",
        "--out", str(out)])


def _wait(what: str, predicate, timeout_s: float, roles) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        code = roles.cloud.poll()
        if code is not None:
            raise AssertionError(f"the cloud exited ({code}) while waiting for {what}:\n"
                                 f"{roles.cloud.tail(40)}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; cloud log:\n{roles.cloud.tail(40)}")


def _kill9(child: Child) -> list[int]:
    """SIGKILL a process and everything it started (no chance to clean up)."""
    pids = [child.pid, *descendants(child.pid)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.proc.wait(10)
    return pids


def test_a_client_killed_mid_edge_round_is_dropped_and_rejoins(tmp_path: Path):
    from fedcure_app.cli.launch import Roles, StatusPoller, config_from_args, start_roles

    out = tmp_path / "run"
    args = _launch_args(out)
    cfg = config_from_args(args)
    roles = Roles()
    killed: list[int] = []
    status = None
    try:
        record = start_roles(cfg, args, out, roles)
        status = StatusPoller(record["cloud"], None)

        def rounds_done() -> int:
            s = status()
            return 0 if s is None else int(s.round)

        victim = roles.clients[VICTIM]
        data_file = out / "work" / f"client{VICTIM}" / "node-data.npz"
        # the victim has just answered edge round 0 of the first task: rounds 1.. are to come
        _wait("the victim's first edge round",
              lambda: any(a["edge_round"] == 0 for a in read_applied(data_file)), 300, roles)
        first_task = read_applied(data_file)[0]["task"]
        killed = _kill9(victim)
        # the task finishes without it once the edge timeout passes
        _wait("the cloud's first arrival", lambda: rounds_done() >= 1, 300, roles)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   GRPC_VERBOSITY="NONE")
        again = Child(f"client{VICTIM}-again", victim.argv,
                      log_path=out / "logs" / f"client{VICTIM}-again.log", env=env)
        roles.clients.append(again)
        assert roles.cloud.wait(420) == 0, roles.cloud.tail(40)
        assert again.wait(60) == 0, again.tail(40)
    finally:
        if status is not None:
            status.close()
        roles.stop()
    assert not [p for p in killed if alive(p)]
    result = json.loads((out / "result.json").read_text())
    records = result["records"]
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    first = next(r for r in records if r["task_id"] == first_task)
    assert VICTIM in first["dropped"], first
    # the others' work in that task was kept and aggregated (weights renormalised over them:
    # tests/simulation/test_edge.py pins the arithmetic down)
    assert first["xi"] > 0 and first["energy_j"] > 0 and first["accuracy"] is not None
    # after its restart the victim trained again in later tasks of its coalition
    rejoined = [a for a in read_applied(data_file) if a["task"] != first_task]
    later = {r["task_id"] for r in records if r["round"] > first["round"]
             and VICTIM not in r["dropped"] and str(VICTIM) in r["frequencies_ghz"]}
    assert later, f"the victim never trained again: {[(r['round'], r['dropped']) for r in records]}"
    assert later <= {a["task"] for a in rejoined}
    assert result["final_accuracy"] > 0.3
