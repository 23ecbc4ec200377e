"""The processes ``fedcure-client`` starts and stops: its SuperNode (Flower's, or
:mod:`client.supernode` prestarted before registration) and its warm executor
(:mod:`client.executor`), with the files through which it hands them their arguments, and
the one-shot children that print one JSON line (:func:`json_child`: the partition cut, the
training-rate probe)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("fedcure.client")


class ChildFailed(RuntimeError):
    """A one-shot child exited non-zero: its ``returncode`` and the last line of its standard
    error (``tail``)."""

    def __init__(self, returncode: int, tail: str) -> None:
        super().__init__(tail)
        self.returncode, self.tail = returncode, tail


def json_child(argv: list[str], timeout_s: float, stop: threading.Event | None = None
               ) -> Any:
    """Run ``argv`` and return the JSON value on the last line of its standard output; None
    when ``stop`` is set first (the child is stopped: SIGTERM, SIGKILL 5 s later).
    :class:`ChildFailed` when it exits non-zero, :class:`subprocess.TimeoutExpired` after
    ``timeout_s`` seconds (the child is stopped then too)."""
    import subprocess
    import tempfile

    stop = stop if stop is not None else threading.Event()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, text=True)
        end = time.monotonic() + timeout_s
        while proc.poll() is None:
            if stop.is_set() or time.monotonic() > end:
                proc.terminate()
                try:
                    proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if stop.is_set():
                    return None
                raise subprocess.TimeoutExpired(argv, timeout_s)
            stop.wait(0.05)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    if proc.returncode != 0:
        tail = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ChildFailed(proc.returncode, tail)
    return json.loads(out.strip().splitlines()[-1])


def supernode_argv(edge_address: str, port: int, client_id: int, cpufreq: str,
                   data_file: Path, args: argparse.Namespace) -> list[str]:
    """``flower-supernode`` to ``edge_address`` with this client's node config."""
    from fedcure_app.flower.tools import flower_bin

    node_config = f'client-id={client_id} cpufreq="{cpufreq}" data-file="{data_file}"'
    if getattr(args, "data", None):  # own data: Flower's data-path (data-file is its reading)
        node_config += f" data-path={json.dumps(str(Path(args.data).resolve()))}"
    if getattr(args, "cpufreq_root", None):
        node_config += f' cpufreq-root="{Path(args.cpufreq_root).resolve()}"'
    if cpufreq == "cgroup":
        node_config += (f' host-samples-per-s={float(getattr(args, "host_samples_per_s", 0.0))}'
                        f' cgroup-prefix="{getattr(args, "cgroup_prefix", "fedcure")}"')
    device = getattr(args, "device_in_use", "cpu")
    if device != "cpu":
        node_config += f' device="{device}" gpufreq="{getattr(args, "gpufreq_in_use", "off")}"'
        if getattr(args, "gpufreq_root", None):
            node_config += f' gpufreq-root="{Path(args.gpufreq_root).resolve()}"'
    if getattr(args, "runtime", "flower") == "warm":
        argv = [sys.executable, "-m", "client.supernode", "--superlink", edge_address,
                "--port", str(port), "--node-config", node_config, "--isolation", "process",
                "--superexec-auth-secret-file", str(args.secret_file)]
    else:
        argv = [flower_bin("flower-supernode"), "--superlink", edge_address,
                "--port", str(port), "--node-config", node_config]
    if args.insecure:
        argv.append("--insecure")
    elif args.tls_ca:
        argv += ["--root-certificates", str(Path(args.tls_ca).resolve())]
    if getattr(args, "supernode_key_file", None):
        argv += ["--auth-supernode-private-key", str(args.supernode_key_file)]
    return argv


def start_supernode(argv: list[str], work: Path, env: dict[str, str], stop: threading.Event,
                    auth: bool, wait_s: float = 120.0) -> Any:
    """Start ``flower-supernode``. Under SuperNode authentication the edge registers this
    client's key a moment after Register answers; a SuperNode that started before that exits
    (Flower's code 305) and is started again (for at most ``wait_s``)."""
    from fedcure_app.runtime.processes import Child
    from fedcure_app.flower.supernode_auth import refused

    end = time.monotonic() + wait_s
    while True:
        child = Child("flower-supernode", argv, log_path=work / "supernode.log", env=env,
                      cwd=work)
        if not auth:
            return child
        # a refused SuperNode exits within a few seconds of its first connection attempt
        settle = time.monotonic() + 15.0
        while time.monotonic() < settle and child.poll() is None and not stop.is_set():
            if "SuperNode ID" in (child.tail(40) or ""):
                return child
            time.sleep(0.2)
        code = child.poll()
        if code is None or stop.is_set():
            return child
        if not refused(child.tail(60) or "") or time.monotonic() > end:
            return child  # the caller reports the exit
        child.stop(grace_s=1.0)  # and the SuperExec it started
        (work / "supernode.log").rename(work / "supernode-refused.log")
        log.info("the edge has not registered this SuperNode's key yet; starting it again")
        stop.wait(1.0)


