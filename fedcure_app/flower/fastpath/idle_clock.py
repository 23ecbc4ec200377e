"""The SuperNode's idle clock: Flower's ``flower-supernode`` loop with short idle waits.

Flower's SuperNode main loop (``flwr.supernode.start_client_internal``) sleeps a hard-coded 3 s
whenever a pull from the SuperLink finds no message, and polls its own state every 0.5 s for the
ClientApp's reply. Neither has a setting. :func:`install` replaces the loop module's ``time`` by
:class:`IdleClock` (see its docstring) and wraps its ``_pull_and_store_message`` so that a
pulled message resets the back-off (and wakes the executor, :mod:`client.wake`);
:func:`wake_on_replies` makes the Runtime API's push handlers end the reply poll at once.
``python -m client.supernode`` (:mod:`client.supernode`) installs both before it runs Flower's
``flower-supernode``.

The patch is applied only where the fast path's gate is open
(:mod:`fedcure_app.flower.fastpath.gate`, patch name ``idle_clock``) and only when the loop's
source still has the two sleeps it replaces (:func:`check_flower`); otherwise it logs why and
Flower runs unchanged. ``tests/deployment/test_warm_client.py`` fails when Flower changes
underneath.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time as _time
from types import ModuleType
from typing import Any

from fedcure_app.flower.fastpath.gate import report_off, version_problem
from fedcure_app.flower.fastpath.held_pulls import HELD_MIN_S
from fedcure_app.flower.fastpath.object_pulls import quick_pulls

log = logging.getLogger("fedcure.client.supernode")

#: the hard-coded waits of ``flwr.supernode.start_client_internal`` (seconds)
FLOWER_IDLE_SLEEP_S = 3
FLOWER_REPLY_POLL_S = 0.5


class IdleClock:
    """Stands in for the ``time`` module inside Flower's SuperNode loop.

    ``sleep(3)`` (nothing pulled) waits the current back-off, which doubles from ``idle_min_s``
    to ``idle_max_s``; :meth:`pulled` (a message arrived) resets it. ``sleep(0.5)`` (waiting for
    the ClientApp's reply) waits ``reply_poll_s``, or, once :func:`wake_on_replies` has hooked
    the Runtime API, until the ClientApp pushes its reply or an object of it (at most Flower's
    own 0.5 s), so a SuperNode does not spin while its client trains. Other sleeps and
    attributes are the real ``time`` module's. Within ``hot_s`` seconds of the last pulled
    message the idle waits stay at most ``hot_max_s`` (an edge round's next message comes a
    moment after the slowest client's reply; a SuperLink that does not hold pulls cannot wait
    for it, so the SuperNode asks more often while rounds are under way, and backs off once
    they stop).
    """

    def __init__(self, idle_min_s: float, idle_max_s: float, reply_poll_s: float,
                 sleep: Any = _time.sleep, *, hot_s: float = 0.0, hot_max_s: float = 0.04,
                 clock: Any = _time.monotonic) -> None:
        if not 0 < idle_min_s <= idle_max_s:
            raise ValueError(f"need 0 < idle_min_s <= idle_max_s, got {idle_min_s}, "
                             f"{idle_max_s}")
        if reply_poll_s <= 0:
            raise ValueError(f"reply_poll_s must be > 0, got {reply_poll_s}")
        if hot_s < 0 or hot_max_s <= 0:
            raise ValueError(f"need hot_s >= 0 and hot_max_s > 0, got {hot_s}, {hot_max_s}")
        self.hot_s = hot_s
        self.hot_max_s = hot_max_s
        self._clock = clock
        self._last_pull = -float("inf")
        self.idle_min_s = idle_min_s
        self.idle_max_s = idle_max_s
        self.reply_poll_s = reply_poll_s
        self._sleep = sleep
        self._next = idle_min_s
        self._held = False
        self._lock = threading.Lock()
        #: set by the Runtime API when the ClientApp pushes (:func:`wake_on_replies`)
        self.reply_event: threading.Event | None = None

    def pulled(self) -> None:
        """A message was pulled: the next idle waits start short again."""
        with self._lock:
            self._next = self.idle_min_s
            self._last_pull = self._clock()

    def held(self) -> None:
        """An empty pull was held by the SuperLink (it waited for a message that did not come):
        the next idle wait is ``idle_min_s``, since the next pull waits at the SuperLink again."""
        with self._lock:
            self._held = True

    def next_idle_s(self) -> float:
        """The wait the next idle sleep takes (and double the one after)."""
        with self._lock:
            if self._held:
                self._held = False
                self._next = self.idle_min_s
                return self.idle_min_s
            wait = self._next
            if self._clock() - self._last_pull < self.hot_s:
                wait = min(wait, self.hot_max_s)
            self._next = min(self.idle_max_s, self._next * 2)
            return wait

    def sleep(self, seconds: float) -> None:
        if seconds == FLOWER_IDLE_SLEEP_S:
            self._sleep(self.next_idle_s())
        elif seconds == FLOWER_REPLY_POLL_S:
            event = self.reply_event
            if event is None:
                self._sleep(self.reply_poll_s)
            else:  # woken by the ClientApp's push; Flower's own 0.5 s poll stays the fallback
                event.wait(FLOWER_REPLY_POLL_S)
                event.clear()
        else:
            self._sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(_time, name)


def check_flower(module: ModuleType | None = None, version: str | None = None) -> list[str]:
    """Why the patch cannot be applied to this Flower (empty when it can)."""
    outside = version_problem(version, patch="idle_clock")
    problems: list[str] = [] if outside is None else [outside]
    if module is None:
        from flwr.supernode import start_client_internal as module  # type: ignore[no-redef]
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError) as err:
        return [*problems, f"cannot read the SuperNode loop's source: {err}"]
    wants = {
        "the idle sleep": f"time.sleep({FLOWER_IDLE_SLEEP_S})",
        "the reply poll": f"time.sleep({FLOWER_REPLY_POLL_S})",
        "the pull step": "run_id = _pull_and_store_message(",
        "the idle branch": "if run_id is None:",
    }
    for what, text in wants.items():
        if text not in source:
            problems.append(f"{what} ({text}) is no longer in {module.__name__}")
    if not isinstance(getattr(module, "time", None), (ModuleType, IdleClock)):
        problems.append(f"{module.__name__} no longer imports the time module")
    if not callable(getattr(module, "_pull_and_store_message", None)):
        problems.append(f"{module.__name__}._pull_and_store_message is gone")
    return problems


def install(clock: IdleClock, module: ModuleType | None = None, waker: Any = None) -> bool:
    """Put ``clock`` into Flower's SuperNode loop; False (and a warning) when Flower differs.
    ``waker`` (a :class:`client.wake.WakeWriter`) hears of every message pulled."""
    if module is None:
        from flwr.supernode import start_client_internal as module  # type: ignore[no-redef]
    problems = check_flower(module)
    if problems:
        report_off(log, "running flower-supernode unchanged (its 3 s idle sleep stays): %s",
                   "; ".join(problems))
        return False
    pull = module._pull_and_store_message

    def pull_and_reset(*args: Any, **kwargs: Any) -> Any:
        started = _time.monotonic()
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            clock.pulled()
            if waker is not None:  # the message and its objects are in: the executor may ask
                waker.notify()
        elif _time.monotonic() - started >= HELD_MIN_S:
            clock.held()  # the edge's SuperLink holds empty pulls (held_pulls): ask again
        return run_id

    module._pull_and_store_message = pull_and_reset
    module.time = clock  # type: ignore[attr-defined]
    # a message is listed before its objects land on the SuperLink: retry them after
    # idle_min_s, not Flower's 1 s (fedcure_app.flower.fastpath.object_pulls)
    quick_pulls(module, "pull_objects", clock.idle_min_s, clock.idle_max_s)
    return True


def wake_on_replies(clock: IdleClock, handlers: ModuleType | None = None) -> bool:
    """Make the SuperNode's Runtime API set ``clock.reply_event`` whenever the ClientApp pushes
    a reply message or an object; False (logged) when its handlers are not as expected."""
    if handlers is None:
        from flwr.supernode.servicer.runtime import runtime_handlers as handlers  # type: ignore
    names = ("push_messages", "push_object")
    if not all(callable(getattr(handlers, n, None)) for n in names):
        log.warning("the SuperNode polls for its ClientApp's reply every %.3g s (its Runtime "
                    "API has no %s)", clock.reply_poll_s, " or ".join(names))
        return False
    event = threading.Event()
    for name in names:
        push = getattr(handlers, name)
        if getattr(push, "fedcure_wakes", False):
            push = push.__wrapped__

        def woken(*args: Any, _push: Any = push, **kwargs: Any) -> Any:
            try:
                return _push(*args, **kwargs)
            finally:
                event.set()

        woken.__wrapped__ = push  # type: ignore[attr-defined]
        woken.fedcure_wakes = True  # type: ignore[attr-defined]
        setattr(handlers, name, woken)
    clock.reply_event = event
    return True


__all__ = ["FLOWER_IDLE_SLEEP_S", "FLOWER_REPLY_POLL_S", "IdleClock", "check_flower", "install",
           "wake_on_replies"]
