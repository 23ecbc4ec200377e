"""A stopped cloud's results (``fedcure-cloud``'s stop path, ``cloud_server.cli.write_stopped``)
on the controller without gRPC: a run that finished keeps the results it wrote, also when the
stop lands while it is still writing them; a run stopped mid-way writes its partial results
once; a cloud stopped before training writes nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

from cloud_server.cli import write_stopped
from cloud_server.controller import CloudController
from tests.deployment.test_controller import answer, controller, formed


def training(out: Path, rounds: int) -> tuple[CloudController, list]:
    """A formed run of 4 clients on 2 edges writing its results into ``out``."""
    return formed(out_dir=out, **{"global-rounds": rounds})


def count_writes(c: CloudController, gate: threading.Event | None = None
                 ) -> tuple[list[int], threading.Event]:
    """Record the rounds of each results write (result.json, the model files); with ``gate``,
    each write waits for it. Returns the rounds written and an event set once one started."""
    rounds: list[int] = []
    started = threading.Event()
    real = c.results.write

    def write(result, *rest, **kw):
        rounds.append(result["rounds"])
        started.set()
        if gate is not None:
            assert gate.wait(10)
        real(result, *rest, **kw)

    c.results.write = write
    return rounds, started


def stop(c: CloudController, out: Path):
    return asyncio.run(write_stopped(c, str(out)))


def test_a_stop_after_the_run_finished_keeps_its_results(tmp_path, caplog):
    c, tasks = training(tmp_path, rounds=1)
    assert answer(c, tasks[0]).finished
    writes, _ = count_writes(c)
    c.finish()
    written = (tmp_path / "result.json").stat()
    with caplog.at_level(logging.INFO, logger="fedcure.cloud"):
        got = stop(c, tmp_path)
    assert writes == [1]
    assert got is c.result and got["rounds"] == 1
    again = (tmp_path / "result.json").stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert "results in" in caplog.text and "are kept" in caplog.text


def test_a_stop_while_the_finished_run_writes_waits_for_it_and_writes_nothing(tmp_path):
    c, tasks = training(tmp_path, rounds=1)
    assert answer(c, tasks[0]).finished
    gate = threading.Event()
    writes, started = count_writes(c, gate)
    finishing = threading.Thread(target=c.finish)
    finishing.start()
    assert started.wait(10)  # the finished run is writing its results
    got: list = []
    stopping = threading.Thread(target=lambda: got.append(stop(c, tmp_path)))
    stopping.start()
    time.sleep(0.2)  # the stop lands while they are written
    gate.set()
    finishing.join(10)
    stopping.join(10)
    assert not finishing.is_alive() and not stopping.is_alive()
    assert writes == [1]
    assert got == [c.result] and got[0] is not None
    assert json.loads((tmp_path / "result.json").read_text())["rounds"] == 1


def test_a_stop_during_the_run_writes_the_partial_results_once(tmp_path, caplog):
    c, tasks = training(tmp_path, rounds=5)
    assert not answer(c, tasks[0]).finished
    writes, _ = count_writes(c)
    with caplog.at_level(logging.INFO, logger="fedcure.cloud"):
        got = stop(c, tmp_path)
    assert got is not None and got["rounds"] == 1 and writes == [1]
    assert json.loads((tmp_path / "result.json").read_text())["rounds"] == 1
    assert "stopped after 1 of 5 rounds; partial results in" in caplog.text
    assert stop(c, tmp_path) is got and c.formed.finish() is got  # written once, kept
    assert writes == [1]


def test_a_stop_before_training_writes_nothing(tmp_path):
    c = controller(out_dir=tmp_path)
    assert stop(c, tmp_path) is None
    assert not (tmp_path / "result.json").exists()