#: seconds between the client's asks whether training is over (``Monitor.Status``): each ask
#: costs the client and the cloud CPU that an edge round on the same host would use, but the
#: asks must come closer than the cloud's linger after the last round (cloud_server.server:
#: it answers DONE for 3 s, then stops), or a client misses the end and takes the cloud for lost
STATUS_EVERY_S = 2.0
#: seconds between the client's looks at its children (SuperNode and executor exited?); an ask
#: comes at most STATUS_EVERY_S + WATCH_EVERY_S after the last
WATCH_EVERY_S = 0.5
#: where ``fedcure-client`` writes the SuperNode's Runtime API address for an executor started
#: before the SuperNode (in its work directory)
RUNTIME_ADDRESS_FILE = "runtime-api-address"
#: where it writes the arguments of a SuperNode started before registration (work directory)
SUPERNODE_ARGV_FILE = "supernode-argv.json"


def prestart_supernode(work: Path, env: dict[str, str]) -> Any:
    """A :mod:`client.supernode` that imports Flower now and waits for its arguments
    (:func:`release_supernode`), so Flower's import does not land in the first task."""
    from fedcure_app.runtime.processes import Child

    argv = [sys.executable, "-m", "client.supernode", "--argv-file",
            str(work / SUPERNODE_ARGV_FILE)]
    return Child("flower-supernode", argv, log_path=work / "supernode.log", env=env, cwd=work)


def release_supernode(work: Path, argv: list[str]) -> None:
    """Hand a prestarted SuperNode its arguments: ``argv`` as :func:`supernode_argv` gives it
    (``python -m client.supernode ARGS``), written atomically."""
    tmp = work / (SUPERNODE_ARGV_FILE + ".tmp")
    tmp.write_text(json.dumps(argv[3:]))
    tmp.replace(work / SUPERNODE_ARGV_FILE)


def start_executor(work: Path, port: int | None, env: dict[str, str],
                   data_file: Path | None = None) -> Any:
    """The warm executor (:mod:`client.executor`) for the SuperNode's Runtime API on ``port``
    (log in ``work/executor.log``); its trainer loads ``data_file`` before the first message.
    ``port`` None: the SuperNode does not exist yet; the executor reads its address from
    ``work/runtime-api-address`` once :func:`publish_runtime_port` has written it."""
    from fedcure_app.runtime.processes import Child

    where = (["--runtime-api-address", f"127.0.0.1:{port}"] if port is not None
             else ["--runtime-api-address-file", str(work / RUNTIME_ADDRESS_FILE)])
    # -P: its trainers build the task's model; no working folder on sys.path (model_consent)
    argv = [sys.executable, "-P", "-m", "client.executor", *where,
            "--secret-file", str(work / "superexec.secret"), "--parent-pid", str(os.getpid())]
    if data_file is not None:
        argv += ["--data-file", str(data_file)]
    return Child("client.executor", argv, log_path=work / "executor.log", env=env, cwd=work)


#: what a SuperNode logs when its Runtime API port was taken between the client's pick and its
#: bind (uvicorn's line; Flower then raises "SuperNode Runtime HTTP API failed to start")
PORT_TAKEN_MARKS = ("address already in use", "Runtime HTTP API failed to start")


def runtime_port_taken(log_tail: str) -> bool:
    """Whether a SuperNode that exited did so because its Runtime API port was taken (another
    process bound the port ``fedcure-client`` picked before the SuperNode could)."""
    return any(mark in log_tail for mark in PORT_TAKEN_MARKS)


def publish_runtime_port(work: Path, port: int) -> None:
    """Tell an executor started before the SuperNode where its Runtime API is (atomically)."""
    tmp = work / (RUNTIME_ADDRESS_FILE + ".tmp")
    tmp.write_text(f"127.0.0.1:{port}\n")
    tmp.replace(work / RUNTIME_ADDRESS_FILE)


#: how long the executor and the SuperNode may take to exit on SIGTERM (s); both are stopped at
#: once, so a client stops within compose's 10 s grace. The executor takes well under a second
#: (client.runtime_client.stoppable_retries); the SuperNode's HTTP server shuts down
#: gracefully, which took over 3 s on a loaded 2-core machine.
CHILD_STOP_GRACE_S = 8.0
#: the same once the run is over and the client ends on its own (s): the SuperNode's graceful
#: exit has taken over 8 s on a machine with a load average of 25 (its own force-exit timer is
#: 5 s, started only once its exit handlers run); fedcure launch waits 60 s for clients to end
RUN_END_GRACE_S = 30.0


def stop_children(children: list[Any], grace_s: float = CHILD_STOP_GRACE_S) -> None:
    """SIGTERM ``children`` together and wait for all of them (each killed after ``grace_s``)."""
    threads = [threading.Thread(target=c.stop, kwargs={"grace_s": grace_s}) for c in children]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
