"""The warm trainer forked from its executor, so that the two share what both have loaded.

The executor (:mod:`client.executor`) has imported Python, numpy, pydantic and Flower before it
starts its trainer; a trainer started with ``python -m client.trainer`` imports all of them again
into pages of its own (about 24 MB of the client's PSS measured for digits). A trainer forked
from the executor instead inherits those pages copy-on-write: they stay shared (PSS counts a
page shared by two processes half in each) as long as neither writes them. The executor freezes
its garbage collector's objects first (``gc.freeze``), so no collection in either process walks
over, and so copies, the shared objects. The child then imports torch and FedCure's ClientApp and
serves its end of the socket pair (:func:`client.trainer.serve`), as the exec'd trainer does.

A fork is taken only from a single-threaded executor (its first trainer, before it starts any
thread): forking a process whose other threads may hold locks is unsafe. A trainer started
again later (it died) is exec'd as before. The child names itself ``fedcure-trainer``
(``/proc/<pid>/comm``), since its command line is its executor's.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

log = logging.getLogger("fedcure.client.executor")

#: the forked trainer's process name (``/proc/<pid>/comm``, at most 15 characters)
TRAINER_COMM = "fedcure-trainer"


class ForkedProcess:
    """A forked child with the part of :class:`subprocess.Popen`'s interface the executor uses
    (``pid``, ``returncode``, ``poll``, ``wait``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(TRAINER_COMM, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


def can_fork() -> bool:
    """Whether this process may fork its trainer: Linux (``os.fork``) and no other thread."""
    return hasattr(os, "fork") and sys.platform.startswith("linux") \
        and threading.active_count() == 1


def _name_process(name: str) -> None:
    """Set ``/proc/self/comm`` (best effort: ``prctl(PR_SET_NAME)``)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def fork_trainer(mine: socket.socket, theirs: socket.socket, data_file: str | None
                 ) -> ForkedProcess:
    """Fork a trainer serving ``theirs``, its end of the socket pair (closed here in the
    parent; ``mine``, the executor's end, is closed in the child, so that the child sees the
    pair close when the executor goes); the child never returns from this call."""
    gc.freeze()  # the objects loaded so far stay shared: no collection touches them
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        theirs.close()
        return ForkedProcess(pid)
    code = 1
    try:  # the child: a fresh trainer process in all but its inherited pages
        mine.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _name_process(TRAINER_COMM)
        from client.trainer import serve
        from fedcure_app.runtime.tracing import set_role

        set_role("trainer")
        conn = Connection(theirs.detach())
        try:
            code = serve(conn, data_file)
        finally:
            conn.close()
    except BaseException:  # noqa: BLE001 - the child must never return into the executor
        log.exception("the forked trainer failed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def start_trainer(argv: list[str], fork: bool, data_file: str | None
                  ) -> tuple[ForkedProcess | subprocess.Popen, Connection]:
    """A trainer and the executor's end of its socket pair: forked when ``fork`` and
    :func:`can_fork`, else ``argv --fd N`` exec'd."""
    mine, theirs = socket.socketpair()
    if fork and can_fork():
        proc: ForkedProcess | subprocess.Popen = fork_trainer(mine, theirs, data_file)
    else:
        try:
            proc = subprocess.Popen([*argv, "--fd", str(theirs.fileno())],
                                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
    return proc, Connection(mine.detach())
