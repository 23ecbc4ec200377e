"""The warm client's executor: takes the SuperNode's ClientApp tasks, a warm trainer runs them.

``fedcure-client`` (runtime ``warm``, the default) starts its SuperNode with
``--isolation process`` (Flower then starts no ``flower-superexec``) and
``--superexec-auth-secret-file``, and starts this process instead::

    python -m client.executor (--runtime-api-address 127.0.0.1:PORT | --runtime-api-address-file F)
        --secret-file FILE [--parent-pid PID] [--data-file PATH]

It does, in one long-lived process, what Flower's SuperExec + ``flwr-clientapp`` do per message:
ask the SuperNode's Runtime API for a task (signed with the shared secret, as ``AcquireTask``)
and its message and context, have the ClientApp run, push the reply and the task's status (with
the task's token), and send task heartbeats meanwhile. Where the SuperNode serves them (FedCure's
does) a task takes two requests, one each way (:mod:`fedcure_app.flower.fastpath.task_batches`),
instead of Flower's eight. The ClientApp itself runs in a
:class:`Trainer` child (:mod:`client.trainer`) that keeps torch, the model and the data loaded;
this process never imports torch. Only FedCure's own ClientApp is run: a run whose app names
another ``clientapp`` component gets an error reply. ``fedcure-client`` starts it before its
SuperNode exists (before it registers), with ``--runtime-api-address-file``: the trainer loads
while the cloud forms coalitions, and the executor reads the Runtime API's address from that file
once the SuperNode is started. With ``--data-file`` (the node's data file,
as in its node config) the trainer loads it and warms up before the first message; a trainer
that has to start inside a message (it died) reports the seconds that took with the reply, and
the cloud leaves them out of its latency estimate.

Failures: the trainer dying mid-message is seen at once (its socket closes); the message is
answered with Flower's ``CLIENT_APP_CRASHED`` error (the edge drops the client from that task, as
for any error reply) and the trainer is started again, at most ``trainer_restarts`` times. A
ClientApp that raises is answered with ``CLIENT_APP_RAISED_EXCEPTION``, as Flower does. If this
process dies, ``fedcure-client`` starts it again, and Flower's task-token expiry answers the
message it held.

Who may drive it: the Runtime API listens on 127.0.0.1 only, and the SuperNode hands tasks only
to a caller that signs ``AcquireTask`` with the secret in the client's work directory (a 0600
file in a 0700 directory, :func:`read_secret` refuses anything looser); every later call needs
the token that answer carries. The trainer listens nowhere (a private socket pair).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from client.runtime_client import TaskToken, batch_objects, runtime_client, task_client
from fedcure_app.flower.fastpath import task_batches
from fedcure_app.flower.fastpath.object_pulls import quick_pulls
from fedcure_app.protocol.text import printable
from fedcure_app.runtime.tracing import set_role, trace

log = logging.getLogger("fedcure.client.executor")

#: the ClientApp this executor runs (the component ``fedcure-edge`` submits)
CLIENTAPP = "fedcure_app.flower.client_app:app"
#: Runtime API methods signed with the shared secret (as Flower's SuperExec signs them)
SIGNED_METHODS = frozenset({"/flwr.proto.Runtime/AcquireTask", task_batches.INPUT_METHOD})
#: seconds into a task before its first heartbeat (Flower's SuperNode expires a task after
#: 2 missed 30 s heartbeats; acquiring it counts as the first)
HEARTBEAT_DELAY_S = 10.0


class ExecutorError(RuntimeError):
    """The executor cannot go on (one line)."""


class TrainerDied(RuntimeError):
    """The trainer process ended while it held a message."""


class Stopping(RuntimeError):
    """The executor was asked to stop (SIGTERM/SIGINT) while it waited."""


def write_secret(path: Path) -> Path:
    """A fresh 32-byte secret in ``path`` (mode 0600; its directory made 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    return path


def read_secret(path: Path) -> bytes:
    """The shared secret; :class:`ExecutorError` unless the file and its directory are this
    user's own and closed to everyone else (file 0600 or stricter, directory 0700)."""
    try:
        st = path.stat()
        dst = path.parent.stat()
    except OSError as err:
        raise ExecutorError(f"cannot read the secret file {path}: {err.strerror}") from None
    uid = os.getuid()
    if st.st_uid != uid or dst.st_uid != uid:
        raise ExecutorError(f"secret file {path} (or its directory) is not owned by uid {uid}")
    if stat.S_IMODE(st.st_mode) & 0o077 or stat.S_IMODE(dst.st_mode) & 0o077:
        raise ExecutorError(f"secret file {path} (mode {stat.S_IMODE(st.st_mode):o}) or its "
                            f"directory (mode {stat.S_IMODE(dst.st_mode):o}) is open to other "
                            "users; need 0600 in a 0700 directory")
    secret = path.read_bytes()
    if len(secret) < 16:
        raise ExecutorError(f"secret file {path} holds {len(secret)} bytes; need >= 16")
    return secret


_CHECKED_FABS: set[str] = set()


def check_app(fab_content: bytes, fab_hash: str = "") -> None:
    """Refuse a run whose app is not FedCure's ClientApp (this executor runs only that). A FAB
    whose ``fab_hash`` (its content's hash, checked by the SuperNode) passed is not read again:
    every message of a run carries the same FAB."""
    if fab_hash and fab_hash in _CHECKED_FABS:
        return
    from flwr.common.config import get_fab_config

    conf = get_fab_config(fab_content)
    comp = conf.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    if comp.get("clientapp") != CLIENTAPP:
        raise ExecutorError(f"the run's ClientApp is {comp.get('clientapp')!r}; this client "
                            f"runs only {CLIENTAPP}")
    if fab_hash:
        _CHECKED_FABS.add(fab_hash)


class Trainer:
    """The :mod:`client.trainer` child: started on first use, started again when it died."""

    def __init__(self, max_restarts: int, load_timeout_s: float = 300.0,
                 argv: list[str] | None = None, data_file: str | Path | None = None,
                 stop: threading.Event | None = None, fork: bool | None = None) -> None:
        self.max_restarts = max_restarts
        #: fork the first trainer (:mod:`client.forked`; default: when no ``argv`` is given)
        self.fork = argv is None if fork is None else fork
        self.data_file = str(data_file) if data_file else None
        #: set on SIGTERM: every wait for the child ends with :class:`Stopping`
        self.stop = stop if stop is not None else threading.Event()
        self.load_timeout_s = load_timeout_s
        self.argv = argv or [sys.executable, "-P", "-m", "client.trainer"]
        if data_file:
            self.argv = [*self.argv, "--data-file", str(data_file)]
        self.proc: Any = None  # subprocess.Popen or client.forked.ForkedProcess
        self.conn: Connection | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the child and wait until it has loaded the ClientApp."""
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the child (forked when :attr:`fork` and this is the first start of a
        single-threaded executor, else exec'd); :meth:`wait_ready` waits for it."""
        if self.starts > self.max_restarts:
            raise ExecutorError(f"the trainer died {self.starts - 1} times; giving up")
        self.close()
        from client.forked import start_trainer

        self.proc, self.conn = start_trainer(self.argv, self.fork and self.starts == 0,
                                             self.data_file)
        self.starts += 1

    def wait_ready(self) -> None:
        """Wait until the started child says it has loaded the ClientApp."""
        kind, pid = self._recv(self.load_timeout_s)
        if kind != "ready":
            raise ExecutorError(f"the trainer answered {kind!r} instead of 'ready'")
        log.info("trainer (pid %d) ready%s", pid,
                 f" (start {self.starts})" if self.starts > 1 else "")

    def _recv(self, timeout_s: float | None) -> Any:
        """The child's next answer; :class:`TrainerDied` when it exits first,
        :class:`Stopping` when :attr:`stop` is set first."""
        assert self.conn is not None and self.proc is not None
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self.stop.is_set():
                raise Stopping("stopping: the trainer's answer is abandoned")
            try:
                if self.conn.poll(0.2):
                    return self.conn.recv()
            except (EOFError, OSError):
                pass
            else:
                if self.proc.poll() is None:
                    if end is not None and time.monotonic() > end:
                        raise TrainerDied(f"no answer from the trainer within {timeout_s:.0f} s")
                    continue
            code = self.proc.wait()
            raise TrainerDied(f"the trainer (pid {self.proc.pid}) exited with code {code}")

    def train(self, message: Any, context: Any, task_id: int, started_at: float
              ) -> tuple[Any, Any]:
        """Run the ClientApp on ``message``; (reply, context), or raise :class:`TrainerDied`
        or :class:`RuntimeError` (the ClientApp raised). A trainer started for this message
        has the seconds that took reported with the reply (``startup-s``)."""
        startup_s = 0.0
        if not self.alive():
            t0 = time.monotonic()
            self.start()
            startup_s = time.monotonic() - t0
        assert self.conn is not None
        try:
            self.conn.send(("train", message, context, task_id, started_at, startup_s))
        except OSError:
            pass  # _recv reports the exit
        answer = self._recv(None)
        if answer[0] == "ok":
            return answer[1], answer[2]
        raise RuntimeError(answer[1])

    def close(self, grace_s: float = 1.0) -> None:
        """End the child: it exits when its socket closes, unless it is inside a ClientApp
        call; then it is sent SIGTERM after ``grace_s`` (and SIGKILL 2 s later)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)


def run_task(client: Any, slot: TaskToken, token: str, task_id: int, trainer: Trainer,
             acquired_at: float | None = None, bundle: Any = None) -> str:
    """One ClientApp task, as ``flwr-clientapp`` runs it, over ``client`` with ``token`` in
    ``slot`` (:func:`task_client`); return its final sub-status. With ``bundle`` (the task's
    input as the SuperNode's bundle route answered it,
    :mod:`fedcure_app.flower.fastpath.task_batches`) the input is read from it and the reply and
    status go back in one request.

    When ``trainer.stop`` is set (SIGTERM) the task ends at once: the message gets an error
    reply if the SuperNode still answers, else nothing (Flower's task-token expiry answers it)."""
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supernode.runtime.run_clientapp import pull_task_input

    started = time.time()
    slot.token = token
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    # the first heartbeat only for a task that runs long: taking the task counts as one, and the
    # SuperNode waits 2 x 30 s for the next; a short task saves a request and a thread
    beat = threading.Timer(HEARTBEAT_DELAY_S, heartbeat.start)
    beat.daemon = True
    message = context = reply = None
    sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
    try:
        beat.start()
        message, context, _run, fab = (pull_task_input(client) if bundle is None
                                       else task_batches.inputs(client, bundle))
        mid = message.metadata.message_id
        trace("exe.acquired", mid, t=acquired_at or started)
        trace("exe.input", mid)
        check_app(fab.content, fab.hash_str)
        log.info("task %d: %s message %s to the trainer", task_id,
                 printable(message.metadata.message_type), printable(message.metadata.group_id))
        reply, context = trainer.train(message, context, task_id, started)
        sub_status, details = SubStatus.COMPLETED, ""
    except TrainerDied as err:
        log.warning("task %d: %s; answering with an error and starting a new trainer",
                    task_id, err)
        details = str(err)
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=details),
                            reply_to=message)
    except Exception as err:  # noqa: BLE001 - answered as flwr-clientapp answers it
        details = f"{type(err)}:<'{err}'>"
        if trainer.stop.is_set():  # SIGTERM mid-task (Stopping, or a call given up)
            details = f"the client is stopping ({type(err).__name__})"
            log.info("task %d: %s", task_id, details)
        else:
            log.error("task %d: %s", task_id, details)
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details),
                            reply_to=message)
    finally:
        if reply is not None and context is not None and message is not None:
            trace("exe.push", message.metadata.message_id)
        try:  # with a bundle: the reply, its objects and the status in one request
            sub_status = task_batches.finish(client, bundle is not None, task_id, reply,
                                             context, sub_status, details)
        except Exception as err:  # noqa: BLE001
            if not trainer.stop.is_set():
                raise
            log.info("task %d: stopping; its status was not sent (%s)", task_id,
                     type(err).__name__)
        finally:
            beat.cancel()
            beat.join()
        if heartbeat.is_running:
            heartbeat.stop()
        slot.token = ""
    log.info("task %d: %s in %.3f s (message %s)", task_id, sub_status, time.time() - started,
             printable(getattr(getattr(message, "metadata", None), "group_id", "?")))
    return sub_status


