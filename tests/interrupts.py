"""Ctrl-C stops the suite, whatever a test ran in-process.

Code under test takes SIGINT for itself: a role's ``main`` (``role_start`` turns SIGINT and
SIGTERM into a clean stop, and the handler stays after it returns), ``fedcure``'s ``main``
(catches ``KeyboardInterrupt`` and returns 130), asyncio's signal handlers, Flower's. A SIGINT
that lands there would stop only that code, and the suite would run on. So, for the tests'
process:

- every SIGINT handler installed from the main thread is wrapped to note the signal first
  (:func:`track_sigint`, installed by ``tests/conftest.py`` before any test runs);
- after every test the SIGINT and SIGTERM handlers are put back as they were before it
  (:func:`restore_handlers`), so one in-process role does not change how later tests stop;
- after a test during which a SIGINT arrived, the session stops (:func:`stop_if_interrupted`,
  pytest's ``session.shouldstop``): the test's own clean-up (fixtures, ``finally``) runs, the
  rest is skipped.

A test that started a process which starts others (``fedcure launch``/``testbed``, a role) ends
it with :func:`end_process` when the test did not: SIGTERM, so that it stops its children and
removes what it made (namespaces, cgroups), and SIGKILL only after a grace period. A SIGKILL at
once would orphan them.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

_real_signal = signal.signal
_interrupted = threading.Event()
HANDLED = (signal.SIGINT, signal.SIGTERM)


def _tracked(handler: Any) -> Any:
    if not callable(handler) or getattr(handler, "_notes_sigint", False):
        return handler  # SIG_DFL, SIG_IGN, None, or already wrapped

    def on_sigint(signum: int, frame: Any) -> Any:
        _interrupted.set()
        return handler(signum, frame)

    on_sigint._notes_sigint = True  # type: ignore[attr-defined]
    on_sigint.__wrapped__ = handler  # type: ignore[attr-defined]
    return on_sigint


def _signal(signum: int, handler: Any) -> Any:
    if signum == signal.SIGINT and threading.current_thread() is threading.main_thread():
        handler = _tracked(handler)
    return _real_signal(signum, handler)


def track_sigint() -> None:
    """Wrap every SIGINT handler installed from now on, and the current one."""
    signal.signal = _signal  # type: ignore[assignment]
    current = signal.getsignal(signal.SIGINT)
    if callable(current):
        _real_signal(signal.SIGINT, _tracked(current))


def interrupted() -> bool:
    """Whether a SIGINT reached this process since :func:`track_sigint`."""
    return _interrupted.is_set()


def handlers() -> dict[int, Callable[..., Any] | int | None]:
    """The current SIGINT and SIGTERM handlers."""
    return {s: signal.getsignal(s) for s in HANDLED}


def restore_handlers(before: dict[int, Any]) -> list[str]:
    """Put back ``before``'s handlers where a test changed them; the signals' names."""
    changed = []
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            _real_signal(sig, handler)
            changed.append(signal.Signals(sig).name)
    return changed


def stop_if_interrupted(session: Any) -> None:
    """Ask pytest to stop after the current test when a SIGINT arrived."""
    if _interrupted.is_set() and not session.shouldstop:
        session.shouldstop = "interrupted by SIGINT (Ctrl-C)"


def end_process(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """Stop ``proc`` if it still runs: SIGTERM, up to ``grace_s`` to clean up, then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


__all__ = ["HANDLED", "end_process", "handlers", "interrupted", "restore_handlers", "stop_if_interrupted",
           "track_sigint"]
