"""Roles leave nothing in the temporary directory: a role without --work-dir removes its own
work folder when it exits, cleanly or on SIGTERM/SIGINT, and the warm client's
``superexec.secret`` never outlives the client (``fedcure_app/runtime/workdir.py``)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedcure_app.runtime.processes import alive, free_port
from fedcure_app.runtime.workdir import drop_work_dir, make_work_dir
from tests.deployment.fakes import make_cfg, start_cloud


def test_a_given_work_dir_is_kept_and_a_temporary_one_removed(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read $TMPDIR
    given, temporary = make_work_dir(tmp_path / "mine" / "deep", "fedcure-x-")
    assert not temporary and given.is_dir()
    (given / "superexec.secret").write_bytes(b"s" * 32)
    (given / "log.txt").write_text("kept")
    drop_work_dir(given, temporary, secrets=[given / "superexec.secret"])
    assert (given / "log.txt").exists() and not (given / "superexec.secret").exists()

    work, temporary = make_work_dir(None, "fedcure-x-")
    assert temporary and work.parent == tmp_path.resolve() and work.name.startswith("fedcure-x-")
    (work / "a" / "b").mkdir(parents=True)
    (work / "a" / "b" / "f").write_text("x")
    drop_work_dir(work, temporary, secrets=[None, work / "absent"])
    assert not work.exists()
    drop_work_dir(work, temporary)  # a second call is harmless


def _role(argv: list[str], tmp: Path) -> tuple[subprocess.Popen, queue.Queue]:
    env = {**os.environ, "TMPDIR": str(tmp), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _wait_for(lines: queue.Queue, pattern: str, timeout_s: float, seen: list[str]) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r}; the role said:\n{''.join(seen)}")


def _stop(proc: subprocess.Popen, sig: int) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(30)
    finally:
        _end(proc)


def _end(proc: subprocess.Popen) -> None:
    """Stop a role the test has not stopped (it failed, or was interrupted): SIGTERM first, so
    that it stops its own children (SIGKILL would orphan them), SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_client_that_gives_up_removes_its_work_folder_and_secret(tmp_path: Path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc, _lines = _role(["client", "--cloud", f"127.0.0.1:{free_port()}", "--insecure",
                          "--connect-timeout", "1"], tmp)
    try:
        assert proc.wait(60) == 1
    finally:
        _end(proc)
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_client_removes_its_work_folder_and_secret(tmp_path: Path, cleanup, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    server = start_cloud(make_cfg(2, 1, **{"num-classes": 10}), expected=2, timeout=120.0)
    cleanup.append(server)
    proc, lines = _role(["client", "--cloud", server.address, "--insecure", "--name", "c0"],
                        tmp)
    seen: list[str] = []
    try:
        _wait_for(lines, r"holds partition", 90, seen)
        work = [p for p in tmp.iterdir() if p.name.startswith("fedcure-client-")]
        assert len(work) == 1 and (work[0] / "superexec.secret").is_file()
        assert _stop(proc, sig) == 0, "".join(seen)
    finally:
        _end(proc)
    assert list(tmp.iterdir()) == []


def test_a_stopped_edge_removes_its_work_folder_and_stops_its_superlink(tmp_path: Path,
                                                                          cleanup):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    server = start_cloud(make_cfg(2, 1), expected=2, timeout=120.0)
    cleanup.append(server)
    proc, lines = _role(["edge_server", "--cloud", server.address, "--insecure", "--edge-id",
                         "0", "--listen", f"127.0.0.1:{free_port()}"], tmp)
    seen: list[str] = []
    try:
        line = _wait_for(lines, r"SuperLink \(pid \d+\)", 90, seen)
        superlink = int(re.search(r"pid (\d+)", line).group(1))  # type: ignore[union-attr]
        _wait_for(lines, r"ServerApp submitted", 120, seen)
        assert [p.name[:14] for p in tmp.iterdir()] == ["fedcure-edge0-"]
        assert _stop(proc, signal.SIGTERM) == 0, "".join(seen)
    finally:
        _end(proc)
    assert not alive(superlink)
    assert list(tmp.iterdir()) == []
