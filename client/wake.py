"""Wake-on-arrival between a client's SuperNode and its warm executor: a FIFO in the work folder.

Flower 1.41's SuperNode hands ClientApp tasks out only when asked (``AcquireTask`` on its Runtime
API), so the executor polls. ``fedcure-client`` makes a FIFO (mode 0600, in its 0700 work
folder) and names it to both in ``FEDCURE_WAKE_FIFO``: the SuperNode (:mod:`client.supernode`)
writes one byte each time it has pulled a message and its objects, and the executor
(:mod:`client.executor`) waits on the FIFO between polls, so it asks for the task at once instead
of after its back-off. The poll stays as the fallback (a lost byte costs at most
:data:`WAKE_FALLBACK_S`, stock Flower's own 3 s idle poll), so nothing depends on the FIFO:
without it, or when it cannot be opened, both behave as before. The FIFO exists only while the
SuperNode's patch is on (:func:`client.supernode.main` removes it otherwise, and
``fedcure-client`` makes none while the fast path's gate is closed): an executor that no
SuperNode would wake polls with its short back-off instead.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import stat
from pathlib import Path

log = logging.getLogger("fedcure.client.wake")

#: the environment variable naming the FIFO
WAKE_ENV = "FEDCURE_WAKE_FIFO"


def make_fifo(path: Path) -> Path | None:
    """A fresh FIFO at ``path`` (mode 0600); None (logged) where FIFOs cannot be made."""
    try:
        path.unlink(missing_ok=True)
        os.mkfifo(path, 0o600)
    except (OSError, AttributeError) as err:  # AttributeError: no mkfifo on this platform
        log.info("no wake FIFO (%s); the executor polls its SuperNode", err)
        return None
    return path


class WakeReader:
    """The executor's end: :meth:`wait` returns early when the SuperNode wrote."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        st = os.stat(self.path)
        if not stat.S_ISFIFO(st.st_mode):
            raise OSError(errno.EINVAL, f"{self.path} is not a FIFO")
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        # a writer of our own keeps the FIFO open, so select() never reports a permanent EOF
        # between SuperNode writes (or before the SuperNode exists)
        self._keep = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for a wake-up; True when one came (all pending
        bytes are consumed)."""
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
        if not ready:
            return False
        try:
            while os.read(self._fd, 4096):
                pass
        except BlockingIOError:
            pass
        return True

    def interrupt(self) -> None:
        """End a :meth:`wait` now (from a signal handler or another thread): the executor's
        stop must not wait out a long fallback. Never blocks or raises."""
        try:
            os.write(self._keep, b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def close(self) -> None:
        for fd in (self._fd, self._keep):
            try:
                os.close(fd)
            except OSError:
                pass


class WakeWriter:
    """The SuperNode's end: :meth:`notify` writes one byte and never blocks or raises."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._fd: int | None = None

    def notify(self) -> None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(self._fd, b"\x01")
        except BlockingIOError:
            pass  # the FIFO is full: the executor has wake-ups pending already
        except OSError:  # no reader yet (ENXIO), reader gone (EPIPE), FIFO removed
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None


#: the longest wait between task requests when the SuperNode wakes the executor (seconds): the
#: ask is then only a fallback for a lost wake-up, and each is a request to the SuperNode; never
#: longer than stock Flower's SuperNode idle poll (3 s), so a lost wake-up is never slower
WAKE_FALLBACK_S = 3.0
#: after a wake-up, asks keep doubling from the shortest wait up to this (seconds), then wait for
#: the next wake-up or the fallback (a wake can come a moment before the task can be taken)
WAKE_QUICK_S = 0.5


class AskPacer:
    """How long the executor waits after an ask of its SuperNode that brought no task (seconds).

    Without wake-ups (``woken`` False) the waits double from ``min_s`` to ``max_s``. With them,
    an empty ask right after a task waits for the next wake-up (the next message wakes it), an
    empty ask after a wake-up doubles from ``min_s`` while under :data:`WAKE_QUICK_S`, and every
    other wait is the :data:`WAKE_FALLBACK_S` fallback, so an idle executor asks every 3 s.
    """

    def __init__(self, min_s: float, max_s: float, *, woken: bool) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError(f"need 0 < min_s <= max_s, got {min_s}, {max_s}")
        self.min_s = min_s
        self.woken = woken
        self.longest = max(max_s, WAKE_FALLBACK_S) if woken else max_s
        self._wait = min_s
        self._after_task = False

    def task_done(self) -> None:
        """A task ran: the next ask comes at once."""
        self._wait = self.min_s
        self._after_task = True

    def woke(self) -> None:
        """A wake-up came: ask now, then quickly for a little while."""
        self._wait = self.min_s
        self._after_task = False

    def next_wait(self) -> float:
        """The wait after an empty ask (and the back-off for the one after)."""
        if self.woken and self._after_task:
            self._after_task = False
            self._wait = self.longest
        wait = self._wait
        if self.woken and wait * 2 > WAKE_QUICK_S:
            self._wait = self.longest
        else:
            self._wait = min(self.longest, wait * 2)
        return wait


def reader_from_env(env: dict[str, str] | None = None) -> WakeReader | None:
    """The executor's :class:`WakeReader` when ``FEDCURE_WAKE_FIFO`` names a FIFO, else None."""
    path = (os.environ if env is None else env).get(WAKE_ENV)
    if not path:
        return None
    try:
        return WakeReader(path)
    except OSError as err:
        log.warning("wake FIFO %s unusable (%s); polling the SuperNode", path, err)
        return None


def writer_from_env(env: dict[str, str] | None = None) -> WakeWriter | None:
    """The SuperNode's :class:`WakeWriter` when ``FEDCURE_WAKE_FIFO`` is set, else None."""
    path = (os.environ if env is None else env).get(WAKE_ENV)
    return WakeWriter(path) if path else None


__all__ = ["AskPacer", "WAKE_ENV", "WAKE_FALLBACK_S", "WAKE_QUICK_S", "WakeReader", "WakeWriter",
           "make_fifo", "reader_from_env", "writer_from_env"]
