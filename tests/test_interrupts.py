"""Ctrl-C (SIGINT) stops a pytest session of this suite promptly, even after or while a test
runs a role in-process that takes SIGINT for itself (``tests/interrupts.py``)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
import logging, threading, time
from fedcure_app.runtime.processes import role_start

def test_1_a_role_ran_here():
    stop = role_start(True, logging.getLogger("probe"))
    if {waits_in_role}:
        print("READY", flush=True)
        stop.wait(60)  # a role waiting for its stop event: SIGINT sets it
        assert stop.is_set()

def test_2_waits():
    print("READY", flush=True)
    time.sleep(60)

def test_3_never_runs():
    print("RAN-3", flush=True)
'''


def _session(tmp_path: Path, waits_in_role: bool) -> tuple[int, str, float]:
    """Run the probe session, SIGINT it at its first READY; (code, output, seconds after)."""
    (tmp_path / "conftest.py").write_text(  # the suite's own set-up, as tests/ has it
        "from tests.conftest import _signal_handlers_restored, pytest_runtest_protocol"
        "  # noqa: F401\n")
    (tmp_path / "test_probe.py").write_text(PROBE.format(waits_in_role=waits_in_role))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # as from a terminal: a runner that started this suite in the background (``cmd &``)
        # has SIGINT ignored, which the child would inherit, and Python then takes no Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=120)
            if line is None:
                raise AssertionError("the session ended before READY:\n" + "".join(seen))
            seen.append(line)
            if "READY" in line:
                break
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(45)
        after = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while (line := lines.get(timeout=10)) is not None:
        seen.append(line)
    return code, "".join(seen), after


@pytest.mark.parametrize("waits_in_role", [False, True],
                         ids=["after-a-role-ran", "while-a-role-waits"])
def test_sigint_stops_the_session(tmp_path: Path, waits_in_role: bool):
    code, out, after = _session(tmp_path, waits_in_role)
    assert after < 30.0, out
    assert code == 2, out  # pytest's "interrupted"
    assert "RAN-3" not in out
    assert "interrupted" in out.lower() or "KeyboardInterrupt" in out
