"""Storage faults under a live cloud: a checkpoint write cut short, a torn or corrupt file found at
start, a full disk. The cloud never loads a damaged checkpoint (it takes the newest whole
generation and says so in one line) and never loses an update it acknowledged."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from pathlib import Path

import grpc
import pytest

from cloud_server import checkpoint
from cloud_server.checkpoint import COPY, STATE, CheckpointStore, DiskFull, model_name
from cloud_server.durable import Durability
from tests.deployment.fakes import FakeEdge, make_cfg
from tests.deployment.invariants import lost_updates, version_problems
from tests.deployment.reliability import code_of, one_hot, register_all, request, start, state_of
from tests.kernel import mount_tmpfs

EDGES = 2


def _cloud(tmp_path: Path, cleanup: list, *, resume: bool = False):
    cfg = make_cfg(4, EDGES, **{"global-rounds": 100, "max-concurrent": 2})
    server = start(cfg, expected=4, out_dir=tmp_path, checkpoint=True, resume=resume)
    cleanup.append(server)
    edges = [FakeEdge(server.address, m) for m in range(EDGES)]
    cleanup.extend(edges)
    if not resume:
        register_all(server.address, [request(f"c{i}", one_hot(i), home=i % EDGES)
                                      for i in range(4)])
    return server, edges


def _train(edges: list[FakeEdge], n: int, told: list[tuple[str, int]]) -> None:
    """``n`` accepted Submits, alternating edges; every acknowledgement goes to ``told``."""
    for i in range(n):
        e = edges[i % EDGES]
        task = e.next_task()
        reply = e.submit(task, value=0.1 * (len(told) + 1))
        assert reply.accepted, reply.detail
        told.append((task.task_id, reply.version))


def _records(server) -> list[dict]:
    return server.call(lambda: [dict(r) for r in server.service.controller.records])


def _stop(server, edges: list[FakeEdge]) -> None:
    for e in edges:
        e.close()
    server.stop()


def _assert_nothing_lost(records: list[dict], told: list[tuple[str, int]]) -> None:
    assert version_problems(records) == []
    assert lost_updates(records, told) == []


def _newest(folder: Path, prefix: str) -> Path:
    return max((p for p in folder.iterdir() if p.name.startswith(prefix)),
               key=lambda p: (p.stat().st_mtime_ns, p.name))


# ------------------------------------------------------------------------------ cut short
def test_a_checkpoint_write_cut_short_is_not_acknowledged_and_never_loaded(
        cleanup, tmp_path: Path, monkeypatch, caplog):
    server, edges = _cloud(tmp_path, cleanup)
    told: list[tuple[str, int]] = []
    _train(edges, 4, told)

    whole = checkpoint.write_atomic

    def cut_short(path: Path, data, *, sync: bool = True) -> None:
        if path.name != STATE:
            return whole(path, data, sync=sync)
        path.write_bytes(bytes(data)[: len(data) // 2])  # what a crash mid-write leaves
        raise OSError(errno.EIO, "the write was cut short")

    monkeypatch.setattr(checkpoint, "write_atomic", cut_short)
    e = edges[len(told) % EDGES]
    task = e.next_task()
    assert code_of(lambda: e.submit(task)) == grpc.StatusCode.UNAVAILABLE  # not acknowledged
    monkeypatch.setattr(checkpoint, "write_atomic", whole)
    assert state_of(server)["version"] == len(told)
    _stop(server, edges)  # the process "dies" here: nothing more is written

    with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
        server, edges = _cloud(tmp_path, cleanup, resume=True)
    lines = [m for m in caplog.messages if "state.json is torn" in m]
    assert len(lines) == 1 and "loaded generation" in lines[0], caplog.messages
    assert state_of(server)["version"] == len(told)
    _assert_nothing_lost(_records(server), told)
    # the refused update is still wanted: its edge's retry is aggregated now, once
    reply = edges[task.coalition].submit(task)
    assert reply.accepted and reply.version == len(told) + 1
    told.append((task.task_id, reply.version))
    _assert_nothing_lost(_records(server), told)


# ------------------------------------------------------------------------------ at rest
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for at in range(len(raw) // 2, len(raw) // 2 + 4):
        raw[at] ^= 0x5A
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [_truncate, _flip], ids=["torn", "corrupt"])
@pytest.mark.parametrize("which", ["newest file", "state", "model"])
def test_a_damaged_checkpoint_file_is_never_loaded_and_loses_no_acknowledged_update(
        cleanup, tmp_path: Path, caplog, damage, which):
    server, edges = _cloud(tmp_path, cleanup)
    told: list[tuple[str, int]] = []
    _train(edges, 5, told)
    saved = state_of(server)
    _stop(server, edges)

    folder = tmp_path / "checkpoint"
    target = {"newest file": lambda: _newest(folder, ""),
              "state": lambda: folder / STATE,
              "model": lambda: folder / model_name(saved["version"])}[which]()
    before = target.read_bytes()
    damage(target)
    assert target.read_bytes() != before
    with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
        server, edges = _cloud(tmp_path, cleanup, resume=True)
    lines = [m for m in caplog.messages if m.startswith(f"checkpoint {folder}")]
    assert len(lines) == 1 and target.name in lines[0], caplog.messages
    assert state_of(server) == saved
    _assert_nothing_lost(_records(server), told)
    assert target.read_bytes() == before or target.name == COPY  # repaired (or rewritten next)
    _train(edges, 2, told)
    _assert_nothing_lost(_records(server), told)


# ------------------------------------------------------------------------------ disk full
class _FullStore(CheckpointStore):
    """A store whose disk is full while ``full`` is set."""

    full = False

    def save(self, state, models) -> None:
        if self.full:
            raise DiskFull(errno.ENOSPC, "no space left (test)")
        super().save(state, models)


def test_a_full_disk_on_an_availability_change_is_said_once_and_caught_up(tmp_path, caplog):
    store = _FullStore(tmp_path / "ck")
    d = Durability(make_cfg(2, 1), store, None, None, None, None)  # type: ignore[arg-type]
    d.state = lambda fed: ({"round": store.writes}, {0: b"model"})  # type: ignore[method-assign]
    fed = object()
    with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
        d.save(fed)  # type: ignore[arg-type]
        store.full = True
        for _ in range(3):
            d.save(fed, required=False)  # type: ignore[arg-type]  # the next write catches up
        with pytest.raises(DiskFull):
            d.save(fed)  # type: ignore[arg-type]  # an accepted update's write: refused upstream
        store.full = False
        d.save(fed, required=False)  # type: ignore[arg-type]
    full = [m for m in caplog.messages if m.startswith("cloud disk full")]
    back = [m for m in caplog.messages if m.startswith("cloud disk has space again")]
    assert len(full) == 1 and "RESOURCE_EXHAUSTED" in full[0] and len(back) == 1
    assert d.disk_full is None and store.writes == 2


def _fill(folder: Path, leave_pages: int) -> Path:
    """Fill ``folder``'s file system but ``leave_pages`` pages; returns the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)
    size = filler.stat().st_size
    os.truncate(filler, max(size - leave_pages * 4096, 0))
    return filler


