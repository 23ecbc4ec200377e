"""Checkpoints: atomic files, exact restoration, and a real cloud process killed with SIGKILL."""

from __future__ import annotations

import json
import re
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_server.checkpoint import (
    COPY, PREV, STATE, CheckpointError, CheckpointStore, config_diff, model_name, write_atomic,
)
from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.core.aggregation import cloud_update
from fedcure_app.protocol.codec import decode_arrays
from tests.deployment.edge_proc import edge_model
from tests.deployment.fakes import FakeEdge, make_cfg
from tests.deployment.reliability import (
    Proc,
    one_hot,
    register_all,
    request,
    start,
    state_of,
)


# ------------------------------------------------------------------------------ the store
def test_atomic_write_replaces_whole_files(tmp_path: Path):
    path = tmp_path / "x.bin"
    write_atomic(path, b"old")
    write_atomic(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]  # no temp file left


def test_store_round_trip_keeps_one_previous_generation_and_prunes_the_rest(tmp_path: Path):
    store = CheckpointStore(tmp_path / "ck")
    assert not store.exists()
    store.save({"a": 1}, {0: b"model zero", 1: b"model one"})
    store.save({"a": 2}, {1: b"model one", 2: b"model two"})
    store.save({"a": 3}, {3: b"model three"})
    state, models = CheckpointStore(tmp_path / "ck").load()
    assert state["a"] == 3 and state["generation"] == 3 and models == {3: b"model three"}
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    # generation 3 (two copies) and generation 2 (the previous one) with the models they name
    assert names == sorted([STATE, COPY, PREV, model_name(1), model_name(1, copy=True),
                            model_name(2), model_name(2, copy=True), model_name(3),
                            model_name(3, copy=True)])
    assert json.loads((tmp_path / "ck" / PREV).read_text())["a"] == 2


def test_a_damaged_copy_is_passed_over_said_in_one_line_and_repaired(tmp_path: Path):
    store = CheckpointStore(tmp_path / "ck")
    store.save({"a": 1}, {1: b"model one"})
    store.save({"a": 2}, {2: b"model two"})
    (tmp_path / "ck" / model_name(2)).write_bytes(b"model tw0")
    (tmp_path / "ck" / STATE).write_bytes((tmp_path / "ck" / STATE).read_bytes()[:30])
    again = CheckpointStore(tmp_path / "ck")
    state, models = again.load()
    assert state["a"] == 2 and models == {2: b"model two"}
    line = again.recovered
    assert line is not None and "\n" not in line
    assert "state.json is torn" in line and f"{model_name(2)} was damaged" in line
    assert "loaded generation 2 from state.copy.json" in line
    assert (tmp_path / "ck" / model_name(2)).read_bytes() == b"model two"  # repaired
    assert json.loads((tmp_path / "ck" / STATE).read_text())["a"] == 2
    assert CheckpointStore(tmp_path / "ck").load()[0]["a"] == 2


def test_a_generation_with_both_state_copies_damaged_falls_back_to_the_previous(tmp_path: Path):
    store = CheckpointStore(tmp_path / "ck")
    store.save({"a": 1}, {1: b"model one"})
    store.save({"a": 2}, {2: b"model two"})
    for name in (STATE, COPY):
        raw = bytearray((tmp_path / "ck" / name).read_bytes())
        raw[len(raw) // 2] ^= 0x01  # one flipped bit: still JSON, no longer its checksum
        (tmp_path / "ck" / name).write_bytes(bytes(raw))
    again = CheckpointStore(tmp_path / "ck")
    state, models = again.load()
    assert state["a"] == 1 and models == {1: b"model one"}
    assert again.recovered is not None and "loaded generation 1 from state.prev.json" in (
        again.recovered)
    # the next save keeps the loaded generation as the previous one
    again.save({"a": 3}, {3: b"model three"})
    assert json.loads((tmp_path / "ck" / PREV).read_text())["a"] == 1
    assert CheckpointStore(tmp_path / "ck").load()[0]["a"] == 3


def test_no_whole_generation_is_an_error_naming_each_damaged_file(tmp_path: Path):
    store = CheckpointStore(tmp_path / "ck")
    store.save({"a": 1}, {1: b"model one"})
    for name in (model_name(1), model_name(1, copy=True)):
        (tmp_path / "ck" / name).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="damaged .SHA-256 mismatch. in both copies"):
        CheckpointStore(tmp_path / "ck").load()
    for name in (model_name(1), model_name(1, copy=True)):
        (tmp_path / "ck" / name).unlink()
    with pytest.raises(CheckpointError, match="is missing in both copies"):
        CheckpointStore(tmp_path / "ck").load()
    (tmp_path / "ck" / STATE).write_text("{not json")
    (tmp_path / "ck" / COPY).unlink()
    with pytest.raises(CheckpointError, match="state.json is torn"):
        CheckpointStore(tmp_path / "ck").load()


