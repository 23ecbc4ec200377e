"""Start-up is not training: what T̂ learns from a task whose latency includes start-up, and the
warm trainer's preload (the first message finds the node's data and model loaded)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_server.arrivals import MIN_OBSERVED_SHARE, observed_latency
from tests.simulation.fake_grid import task_identity


@given(st.floats(1e-3, 1e5), st.floats(0.0, 1.0))
def test_observed_latency_removes_the_start_up_but_keeps_a_floor(latency, share):
    startup = share * latency
    got = observed_latency(latency, startup)
    assert MIN_OBSERVED_SHARE * latency <= got <= latency
    if startup <= (1 - MIN_OBSERVED_SHARE) * latency:
        assert got == pytest.approx(latency - startup, rel=1e-9, abs=1e-12)
    assert observed_latency(latency, 0.0) == latency


@pytest.mark.parametrize("latency,startup", [(0.0, 0.0), (-1.0, 0.0), (math.nan, 0.0),
                                             (1.0, -0.5), (1.0, math.inf), (1.0, math.nan)])
def test_observed_latency_refuses_bad_numbers(latency, startup):
    with pytest.raises(ValueError):
        observed_latency(latency, startup)


def _node_file(tmp_path: Path) -> Path:
    from fedcure_app.devices import PRESETS
    from fedcure_app.flower.node_data import NodeData, save_node_data

    rng = np.random.default_rng(0)
    data = NodeData(x=rng.random((40, 1, 8, 8), dtype=np.float32),
                    y=rng.integers(0, 10, 40).astype(np.int64), dataset="digits",
                    num_classes=10, client_name="t", partition_id=0, profile=PRESETS["laptop"])
    return save_node_data(tmp_path / "node-data.npz", data)


def _train_message(model_arrays, client: int = 0):
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    msg = Message(RecordDict({
        "arrays": ArrayRecord(model_arrays),
        "config": ConfigRecord({"client-id": client, "tau-c": 3, "lr": 0.05, "batch-size": 8,
                                "freq-ghz": 0.0, "seed": 7, "edge-round": 0,
                                "task-id": "t0", "coalition": 0, "version": 0})}),
        dst_node_id=1, message_type="train")
    return msg


def _run(tmp_path: Path, preload: bool, startup: float | None):
    from flwr.app import Context, RecordDict

    import torch

    import fedcure_app.flower.client_app as client_app
    from fedcure_app.models import build_model, get_weights

    path = _node_file(tmp_path)
    client_app._deployed.clear()
    client_app._preloaded.clear()
    if preload:
        assert client_app.preload(str(path)) > 0
    torch.manual_seed(3)
    weights = get_weights(build_model("digits", 10))
    ctx = Context(run_id=1, node_id=1, node_config={"data-file": str(path), "client-id": 0,
                                                   "cpufreq": "off"},
                  state=RecordDict(), run_config={})
    client_app.task_startup_s = startup
    try:
        with task_identity():
            reply = client_app.train(_train_message(weights), ctx)
    finally:
        client_app.task_startup_s = None
        client_app._deployed.clear()
    return reply.content["arrays"].to_numpy_ndarrays(), reply.content["metrics"]


def test_a_preloaded_trainer_reports_no_start_up_and_trains_the_same(tmp_path: Path):
    cold_arrays, cold = _run(tmp_path / "cold", preload=False, startup=0.0)
    warm_arrays, warm = _run(tmp_path / "warm", preload=True, startup=0.0)
    # the cold one loaded the data file and built the model in the message; the warm one only
    # made its (cpufreq off) actuator there
    assert cold["startup-s"] > 0
    assert warm["startup-s"] < 0.25  # microseconds idle; generous for a loaded machine
    for a, b in zip(cold_arrays, warm_arrays):  # the warm-up changed no weight
        np.testing.assert_array_equal(a, b)


def test_start_up_the_executor_measured_is_reported_and_flwr_clientapp_reports_none(
        tmp_path: Path):
    _, restarted = _run(tmp_path / "a", preload=True, startup=2.5)
    assert 2.5 <= restarted["startup-s"] < 2.75
    _, per_message = _run(tmp_path / "b", preload=False, startup=None)
    assert per_message["startup-s"] == 0.0  # a process per message: start-up is every one's


def test_an_executor_started_before_its_supernode_waits_for_the_address_and_the_listener(
        tmp_path: Path):
    import socket
    import threading

    from client.executor import wait_for_address, wait_for_listener

    path = tmp_path / "runtime-api-address"
    stop = threading.Event()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    got: dict[str, object] = {}

    def executor_side():
        got["address"] = wait_for_address(path, stop, poll_s=0.005)
        got["listening"] = wait_for_listener(str(got["address"]), stop, poll_s=0.005)

    t = threading.Thread(target=executor_side)
    t.start()
    path.write_text(f"127.0.0.1:{port}\n")
    server.listen()  # the SuperNode comes up after its address was published
    t.join(10)
    server.close()
    assert got == {"address": f"127.0.0.1:{port}", "listening": True}
    stop.set()  # stopped before anything appears: no address, no wait
    assert wait_for_address(tmp_path / "never", stop) is None
    assert wait_for_listener(f"127.0.0.1:{port}", stop) is False


def test_a_prestarted_supernode_reads_its_arguments_when_they_appear(tmp_path: Path):
    import json
    import threading

    from client.cli import release_supernode
    from client.supernode import read_argv_file

    path = tmp_path / "supernode-argv.json"
    got: list[list[str]] = []
    t = threading.Thread(target=lambda: got.append(read_argv_file(str(path), poll_s=0.005)))
    t.start()
    release_supernode(tmp_path, ["python", "-m", "client.supernode", "--superlink", "h:1"])
    t.join(10)
    assert got == [["--superlink", "h:1"]]
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(SystemExit, match="JSON list"):
        read_argv_file(str(path))


def test_the_supernode_wakes_the_executor_through_the_fifo_and_a_missing_reader_is_harmless(
        tmp_path: Path):
    import time

    from client.wake import WakeReader, WakeWriter, make_fifo

    fifo = make_fifo(tmp_path / "wake.fifo")
    assert fifo is not None
    writer = WakeWriter(fifo)
    writer.notify()  # nobody listens yet: nothing happens, nothing raises
    reader = WakeReader(fifo)
    try:
        t0 = time.monotonic()
        assert reader.wait(0.05) is False  # no wake-up: the full wait
        assert time.monotonic() - t0 >= 0.04
        for _ in range(3):
            writer.notify()
        t0 = time.monotonic()
        assert reader.wait(5.0) is True and time.monotonic() - t0 < 1.0
        assert reader.wait(0.01) is False  # the three bytes were one wake-up
    finally:
        reader.close()
    writer.notify()  # the reader is gone: still harmless


def test_a_stop_ends_the_executors_wait_for_a_wake_up_at_once(tmp_path: Path):
    """The executor waits up to 30 s for a wake-up between asks; SIGTERM (its handler calls
    ``interrupt``) must end that wait at once, or a stopped client is killed after its grace."""
    import signal
    import threading
    import time

    from client.wake import WAKE_FALLBACK_S, WakeReader, make_fifo

    fifo = make_fifo(tmp_path / "wake.fifo")
    assert fifo is not None
    reader = WakeReader(fifo)
    old = signal.signal(signal.SIGALRM, lambda *_: reader.interrupt())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # a signal handler, as the executor's
        t0 = time.monotonic()
        assert reader.wait(WAKE_FALLBACK_S) is True
        assert time.monotonic() - t0 < 5.0
        threading.Timer(0.1, reader.interrupt).start()  # the parent-watching thread
        t0 = time.monotonic()
        assert reader.wait(WAKE_FALLBACK_S) is True and time.monotonic() - t0 < 5.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        reader.close()
    reader.interrupt()  # closed: harmless


def test_a_supernode_whose_runtime_port_was_taken_says_so_and_the_client_can_tell(
        tmp_path: Path):
    """``fedcure-client`` picks the Runtime API port before its SuperNode binds it; another
    process may bind it first. The SuperNode then exits with uvicorn's and Flower's lines, which
    :func:`client.children.runtime_port_taken` recognises (the client picks another port);
    an exit for another reason is not taken for it."""
    import socket
    import subprocess
    import sys

    from client.children import runtime_port_taken
    from fedcure_app.runtime.processes import flower_env

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "client.supernode", "--superlink", "127.0.0.1:9", "--port",
             str(port), "--insecure", "--isolation", "process"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env=flower_env(tmp_path / "flwr-home",
                           {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}))
    finally:
        holder.close()
    tail = (out.stdout + out.stderr)[-4000:]
    assert out.returncode != 0 and runtime_port_taken(tail), tail
    assert not runtime_port_taken("ERROR: Connection refused; SuperNode ID 7 deleted\n")
