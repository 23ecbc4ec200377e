"""The warm trainer forked from its executor (:mod:`client.forked`): it shares the executor's
loaded pages, names itself, serves the socket pair like the exec'd trainer, and a trainer
started again is exec'd."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from client.executor import Trainer
from client.forked import TRAINER_COMM, ForkedProcess, can_fork


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _in_a_fresh_process(test) -> None:
    """Run ``test`` (a function of this module) in a fresh, single-threaded interpreter: the
    executor forks only while it has one thread, and a test process that earlier tests left
    with threads would silently take the exec'd path."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.deployment.test_forked_trainer import {test.__name__}
        {test.__name__}()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _first_forked_then_execed() -> None:
    trainer = Trainer(max_restarts=1, load_timeout_s=120)
    try:
        trainer.start()
        first = trainer.proc
        assert isinstance(first, ForkedProcess) and _comm(first.pid) == TRAINER_COMM
        trainer.conn.send(("ping",))
        assert trainer.conn.recv() == ("pong", first.pid)
        first.kill()
        assert first.wait(10) == -9
        trainer.start()  # after a death: exec'd, never forked from a running executor
        assert not isinstance(trainer.proc, ForkedProcess) and trainer.alive()
        trainer.conn.send(("ping",))
        assert trainer.conn.recv() == ("pong", trainer.pid)
    finally:
        trainer.close()


def _exits_when_the_pair_closes() -> None:
    assert can_fork()
    trainer = Trainer(max_restarts=0, load_timeout_s=120)
    trainer.start()
    proc = trainer.proc
    trainer.close(grace_s=30.0)
    assert isinstance(proc, ForkedProcess) and proc.returncode == 0


@pytest.mark.skipif(sys.platform != "linux", reason="the forked trainer is Linux only")
def test_the_first_trainer_is_forked_and_a_restarted_one_is_execed() -> None:
    _in_a_fresh_process(_first_forked_then_execed)


@pytest.mark.skipif(sys.platform != "linux", reason="the forked trainer is Linux only")
def test_the_forked_trainer_exits_when_its_executor_closes_the_pair() -> None:
    _in_a_fresh_process(_exits_when_the_pair_closes)


def test_an_executor_with_threads_does_not_fork() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not can_fork()
    finally:
        stop.set()
        t.join()