def test_a_fresh_run_removes_an_older_runs_generations(tmp_path: Path):
    old = CheckpointStore(tmp_path / "ck")
    old.save({"run": "old"}, {5: b"old five"})
    old.save({"run": "old"}, {6: b"old six"})
    fresh = CheckpointStore(tmp_path / "ck")  # not loaded: a fresh run over the folder
    fresh.save({"run": "new"}, {0: b"new zero"})
    names = {p.name for p in (tmp_path / "ck").iterdir()}
    assert names == {STATE, COPY, model_name(0), model_name(0, copy=True)}
    assert CheckpointStore(tmp_path / "ck").load()[0]["run"] == "new"


def test_an_old_single_file_checkpoint_is_still_read(tmp_path: Path):
    import hashlib

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / model_name(4)).write_bytes(b"four")
    (tmp_path / "ck" / STATE).write_text(json.dumps({
        "format": "fedcure-cloud-checkpoint/1", "a": 1,
        "models": {"4": hashlib.sha256(b"four").hexdigest()}}))
    store = CheckpointStore(tmp_path / "ck")
    state, models = store.load()
    assert state["a"] == 1 and models == {4: b"four"}
    store.save({"a": 2}, {5: b"five"})
    assert CheckpointStore(tmp_path / "ck").load()[0]["a"] == 2


def _damage(path: Path, kind: str, where: float) -> None:
    raw = bytearray(path.read_bytes())
    at = min(int(where * len(raw)), len(raw) - 1)
    if kind == "truncate":
        path.write_bytes(bytes(raw[:at]))
    elif kind == "flip":
        raw[at] ^= 0xFF
        path.write_bytes(bytes(raw))
    else:
        path.unlink()


@settings(max_examples=60, deadline=None)
@given(saves=st.integers(1, 5), pick=st.integers(0, 100),
       kind=st.sampled_from(["truncate", "flip", "delete"]), where=st.floats(0.0, 1.0))
def test_any_one_damaged_file_loses_nothing_of_the_newest_generation(saves, pick, kind, where):
    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(Path(tmp), sync=False)
        for g in range(1, saves + 1):
            # the base version of a task in flight stays named for a while, as in the cloud
            store.save({"g": g, "xs": [g / 3, -g]},
                       {v: f"model {v} ".encode() * (v + 1) for v in {max(g - 2, 0), g}})
        files = sorted(p for p in Path(tmp).iterdir())
        _damage(files[pick % len(files)], kind, where)
        state, models = CheckpointStore(Path(tmp)).load()
        assert state["g"] == saves and state["xs"] == [saves / 3, -saves]
        assert models == {v: f"model {v} ".encode() * (v + 1) for v in {max(saves - 2, 0), saves}}


# ------------------------------------------------------------------------------ in-process
def test_a_resumed_cloud_has_exactly_the_saved_state(cleanup, tmp_path: Path):
    cfg = make_cfg(4, 2, **{"global-rounds": 100, "max-concurrent": 2})
    first = start(cfg, expected=4, out_dir=tmp_path, checkpoint=True)
    cleanup.append(first)
    edges = [FakeEdge(first.address, m) for m in range(2)]
    cleanup.extend(edges)
    register_all(first.address, [request(f"c{i}", one_hot(i), home=i % 2) for i in range(4)])
    replies = {}
    for i in range(5):
        e = edges[i % 2]
        task = e.next_task()
        replies[task.task_id] = (e, task, e.submit(task, value=0.3 + 0.1 * i))
    saved = state_of(first)
    for e in edges:
        e.close()
    first.stop()

    second = start(cfg, expected=4, out_dir=tmp_path, checkpoint=True, resume=True)
    cleanup.append(second)
    assert second.service.resumed
    again = state_of(second)
    assert again == saved
    # the restored cloud answers duplicates exactly as before and streams the tasks in flight
    edges = [FakeEdge(second.address, m) for m in range(2)]
    cleanup.extend(edges)
    for tid, (_, task, reply) in replies.items():
        assert edges[task.coalition].submit(task, value=9.0) == reply
    assert state_of(second) == saved
    for e in edges:
        task = e.next_task()
        assert e.submit(task).accepted
    assert state_of(second)["version"] == saved["version"] + 2


