"""The warm client (issue 12): the SuperNode entry point with short idle waits, the executor's
secret, a foreign process refused by the SuperNode, and the trainer dying mid-message."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.executor import (
    ExecutorError,
    Trainer,
    TrainerDied,
    read_secret,
    write_secret,
)
from fedcure_app.flower.fastpath.idle_clock import IdleClock, check_flower, install
from tests.flower_range import above, bound

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ the SuperNode entry point
def test_the_supernode_patch_fits_the_pinned_flower():
    """Fails when Flower changes underneath: the installed Flower's SuperNode loop must still
    have the waits it replaces (the version is the gate's: tests/test_fastpath_gate.py)."""
    assert check_flower() == []


@settings(max_examples=50, deadline=None)
@given(lo=st.floats(0.001, 1.0), factor=st.floats(1.0, 50.0), n=st.integers(1, 30))
def test_idle_waits_double_from_min_to_max_and_restart_after_a_message(lo, factor, n):
    hi = min(3.0, lo * factor)
    slept: list[float] = []
    clock = IdleClock(lo, hi, 0.01, sleep=slept.append)
    for _ in range(n):
        clock.sleep(3)
    assert slept[0] == lo
    assert all(b == min(hi, 2 * a) for a, b in zip(slept, slept[1:]))
    assert max(slept) <= hi
    clock.pulled()
    clock.sleep(3)
    assert slept[-1] == lo
    clock.sleep(0.5)  # the reply poll
    clock.sleep(1.25)  # any other wait is left alone
    assert slept[-2:] == [0.01, 1.25]


def test_bad_idle_settings_are_refused():
    with pytest.raises(ValueError):
        IdleClock(0.5, 0.1, 0.01)
    with pytest.raises(ValueError):
        IdleClock(0.1, 0.5, 0.0)


def test_install_replaces_the_loops_clock_and_keeps_pulls_working():
    from flwr.supernode import start_client_internal as loop

    saved = loop.time, loop._pull_and_store_message, loop.pull_objects
    try:
        calls: list[object] = []

        def fake_pull(*args, **kwargs):
            calls.append(args)
            return 7 if len(calls) == 1 else None

        loop._pull_and_store_message = fake_pull
        clock = IdleClock(0.01, 0.08, 0.01, sleep=lambda s: None)
        assert install(clock, loop)
        assert loop.time is clock
        assert loop.pull_objects.__wrapped__ is saved[2]  # object pulls retry after idle_min_s
        clock.next_idle_s(), clock.next_idle_s()  # back-off grown to 0.04
        assert loop._pull_and_store_message("x") == 7  # a message: back-off restarts
        assert clock.next_idle_s() == 0.01
        assert loop._pull_and_store_message("y") is None
        assert calls == [("x",), ("y",)]
    finally:
        loop.time, loop._pull_and_store_message, loop.pull_objects = saved


def test_install_leaves_a_changed_flower_alone(tmp_path: Path):
    changed = tmp_path / "changed_loop.py"
    changed.write_text(textwrap.dedent("""
        import time

        def _pull_and_store_message():
            return None

        def loop():
            while True:
                run_id = _pull_and_store_message()
                if run_id is None:
                    time.sleep(5)  # no longer 3 s
                    continue
    """))
    spec = importlib.util.spec_from_file_location("changed_loop", changed)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    problems = check_flower(module, version=bound(">="))
    assert any("idle sleep" in p for p in problems)
    assert check_flower(module, version=above())[0].startswith(f"flwr {above()} is outside")
    assert not install(IdleClock(0.01, 0.1, 0.01), module)
    assert module.time is time


# ------------------------------------------------------------------ who may drive the trainer
def test_the_secret_is_private_and_a_loose_one_is_refused(tmp_path: Path):
    work = tmp_path / "work"
    path = write_secret(work / "superexec.secret")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(work.stat().st_mode & 0o777) == "0o700"
    assert len(read_secret(path)) == 32
    path.chmod(0o644)
    with pytest.raises(ExecutorError, match="open to other users"):
        read_secret(path)
    path.chmod(0o600)
    work.chmod(0o755)
    with pytest.raises(ExecutorError, match="open to other users"):
        read_secret(path)
    with pytest.raises(ExecutorError, match="cannot read"):
        read_secret(work / "missing")


def _acquire(port: int, headers: dict[str, str]) -> int:
    """A raw AcquireTask (as any local process could send it); the HTTP status."""
    import httpx
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611

    body = AcquireTaskRequest(supported_task_types=["flwr-clientapp"]).SerializeToString(
        deterministic=True)
    res = httpx.post(f"http://127.0.0.1:{port}/v1/runtime/acquire-task", content=body,
                     headers={"content-type": "application/protobuf",
                              "accept": "application/protobuf", **headers}, timeout=10)
    return res.status_code


def test_a_foreign_process_cannot_take_the_supernodes_tasks(tmp_path: Path):
    """The warm SuperNode (as fedcure-client starts it) hands ClientApp tasks (and with them
    the tokens for every other Runtime API call) only to a caller holding the client's secret."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.auth.superexec import create_superexec_auth_metadata, derive_auth_secret

    from fedcure_app.runtime.processes import Child, flower_env, free_ports, port_open

    work = tmp_path / "client"
    secret = write_secret(work / "superexec.secret")
    nowhere, port = free_ports(2)
    node = Child("supernode", [sys.executable, "-m", "client.supernode", "--superlink",
                               f"127.0.0.1:{nowhere}", "--insecure", "--port", str(port),
                               "--isolation", "process", "--superexec-auth-secret-file",
                               str(secret)],
                 log_path=work / "supernode.log", env=flower_env(work / "flwr-home"), cwd=work)
    try:
        end = time.monotonic() + 120
        while not port_open("127.0.0.1", port):
            assert node.poll() is None, node.tail()
            assert time.monotonic() < end, "the SuperNode's Runtime API did not come up"
            time.sleep(0.1)
        req = AcquireTaskRequest(supported_task_types=["flwr-clientapp"])

        def signed(key: bytes) -> dict[str, str]:
            return create_superexec_auth_metadata(
                auth_secret=derive_auth_secret(key), method="/flwr.proto.Runtime/AcquireTask",
                request=req)

        assert _acquire(port, {}) == 401
        assert _acquire(port, signed(os.urandom(32))) == 401
        assert _acquire(port, signed(secret.read_bytes())) == 200
        assert "SuperNode idle wait" in node.tail(80)
    finally:
        node.stop(grace_s=3.0)


# ------------------------------------------------------------------ the trainer dies
FAKE_TRAINER = textwrap.dedent("""
    import os, sys
    from multiprocessing.connection import Connection
    conn = Connection(int(sys.argv[sys.argv.index("--fd") + 1]))
    conn.send(("ready", os.getpid()))
    while True:
        request = conn.recv()
        message = request[1]
        if message == "die":
            os._exit(9)
        conn.send(("ok", f"reply to {message}", request[2]))
""")


def test_a_trainer_that_dies_mid_message_is_reported_and_started_again(tmp_path: Path):
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    trainer = Trainer(max_restarts=1, load_timeout_s=60, argv=[sys.executable, str(script)])
    try:
        assert trainer.train("m1", "ctx", 1, 0.0) == ("reply to m1", "ctx")
        first = trainer.pid
        t0 = time.monotonic()
        with pytest.raises(TrainerDied, match="exited with code 9"):
            trainer.train("die", "ctx", 2, 0.0)
        assert time.monotonic() - t0 < 10  # noticed at once, not after a timeout
        assert trainer.train("m3", "ctx", 3, 0.0) == ("reply to m3", "ctx")
        assert trainer.pid != first and trainer.starts == 2
        with pytest.raises(TrainerDied):
            trainer.train("die", "ctx", 4, 0.0)
        with pytest.raises(ExecutorError, match="giving up"):
            trainer.train("m5", "ctx", 5, 0.0)
    finally:
        trainer.close()


# ------------------------------------------------------------------ end to end: kill -9 the trainer
IN_FLIGHT = re.compile(r"task (\d+): train message (\S+) to the trainer")
READY = re.compile(r"trainer \(pid (\d+)\) ready")


def test_a_trainer_killed_mid_round_is_dropped_from_that_task_restarted_and_trains_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """fedcure launch (1 edge, 2 clients, warm runtime): SIGKILL one client's trainer while it
    trains. The executor answers that message with Flower's CLIENT_APP_CRASHED error at once,
    so the edge round finishes without the client (dropped from that task, no timeout waited
    for), a new trainer starts, the client trains in the later tasks and the run completes."""
    import argparse
    import json
    import signal

    from fedcure_app.cli.launch import Roles, config_from_args, register, start_roles
    from fedcure_app.flower.node_data import read_applied

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = tmp_path / "run"
    args = parser.parse_args([
        "launch", "--edges", "1", "--clients", "2", "--rounds", "2", "--dataset", "digits",
        "--partition", "iid", "--tau-e", "2", "--tau-c", "200", "--lr", "0.05",
        "--eval-every", "2", "--edge-timeout", "300", "--no-progress", "--out", str(out)])
    roles = Roles()
    victim = out / "work" / "client1"
    crashed_group = None
    try:
        monkeypatch.setenv("FEDCURE_CLIENT_RUNTIME", "warm")
        start_roles(config_from_args(args), args, out, roles)
        end = time.monotonic() + 420
        while crashed_group is None:
            assert time.monotonic() < end, "never caught the victim's trainer mid-message"
            assert roles.cloud.poll() is None, roles.cloud.tail(40)
            log = (victim / "executor.log").read_text() if (victim / "executor.log").exists() \
                else ""
            lines = [x for x in log.splitlines() if "task " in x or "ready" in x]
            last = IN_FLIGHT.search(lines[-1]) if lines else None
            if last is None or not last.group(2).startswith("r0-"):  # first task only
                time.sleep(0.05)
                continue
            pid = int(READY.findall(log)[-1])
            os.kill(pid, signal.SIGKILL)
            settle = time.monotonic() + 30
            while time.monotonic() < settle:
                text = (victim / "executor.log").read_text()
                if f"task {last.group(1)}: the trainer (pid {pid}) exited" in text:
                    crashed_group = last.group(2)
                    break
                if f"task {last.group(1)}: completed" in text:
                    break  # it finished before the kill landed: try the next message
                time.sleep(0.05)
        assert roles.cloud.wait(600) == 0, roles.cloud.tail(40)
        for child in roles.clients:
            assert child.wait(60) == 0, child.tail(40)
    finally:
        roles.stop()
    log = (victim / "executor.log").read_text()
    assert "answering with an error and starting a new trainer" in log
    assert "(start 2)" in log
    crashed_task = crashed_group.split("/e")[0]
    result = json.loads((out / "result.json").read_text())
    assert [r["round"] for r in result["records"]] == [1, 2]
    record = next(r for r in result["records"] if r["task_id"] == crashed_task)
    assert 1 in record["dropped"], record
    # the edge did not wait for its 300 s reply deadline: the error reply came at once
    assert record["edge_latency_s"] < 200, record
    later = [a for a in read_applied(victim / "node-data.npz") if a["task"] != crashed_task]
    assert later, "the victim never trained again after its trainer was killed"


def test_warm_client_settings_are_range_checked_from_the_environment():
    from fedcure_app.config import ConfigError, WarmClientConfig

    cfg = WarmClientConfig.from_env({"FEDCURE_SUPERNODE_IDLE_MAX_S": "0.5"}, runtime="flower")
    assert cfg.supernode_idle_max_s == 0.5 and cfg.runtime == "flower"
    assert WarmClientConfig.from_env(cfg.to_env()).supernode_idle_max_s == 0.5
    with pytest.raises(ConfigError, match="supernode_idle_max_s"):
        WarmClientConfig.from_env({"FEDCURE_SUPERNODE_IDLE_MAX_S": "9"})
    with pytest.raises(ConfigError, match="must not exceed"):
        WarmClientConfig.from_env({"FEDCURE_EXECUTOR_POLL_MIN_S": "2",
                                   "FEDCURE_EXECUTOR_POLL_MAX_S": "1"})
    with pytest.raises(ConfigError):
        WarmClientConfig.from_env({}, runtime="cold")


def test_idle_waits_stay_short_for_a_while_after_a_message_then_back_off():
    from fedcure_app.flower.fastpath.idle_clock import IdleClock

    now = [100.0]
    clock = IdleClock(0.01, 0.2, 0.01, sleep=lambda s: None, hot_s=2.0, hot_max_s=0.04,
                      clock=lambda: now[0])
    clock.pulled()
    hot = [clock.next_idle_s() for _ in range(8)]
    assert hot == [0.01, 0.02, 0.04, 0.04, 0.04, 0.04, 0.04, 0.04]
    now[0] += 2.5  # no message for longer than hot_s: the ordinary back-off resumes
    assert clock.next_idle_s() == 0.2
    clock.pulled()
    assert clock.next_idle_s() == 0.01


def test_one_runtime_client_serves_every_task_with_that_tasks_token():
    """The executor keeps one Runtime API client (one kept-alive connection) for all its tasks:
    each request carries the token of the task being run, and none goes out between tasks."""
    import threading

    import httpx
    from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
        SendTaskHeartbeatRequest,
        SendTaskHeartbeatResponse,
    )
    from flwr.supercore.constant import TASK_TOKEN_HEADER

    from client.runtime_client import task_client

    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get(TASK_TOKEN_HEADER))
        body = SendTaskHeartbeatResponse(success=True).SerializeToString()
        return httpx.Response(200, content=body,
                              headers={"content-type": "application/protobuf"})

    client, slot = task_client("127.0.0.1:9", threading.Event())
    client._client = httpx.Client(transport=httpx.MockTransport(answer))  # no network
    for token in ("tok-a", "tok-b"):
        slot.token = token
        client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
    slot.token = ""
    with pytest.raises(RuntimeError, match="outside a task"):
        client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
    assert seen == ["tok-a", "tok-b"]
    client.close()


def test_an_executor_whose_client_role_is_gone_exits(tmp_path: Path):
    """The executor watches the role that started it (``--parent-pid``, on a pidfd: no
    wake-ups while it lives) and stops once that process exits, even before its SuperNode
    exists."""
    import subprocess

    work = tmp_path / "client"
    secret = write_secret(work / "superexec.secret")
    role = subprocess.Popen(["sleep", "60"])  # stands in for fedcure-client
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    exe = subprocess.Popen(
        [sys.executable, "-m", "client.executor", "--runtime-api-address-file",
         str(work / "runtime-api-address"), "--secret-file", str(secret),
         "--parent-pid", str(role.pid)],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            exe.wait(3.0)  # its role lives: it waits for the SuperNode's address
        role.kill()
        role.wait()
        assert exe.wait(60) == 0, exe.stderr.read()[-2000:] if exe.stderr else ""
    finally:
        for p in (exe, role):
            if p.poll() is None:
                p.kill()
                p.wait()


def _fab(clientapp: str) -> bytes:
    """A FAB (zip) whose pyproject.toml names ``clientapp``."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pyproject.toml", textwrap.dedent(f"""
            [project]
            name = "app"
            version = "1.0.0"
            [tool.flwr.app]
            publisher = "someone"
            [tool.flwr.app.components]
            serverapp = "app:server"
            clientapp = "{clientapp}"
            [tool.flwr.app.config]
            """))
    return buf.getvalue()


def test_another_clientapp_is_refused_every_time_and_fedcures_fab_is_read_once(monkeypatch):
    from flwr.common import config

    from client import executor

    monkeypatch.setattr(executor, "_CHECKED_FABS", set())
    reads = []
    real = config.get_fab_config
    monkeypatch.setattr(config, "get_fab_config", lambda c: reads.append(1) or real(c))
    for _ in range(2):
        with pytest.raises(executor.ExecutorError, match="runs only"):
            executor.check_app(_fab("other.app:app"), "h-other")
    for _ in range(3):
        executor.check_app(_fab(executor.CLIENTAPP), "h-fedcure")
    assert len(reads) == 3  # twice the refused FAB, once FedCure's
