"""``python -m client.supernode ARGS``: Flower's ``flower-supernode`` with short idle waits.

Flower 1.41's SuperNode main loop (``flwr.supernode.start_client_internal``) sleeps a hard-coded
3 s whenever a pull from the SuperLink finds no message, and polls its own state every 0.5 s
for the ClientApp's reply. Neither has a setting. In a FedCure edge round every client's next
message arrives a moment after the slowest client answered, so the 3 s sleep lands inside almost
every round. This entry point runs the very same SuperNode (same arguments, same code) with the
module's ``time`` replaced by :class:`IdleClock`, whose ``sleep``

- turns the idle 3 s into a back-off that starts at ``idle_min_s`` after a message was pulled
  and doubles up to ``idle_max_s``; against an edge's SuperLink, which holds a pull that finds
  nothing until a message comes (:mod:`fedcure_app.flower.fastpath.held_pulls`), an empty pull that
  took :data:`~fedcure_app.flower.fastpath.held_pulls.HELD_MIN_S` or more is followed by
  ``idle_min_s`` only, so a waiting client asks once per hold and its message is answered the
  moment it is pushed;
- turns the 0.5 s reply polls (an in-memory check) into a wait that the ClientApp's push ends
  (:func:`wake_on_replies`; ``reply_poll_s`` where the Runtime API cannot be hooked).

The patch is applied only to the Flower versions it was written against (the fast path's gate,
:mod:`fedcure_app.flower.fastpath.gate`) and only when the loop's source still has the two
sleeps it replaces (:func:`check_flower`); otherwise it logs why and runs Flower unchanged.
``tests/deployment/test_warm_client.py`` fails when Flower changes underneath.

``python -m client.supernode --argv-file FILE`` imports Flower and installs the patch first, then
waits for ``FILE`` (a JSON list of the arguments) to appear: ``fedcure-client`` starts it before
it registers, while it does not know its edge's address yet, so the seconds Flower's import takes
do not land in the first task.

Settings come from the environment (seconds): ``FEDCURE_SUPERNODE_IDLE_MIN_S`` (default
0.01), ``FEDCURE_SUPERNODE_IDLE_MAX_S`` (0.2), ``FEDCURE_SUPERNODE_REPLY_POLL_S`` (0.01),
``FEDCURE_SUPERNODE_HOT_S`` (2) and ``FEDCURE_SUPERNODE_HOT_MAX_S`` (0.04); see
:class:`fedcure_app.config.WarmClientConfig` for their ranges.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
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


def clock_from_env(env: dict[str, str] | None = None) -> IdleClock:
    """The :class:`IdleClock` the ``FEDCURE_SUPERNODE_*`` variables describe (checked)."""
    from fedcure_app.config import WarmClientConfig

    env = dict(os.environ if env is None else env)
    cfg = WarmClientConfig.from_env(env)
    return IdleClock(cfg.supernode_idle_min_s, cfg.supernode_idle_max_s,
                     cfg.supernode_reply_poll_s, hot_s=cfg.supernode_hot_s,
                     hot_max_s=cfg.supernode_hot_max_s)


def drop_wake_fifo(env: dict[str, str] | None = None) -> None:
    """Remove the wake FIFO (``FEDCURE_WAKE_FIFO``) this SuperNode would have written to: its
    executor opens the FIFO only once this SuperNode's Runtime API listens, and without it the
    executor polls with its short back-off instead of waiting for wake-ups that never come."""
    from pathlib import Path

    from client.wake import WAKE_ENV

    path = (os.environ if env is None else env).get(WAKE_ENV)
    if path:
        Path(path).unlink(missing_ok=True)


def read_argv_file(path: str, poll_s: float = 0.02) -> list[str]:
    """The argument list in JSON file ``path``, waiting for the file to appear."""
    import json
    from pathlib import Path

    p = Path(path)
    while not p.exists():
        _time.sleep(poll_s)
    args = json.loads(p.read_text())
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SystemExit(f"client.supernode: {path} must hold a JSON list of strings")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-supernode`` (arguments as for it, or ``--argv-file FILE``: read from that
    JSON file once it exists, Flower imported meanwhile) with :class:`IdleClock` installed."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for logger in (log, logging.getLogger("fedcure.flower.object_batches"),
                   logging.getLogger("fedcure.flower.task_batches")):
        logger.addHandler(handler)  # Flower configures its own logger; the root stays untouched
        logger.setLevel(logging.INFO)
        logger.propagate = False
    from fedcure_app.runtime.tracing import set_role, trace_flower_log

    set_role("supernode")
    # before Flower is imported: its unused SQL object store (SQLAlchemy, Alembic) stays out
    from fedcure_app.flower.fastpath.lazy_sql import defer_sql_object_store

    defer_sql_object_store()
    trace_flower_log()  # FEDCURE_TRACE_DIR: Flower's receive/send log lines become events
    from client.wake import writer_from_env

    from fedcure_app.flower.fastpath.quiet_server import install as quiet_uvicorn

    quiet_uvicorn()  # its Runtime API server wakes every few seconds, not 10 times a second
    clock = clock_from_env()
    if install(clock, waker=writer_from_env()):
        wake_on_replies(clock)
        log.info("SuperNode idle wait %.3g..%.3g s, reply poll %.3g s (Flower's: 3 s, 0.5 s)",
                 clock.idle_min_s, clock.idle_max_s, clock.reply_poll_s)
    else:  # nothing will wake the executor: without the FIFO it polls with its short back-off
        drop_wake_fifo()
    from fedcure_app.flower.fastpath.batch_routes import install_server
    from fedcure_app.flower.fastpath.object_batches import install_client

    install_client()  # a message's objects in one request each way (where the SuperLink can)
    from fedcure_app.flower.fastpath.message_batches import (
        install_client as install_message_batches,
    )

    install_message_batches()  # and a message with its objects in one request each way
    install_server(on="supernode")  # and the executor's, on this SuperNode's Runtime API
    from fedcure_app.flower.fastpath.task_batches import install_server as serve_task_bundles

    serve_task_bundles()  # a task's input in one request, its reply and status in another
    from fedcure_app.flower.fastpath.buffered_middleware import install as inline_middlewares

    if inline_middlewares():  # its Runtime API's middlewares without a task per request
        log.info("Flower's middlewares run inline on the Runtime API")
    from flwr.supernode.cli.flower_supernode import flower_supernode

    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["--argv-file"] and len(args) == 2:
        args = read_argv_file(args[1])
    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":  # pragma: no cover
    main()