def serve(address: str, secret: bytes, stop: threading.Event, cfg: Any,
          trainer: Trainer, waker: Any = None) -> None:
    """Ask the SuperNode for ClientApp tasks until ``stop`` is set, running each. Between empty
    asks it waits its back-off, or less when ``waker`` (a :class:`client.wake.WakeReader`)
    hears the SuperNode pull a message."""
    import httpx
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import (
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )

    client = runtime_client(address, [
        RuntimeVersionHttpInterceptor(component_name="SuperExec"),
        SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=SIGNED_METHODS)],
        stop)
    from client.wake import AskPacer

    pacer = AskPacer(cfg.executor_poll_min_s, cfg.executor_poll_max_s, woken=waker is not None)
    tasks, slot = task_client(address, stop)
    requests = task_batches.TaskRequests()
    try:
        while not stop.is_set():
            try:  # the task's input comes with it where the SuperNode serves the bundle
                res, bundle = requests.acquire(client, AcquireTaskRequest(
                    supported_task_types=[TaskType.CLIENT_APP.value]))
            except httpx.HTTPError as err:
                log.debug("Runtime API not answering: %s", err)
                stop.wait(0.5)
                continue
            if res.HasField("task") and res.token:
                run_task(tasks, slot, res.token, int(res.task.task_id), trainer, time.time(),
                         bundle)
                pacer.task_done()
                if not trainer.alive():  # it died: have a new one loaded for the next message
                    try:
                        trainer.start()
                    except TrainerDied as err:
                        log.warning("%s; trying again with the next message", err)
                continue
            wait = pacer.next_wait()
            if waker is None:
                stop.wait(wait)
            elif waker.wait(wait):
                pacer.woke()  # a message arrived: ask now
    finally:
        client.close()
        tasks.close()


