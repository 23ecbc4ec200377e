"""bench/edge_scale.py: which kind a process is, cores per kind over a window, the edge's
memory, and the table with missing figures."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.deploy_round import OTHER_KIND, kind_of, kind_unsettled, process_kind, process_tree
from bench.edge_scale import EDGE_KINDS, Sampler, table


def test_the_held_superlink_and_a_forked_trainer_are_told_apart():
    assert kind_of("python3 -m edge_server.held_superlink --host 127.0.0.1", "python3") == \
        "SuperLink"
    assert kind_of("python3 -m client.supernode --argv-file f", "python3") == "SuperNode"
    assert kind_of("python3 -m client.executor --x", "fedcure-trainer") == "trainer"
    assert kind_of("python3 -m cloud_server.cli --listen x", "python3") == "cloud"


def test_a_kind_read_between_fork_and_exec_is_read_again():
    # the edge role's SuperLink read before its exec shows the edge role's command line
    assert kind_unsettled("edge role", "edge role")
    assert kind_unsettled(OTHER_KIND, "cloud") and kind_unsettled("executor", "client role")
    assert not kind_unsettled("SuperLink", "edge role")
    assert not kind_unsettled("trainer", "executor")


def test_the_sampler_reads_a_childs_kind_again_once_it_has_exec_d(monkeypatch):
    import bench.edge_scale as es

    tree = {10: ["S", "1"] + ["0"] * 20, 11: ["S", "10"] + ["0"] * 20}
    kinds = iter(["edge role", "edge role", "SuperLink"])
    monkeypatch.setattr(es, "process_tree", lambda root: tree)
    monkeypatch.setattr(es, "process_kind", lambda pid: next(kinds))
    s = Sampler(root=10)
    s.sample()  # the child still shows its parent's command line
    assert s.kind == {10: "edge role", 11: "edge role"}
    s.sample()
    assert s.kind == {10: "edge role", 11: "SuperLink"}


def test_the_process_tree_holds_a_child_and_its_grandchild_and_not_its_parent():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; "
                              "time.sleep(30)']); time.sleep(30)"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            tree = process_tree(child.pid)
            if len(tree) >= 2:
                break
            subprocess.run(["sleep", "0.05"])
        assert child.pid in tree and len(tree) == 2 and os.getpid() not in tree
        grandchild = next(pid for pid in tree if pid != child.pid)
        assert int(tree[grandchild][1]) == child.pid  # field 1: the parent
    finally:
        for pid in process_tree(child.pid):
            os.kill(pid, 9)
        child.wait()
    assert process_kind(child.pid) is None  # reaped: gone from /proc


def _sampler(series) -> Sampler:
    s = Sampler(root=0)
    s.kind = {1: "SuperLink", 2: "SuperNode", 3: "SuperNode", 4: "edge role"}
    s.series = series
    return s


def test_cores_are_cpu_seconds_per_wall_second_between_the_nearest_samples():
    s = _sampler([
        (0.0, {1: 1.0, 2: 2.0}, {}),
        (10.0, {1: 2.0, 2: 2.5, 3: 0.5}, {}),  # process 3 was born inside the window
        (20.0, {1: 9.0, 2: 3.0}, {}),
    ])
    cores = s.cores(0.1, 9.9)
    assert cores["SuperLink"] == 0.1
    assert abs(cores["SuperNode"] - 0.1) < 1e-12  # (0.5 + 0.5) / 10
    assert s.cores(5.0, 5.0) == {}


def test_the_edges_memory_is_the_largest_sum_at_one_sample():
    s = _sampler([
        (0.0, {}, {"SuperLink": 100, "edge role": 50, "SuperNode": 999}),
        (1.0, {}, {"SuperLink": 120, "edge ServerApp": 40}),
    ])
    assert s.peak_rss(EDGE_KINDS) == 160


def test_missing_figures_show_as_dashes():
    row = {"clients": 32, "rounds": 0, "wall_median_s": None, "slowest_training_median_s": None,
           "overhead_median_s": None, "overhead_p95_s": None, "idle_cores": None,
           "train_cores_by_kind": {}, "edge_rss_mb": 300.0}
    line = table([row]).splitlines()[-1]
    assert line.startswith("| 32 | 0 | — |") and line.endswith("| 300 |")