@pytest.fixture
def tmpfs_checkpoint(tmp_path: Path):
    """``tmp_path/checkpoint`` on a 1 MiB tmpfs (root only), unmounted after the test."""
    folder = tmp_path / "checkpoint"
    mount_tmpfs(folder, "1m")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


@pytest.mark.parametrize("leave_pages", [0, 1, 2, 4])
def test_a_full_disk_refuses_updates_until_space_returns_and_loses_none(
        tmpfs_checkpoint: Path, cleanup, tmp_path: Path, caplog, leave_pages):
    server, edges = _cloud(tmp_path, cleanup)
    told: list[tuple[str, int]] = []
    _train(edges, 3, told)
    filler = _fill(tmpfs_checkpoint, leave_pages)
    with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
        for _ in range(20):  # train on while the pages left take updates whole
            e = edges[len(told) % EDGES]
            task = e.next_task()
            before = state_of(server)
            try:
                reply = e.submit(task)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
                assert err.details().startswith(f"cloud disk full: task {task.task_id} not "
                                                "aggregated (no space left in ")
                break
            assert reply.accepted
            told.append((task.task_id, reply.version))
        else:
            raise AssertionError("the disk never filled")
        for _ in range(2):  # the edge asks again while the disk stays full
            assert code_of(lambda: e.submit(task)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert state_of(server) == before  # refused whole: nothing changed
        assert sum(m.startswith("cloud disk full") for m in caplog.messages) == 1
        # nothing acknowledged is only in memory: the disk holds every acknowledged update
        on_disk, _ = CheckpointStore(tmpfs_checkpoint).load()
        _assert_nothing_lost(on_disk["records"], told)
        filler.unlink()  # space returns: the same Submit is taken
        reply = e.submit(task)
        assert reply.accepted and reply.version == len(told) + 1
        told.append((task.task_id, reply.version))
        assert sum(m.startswith("cloud disk has space again") for m in caplog.messages) == 1
    _train(edges, 2, told)
    _assert_nothing_lost(_records(server), told)
    _stop(server, edges)
    server, edges = _cloud(tmp_path, cleanup, resume=True)
    _assert_nothing_lost(_records(server), told)