def test_a_checkpoint_of_another_configuration_is_refused(cleanup, tmp_path: Path):
    cfg = make_cfg(2, 1, **{"global-rounds": 10})
    first = start(cfg, expected=2, out_dir=tmp_path, checkpoint=True)
    cleanup.append(first)
    edge = FakeEdge(first.address, 0)
    cleanup.append(edge)
    register_all(first.address, [request(f"c{i}", one_hot(i), home=0) for i in range(2)])
    assert edge.submit(edge.next_task()).accepted
    edge.close()
    first.stop()
    other = apply_flat(cfg, {"beta": 0.9})
    with pytest.raises(CheckpointError, match="different configuration"):
        start(other, expected=2, out_dir=tmp_path, checkpoint=True, resume=True)


# ------------------------------------------------------------------------------ SIGKILL
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cloud(port: int, out: Path, rounds: int) -> Proc:
    return Proc("-m", "cloud_server.cli", "--listen", f"127.0.0.1:{port}",
                "--expected-clients", "4", "--edges", "2", "--rounds", str(rounds),
                "--formation", "none", "--out", str(out), "--no-plots", "--insecure",
                "--resume", "--register-timeout", "60")


def edge_proc(port: int, m: int) -> Proc:
    return Proc("-m", "tests.deployment.edge_proc", "--cloud", f"127.0.0.1:{port}",
                "--edge-id", str(m), "--delay", "0.05", "--insecure", "--lifetime", "150")


def test_sigkilled_cloud_resumes_without_losing_or_repeating_updates(tmp_path: Path):
    rounds = 24
    port = free_port()
    procs: list[Proc] = []
    try:
        first = cloud(port, tmp_path, rounds)
        procs.append(first)
        first.wait_for(r"listening on")
        edges = [edge_proc(port, m) for m in range(2)]
        procs.extend(edges)
        register_all(f"127.0.0.1:{port}",
                     [request(f"c{i}", one_hot(i, classes=10), home=i % 2) for i in range(4)],
                     timeout=60)
        current = first
        for kill_after in (6, 14):  # SIGKILL mid-run, twice
            current.wait_for(rf"round {kill_after}/{rounds}:", timeout=60)
            current.kill()
            current = cloud(port, tmp_path, rounds)
            procs.append(current)
            current.wait_for(r"resumed from checkpoint", timeout=60)
        assert current.proc.wait(90) == 0, "".join(current.log)
        for e in edges:
            e.proc.wait(30)
    finally:
        for p in procs:
            p.kill()

    result = json.loads((tmp_path / "result.json").read_text())
    records = result["records"]
    assert result["rounds"] == rounds and result["complete"]
    # one aggregation per version and per task: nothing applied twice
    assert [r["version"] for r in records] == list(range(1, rounds + 1))
    assert len({r["task_id"] for r in records}) == rounds
    by_task = {r["task_id"]: r for r in records}
    # every update an edge was told was accepted is in the final history, at that version
    told = []
    for e in edges:
        log = "".join(e.log)
        assert "refused" not in log, log
        told += re.findall(r"^reply (\S+) accepted=1 version=(\d+)$", log, flags=re.M)
    assert told
    for tid, version in told:
        assert by_task[tid]["version"] == int(version)
    assert len([f for f in result["faults"] if f["kind"] == "resumed"]) == 2

    # the final model is exactly the replay of the accepted updates from the initial model
    from cloud_server.controller import initial_model

    cfg = apply_flat(FedCureConfig(), {"num-edges": 2, "num-clients": 4,
                                       "global-rounds": rounds, "formation": "none"})
    models = {0: initial_model(cfg)}
    glob = models[0]
    for r in records:
        base = r["version"] - 1 - r["staleness"]
        glob = cloud_update(glob, edge_model(models[base], r["task_id"]), r["xi"])
        models[r["version"]] = glob
    final = decode_arrays((tmp_path / "final_model.safetensors").read_bytes())
    assert len(final) == len(glob)
    assert all(np.array_equal(a, b) for a, b in zip(final, glob))


def test_a_setting_newer_than_the_checkpoint_passes_at_its_default_only():
    defaults = {"run": {"seed": 0, "new_knob": 1.0}}
    saved = {"run": {"seed": 0}}  # written before new_knob existed
    assert config_diff(saved, {"run": {"seed": 0, "new_knob": 1.0}}, defaults) == []
    assert config_diff(saved, {"run": {"seed": 0, "new_knob": 2.0}}, defaults) == [
        "run.new_knob: None -> 2.0"]
    assert config_diff(saved, {"run": {"seed": 3, "new_knob": 1.0}}, defaults) == [
        "run.seed: 0 -> 3"]