def wait_for_address(path: Path, stop: threading.Event, poll_s: float = 0.05) -> str | None:
    """HOST:PORT from ``path`` once it exists and is not empty; None when ``stop`` is set
    first."""
    while not stop.is_set():
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            return text
        stop.wait(poll_s)
    return None


def wait_for_listener(address: str, stop: threading.Event, poll_s: float = 0.02) -> bool:
    """Wait until something accepts TCP connections at HOST:PORT ``address`` (the SuperNode's
    Runtime API coming up); False when ``stop`` is set first. Flower's HTTP client backs off
    exponentially (1 s, 2 s, ...) on a refused connection, so asking before the SuperNode listens
    would cost seconds of the first task."""
    host, _, port = address.rpartition(":")
    while not stop.is_set():
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            stop.wait(poll_s)
    return False


def main(argv: list[str] | None = None) -> int:
    from fedcure_app.config import ConfigError, WarmClientConfig

    p = argparse.ArgumentParser(prog="python -m client.executor",
                                description="FedCure warm executor (started by fedcure-client)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--runtime-api-address", metavar="HOST:PORT",
                       help="the SuperNode's Runtime API")
    where.add_argument("--runtime-api-address-file", type=Path, metavar="FILE",
                       help="a file that will hold HOST:PORT of the SuperNode's Runtime API "
                            "(read once it exists)")
    p.add_argument("--secret-file", required=True, type=Path,
                   help="shared secret of the SuperNode's --superexec-auth-secret-file")
    p.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    p.add_argument("--data-file", type=Path,
                   help="the node's data file: the trainer loads it before the first message")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        cfg = WarmClientConfig.from_env(dict(os.environ))
        secret = read_secret(args.secret_file)
    except (ConfigError, ExecutorError) as err:
        print(f"client.executor: error: {err}", file=sys.stderr)
        return 2
    stop = threading.Event()
    set_role("executor")
    from flwr.supernode.runtime import run_clientapp

    # the SuperNode hands out a task before it holds the message's objects: retry them after
    # 10 ms, not Flower's 1 s (fedcure_app.flower.fastpath.object_pulls)
    quick_pulls(run_clientapp, "pull_and_inflate_object_from_tree")
    batch_objects(run_clientapp)  # a message's objects in one request each way
    # forked while this process has one thread and has imported Flower (client.forked)
    trainer = Trainer(cfg.trainer_restarts, data_file=args.data_file, stop=stop)
    trainer.spawn()

    wakers: list[Any] = []  # a stop ends the executor's wait for a wake-up at once

    def on_signal(_signum: Any = None, _frame: Any = None) -> None:
        stop.set()
        for w in wakers:
            w.interrupt()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.parent_pid:
        from fedcure_app.runtime.processes import wait_gone

        def watch() -> None:
            wait_gone(args.parent_pid)  # sleeps until the role exits (no wake-ups meanwhile)
            on_signal()

        threading.Thread(target=watch, name="watch-parent", daemon=True).start()
    try:
        trainer.wait_ready()  # torch, the model and the data loaded before the first message
        address = args.runtime_api_address or wait_for_address(args.runtime_api_address_file,
                                                               stop)
        if address is None or not wait_for_listener(address, stop):
            return 0  # stopped before the SuperNode existed
        from client.wake import reader_from_env

        waker = reader_from_env()
        if waker is not None:
            wakers.append(waker)
        try:
            serve(address, secret, stop, cfg, trainer, waker)
        finally:
            if waker is not None:
                waker.close()
    except Stopping:
        pass
    except (ExecutorError, TrainerDied) as err:
        print(f"client.executor: error: {err}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
