"""The warm trainer forked from its executor (:mod:`client.forked`): it shares the executor's
loaded pages, names itself, serves the socket pair like the exec'd trainer, and a trainer
started again is exec'd."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from client.executor import Trainer
from client.forked import TRAINER_COMM, ForkedProcess, can_fork


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


@pytest.mark.skipif(not can_fork(), reason="needs a single-threaded Linux test process")
def test_the_first_trainer_is_forked_and_a_restarted_one_is_execed() -> None:
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


@pytest.mark.skipif(not can_fork(), reason="needs a single-threaded Linux test process")
def test_the_forked_trainer_exits_when_its_executor_closes_the_pair() -> None:
    trainer = Trainer(max_restarts=0, load_timeout_s=120)
    trainer.start()
    proc = trainer.proc
    trainer.close(grace_s=30.0)
    assert isinstance(proc, ForkedProcess) and proc.returncode == 0


def test_an_executor_with_threads_does_not_fork() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not can_fork()
    finally:
        stop.set()
        t.join()
