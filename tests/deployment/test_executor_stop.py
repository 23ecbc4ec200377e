"""The warm client's executor ends promptly on SIGTERM: with its SuperNode unreachable (Flower's
retry invoker would retry forever) and with its trainer inside a long ClientApp call, so that
``fedcure-client`` (``CHILD_STOP_GRACE_S``) and ``docker compose down`` (10 s) never have to
kill it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from client.cli import CHILD_STOP_GRACE_S
from client.executor import Stopping, Trainer, write_secret
from client.runtime_client import stoppable_retries

#: a trainer that answers "ready", then never answers a message (a ClientApp call that lasts)
STUCK_TRAINER = textwrap.dedent("""
    import os, sys, time
    from multiprocessing.connection import Connection
    conn = Connection(int(sys.argv[sys.argv.index("--fd") + 1]))
    conn.send(("ready", os.getpid()))
    conn.recv()
    time.sleep(600)
""")


def test_a_trainer_wait_ends_when_stop_is_set_and_close_ends_a_busy_trainer(tmp_path: Path):
    script = tmp_path / "stuck_trainer.py"
    script.write_text(STUCK_TRAINER)
    stop = threading.Event()
    trainer = Trainer(max_restarts=0, load_timeout_s=60, argv=[sys.executable, str(script)],
                      stop=stop)
    try:
        trainer.start()
        threading.Timer(0.5, stop.set).start()
        t0 = time.monotonic()
        with pytest.raises(Stopping):
            trainer.train("m1", "ctx", 1, 0.0)
        assert time.monotonic() - t0 < 2.0
    finally:
        t0 = time.monotonic()
        trainer.close()
        assert not trainer.alive()
        assert time.monotonic() - t0 < 4.0  # SIGTERM after 1 s, not a wait for the call


def test_the_runtime_retries_give_up_once_stop_is_set():
    import httpx

    stop = threading.Event()
    invoker = stoppable_retries(stop)
    calls = []

    def refused() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            stop.set()
        raise httpx.ConnectError("connection refused")

    t0 = time.monotonic()
    with pytest.raises(httpx.ConnectError):
        invoker.invoke(refused)
    assert len(calls) == 3 and time.monotonic() - t0 < 10


def _hang_up_server() -> tuple[socket.socket, int]:
    """A listener that closes every connection it accepts (a SuperNode going away)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_the_executor_exits_cleanly_on_sigterm_with_its_supernode_gone(tmp_path: Path):
    """The Runtime API hangs up, then stops listening (the SuperNode went away): the executor,
    retrying it with Flower's back-off, still exits with code 0 within the grace its client
    gives it (about a second when the machine is idle), and its trainer too."""
    secret = write_secret(tmp_path / "work" / "superexec.secret")
    server, port = _hang_up_server()
    proc = subprocess.Popen(
        [sys.executable, "-m", "client.executor", "--runtime-api-address",
         f"127.0.0.1:{port}", "--secret-file", str(secret)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "ready" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(180), "".join(lines)
        time.sleep(1.0)  # AcquireTask calls hung up on
        server.close()
        time.sleep(1.5)  # refused ones, and Flower's back-off between them
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert code == 0, "".join(lines)
    assert took < CHILD_STOP_GRACE_S, f"took {took:.1f} s"
    assert "Traceback" not in "".join(lines)
    trainer_pid = next(int(x.split("pid ")[1].split(")")[0]) for x in lines if "ready" in x)
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(trainer_pid, 0)
