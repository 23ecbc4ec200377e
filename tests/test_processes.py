"""Child processes: descendant scans are throttled in poll() and still complete in stop()."""

from __future__ import annotations

import sys
import time

import pytest

import fedcure_app.runtime.processes as processes
from fedcure_app.runtime.processes import Child, alive, descendants


def test_poll_scans_proc_at_most_every_few_seconds(monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = processes.descendants
    monkeypatch.setattr(processes, "descendants", lambda pid: calls.append(pid) or real(pid))
    child = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(20):
            assert child.poll() is None
        assert len(calls) == 1  # one /proc scan for twenty polls
        child._scanned_at -= Child.descendants_every_s
        child.poll()
        assert len(calls) == 2
    finally:
        child.stop(grace_s=1.0)


def test_stop_still_ends_a_grandchild_started_between_scans():
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)")
    child = Child("parent", [sys.executable, "-c", code])
    try:
        child.poll()  # scanned before the grandchild exists (most likely)
        end = time.monotonic() + 20
        while not descendants(child.pid) and time.monotonic() < end:
            time.sleep(0.05)
        grandchildren = descendants(child.pid)
        assert grandchildren
    finally:
        child.stop(grace_s=1.0)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in grandchildren) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in grandchildren)


def test_descendants_from_the_threads_children_lists_match_a_full_scan():
    # a child with a thread that forks (its child is listed under that thread) and a
    # grandchild in a new session: both ways find the same tree
    code = ("import subprocess, sys, threading, time\n"
            "leaf = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
            "mid = [sys.executable, '-c', 'import subprocess, sys, time; "
            "subprocess.Popen(%r, start_new_session=True); time.sleep(60)' % (leaf,)]\n"
            "threading.Thread(target=lambda: subprocess.Popen(leaf)).start()\n"
            "subprocess.Popen(mid)\n"
            "time.sleep(60)\n")
    child = Child("tree", [sys.executable, "-c", code])
    try:
        end = time.monotonic() + 20
        while len(descendants(child.pid)) < 3 and time.monotonic() < end:
            time.sleep(0.05)
        if processes._children(child.pid) is None:
            pytest.skip("this kernel has no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)")
        found = descendants(child.pid)
        assert len(found) == 3
        assert sorted(found) == sorted(processes._descendants_by_scan(child.pid))
    finally:
        child.stop(grace_s=1.0)
    assert descendants(child.pid) == []


@pytest.mark.parametrize("pidfd", [True, False])
def test_wait_gone_returns_once_the_process_exits_and_not_before(monkeypatch, pidfd):
    """A parent watcher (the executor's, the edge ServerApp's) sleeps until the process exits:
    on a pidfd where Linux has one (no wake-ups while it waits), else by looking."""
    import os
    import subprocess
    import threading
    import time

    from fedcure_app.runtime.processes import wait_gone

    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd_open on this platform")
    child = subprocess.Popen(["sleep", "30"])
    done = threading.Event()
    t = threading.Thread(target=lambda: (wait_gone(child.pid, poll_s=0.05), done.set()),
                         daemon=True)
    t.start()
    assert not done.wait(0.3)  # alive: still waiting
    t0 = time.monotonic()
    child.kill()  # a zombie until reaped: gone for the watcher
    assert done.wait(5.0) and time.monotonic() - t0 < 2.0
    child.wait()
    wait_gone(child.pid)  # reaped: returns at once
