"""Held pulls on the edge's SuperLink: a pull that finds nothing waits for something to come.

Flower 1.41's Fleet API has no long poll or stream: a SuperNode asks its SuperLink for a message
(``/v1/fleet/pull-messages``), gets an empty answer at once when there is none, sleeps and asks
again, and the edge ServerApp asks for its clients' replies (``/v1/runtime/pull-messages``) the
same way. Each ask is an HTTP request through the SuperLink's ten middlewares, so a SuperNode
that asks often enough for fast rounds costs its SuperLink CPU for as long as it waits, and the
cost grows with the clients of an edge whether or not they train.

:func:`install` wraps the SuperLink's two pull handlers so that a pull which finds nothing
*holds*: it waits up to ``hold_s`` (a SuperNode's pull) or ``reply_hold_s`` (the ServerApp's)
on a :class:`Doorbell` that the two message-push handlers ring once a message *and the content
objects it announced* are stored (:class:`AwaitedObjects` counts them through the object-push
handlers; the ServerApp's instructions ring their destination nodes, a node's reply rings the
replies), then pulls again, so the puller finds every object it then fetches. A message that
arrives while a SuperNode waits is therefore answered at once, and a SuperNode with nothing
coming asks once per ``hold_s`` instead of several times a second. The client's SuperNode
(:mod:`client.supernode`) sees an empty pull that took at least :data:`HELD_MIN_S` as held, and
asks again without sleeping; against a SuperLink that does not hold it keeps its back-off.

A held pull occupies a worker thread of the SuperLink's web server for its wait, and that pool
has 40 threads by default (anyio's), so :func:`install` also widens it to ``threads``; the
handlers themselves are Flower's, unchanged. Only a Flower inside the fast path's gate
(:mod:`fedcure_app.flower.fastpath.gate`) is patched, and only while the handlers have the
signatures this module wraps (:func:`check_flower`); otherwise the SuperLink runs unchanged and
a warning says why.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any, Callable

from fedcure_app.flower.fastpath.gate import report_off, version_problem

log = logging.getLogger("fedcure.flower.held_pulls")

#: an empty pull that took at least this long (seconds) was held by the SuperLink
HELD_MIN_S = 1.0
#: defaults (seconds): a SuperNode's held pull, the ServerApp's held pull of replies
DEFAULT_HOLD_S = 20.0
DEFAULT_REPLY_HOLD_S = 2.0
#: worker threads of the SuperLink's web server (each held pull takes one while it waits)
DEFAULT_THREADS = 512


class Doorbell:
    """Counters the push handlers ring and the held pulls wait on (thread-safe).

    A pull reads the counter (:meth:`node_mark`, :meth:`reply_mark`) *before* it looks for
    messages, and waits only for a change of it, so a message stored between its look and its
    wait still wakes it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._nodes: dict[int, int] = {}
        self._replies = 0
        self._closed = False

    def close(self) -> None:
        """The server is stopping: every held pull returns now, and none waits again (a held
        pull would keep the web server from shutting down for up to its hold)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def ring_nodes(self, node_ids: Iterable[int]) -> None:
        """Messages for ``node_ids`` were stored."""
        with self._cond:
            for n in node_ids:
                self._nodes[n] = self._nodes.get(n, 0) + 1
            self._cond.notify_all()

    def ring_replies(self) -> None:
        """A node's reply was stored."""
        with self._cond:
            self._replies += 1
            self._cond.notify_all()

    def node_mark(self, node_id: int) -> int:
        with self._cond:
            return self._nodes.get(node_id, 0)

    def reply_mark(self) -> int:
        with self._cond:
            return self._replies

    def wait_node(self, node_id: int, mark: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a ring of ``node_id`` after ``mark``; True if one came."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or self._nodes.get(node_id, 0) != mark, timeout_s)

    def wait_replies(self, mark: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a reply after ``mark``; True if one came."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or self._replies != mark, timeout_s)


class AwaitedObjects:
    """Rings held back until the objects a push announced have landed (thread-safe).

    A Flower message travels as a header plus content objects that the sender pushes one by one
    *after* the header (the push's answer lists the objects the SuperLink still needs). Waking
    a pull at the header would send its puller to fetch objects that are not there yet, each a
    failed request retried; so :meth:`add` keeps the ring until :meth:`stored` has seen every
    listed object, and rings at once when none is missing. A ring whose objects never all come
    (the sender died) is rung after ``expire_s`` at the next push, so no pull waits on it past
    its own hold.
    """

    def __init__(self, expire_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.expire_s = expire_s
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: list[tuple[set[str], Callable[[], None], float]] = []

    def add(self, objects: Iterable[str], ring: Callable[[], None]) -> None:
        """Ring ``ring`` once all of ``objects`` are stored (at once when there are none)."""
        missing = set(objects)
        if not missing:
            ring()
            return
        with self._lock:
            self._waiting.append((missing, ring, self._clock()))
        self._ring(self._expired())

    def stored(self, object_id: str) -> None:
        """Object ``object_id`` was stored: ring what waited for it last."""
        done: list[Callable[[], None]] = []
        with self._lock:
            keep = []
            for missing, ring, since in self._waiting:
                missing.discard(object_id)
                (keep.append((missing, ring, since)) if missing else done.append(ring))
            self._waiting = keep
        self._ring(done + self._expired())

    def pending(self) -> int:
        """Rings still held back."""
        with self._lock:
            return len(self._waiting)

    def _expired(self) -> list[Callable[[], None]]:
        now = self._clock()
        with self._lock:
            old = [w for w in self._waiting if now - w[2] >= self.expire_s]
            self._waiting = [w for w in self._waiting if now - w[2] < self.expire_s]
        return [ring for _, ring, _ in old]

    @staticmethod
    def _ring(rings: list[Callable[[], None]]) -> None:
        for ring in rings:
            ring()


def _params(fn: Any) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _handler_modules() -> tuple[ModuleType, ModuleType]:
    from flwr.superlink.servicer.fleet import fleet_handlers
    from flwr.superlink.servicer.runtime import runtime_handlers

    return fleet_handlers, runtime_handlers


def check_flower(fleet: ModuleType | None = None, runtime: ModuleType | None = None,
                 version: str | None = None) -> list[str]:
    """Why the SuperLink cannot be patched (empty when it can)."""
    outside = version_problem(version, patch="held_pulls")
    problems: list[str] = [] if outside is None else [outside]
    if fleet is None or runtime is None:
        fleet, runtime = _handler_modules()
    wants = {
        (fleet, "pull_messages"): ["request", "state", "store"],
        (fleet, "push_messages"): ["request", "state"],
        (runtime, "pull_messages"): ["request", "state", "task"],
        (runtime, "push_messages"): ["request", "state", "task"],
        (fleet, "push_object"): ["request", "state"],
        (runtime, "push_object"): ["request", "state", "task"],
    }
    for (module, name), params in wants.items():
        fn = getattr(module, name, None)
        if not callable(fn):
            problems.append(f"{module.__name__}.{name} is gone")
        elif _params(getattr(fn, "__wrapped__", fn)) != params:
            problems.append(f"{module.__name__}.{name} no longer takes ({', '.join(params)})")
    return problems


def _held_fleet_pull(pull: Callable[..., Any], bell: Doorbell, hold_s: float) -> Any:
    @functools.wraps(pull)
    def held(request: Any, state: Any, store: Any) -> Any:
        node = int(request.node.node_id)
        mark = bell.node_mark(node)
        reply = pull(request, state, store)
        if len(reply.messages_list) or not bell.wait_node(node, mark, hold_s):
            return reply
        return pull(request, state, store)

    held.fedcure_held = True  # type: ignore[attr-defined]
    return held


def _held_runtime_pull(pull: Callable[..., Any], bell: Doorbell, hold_s: float) -> Any:
    @functools.wraps(pull)
    def held(request: Any, state: Any, task: Any) -> Any:
        mark = bell.reply_mark()
        reply = pull(request, state, task)
        if len(reply.messages_list) or not request.message_ids:
            return reply
        if not bell.wait_replies(mark, hold_s):
            return reply
        return pull(request, state, task)

    held.fedcure_held = True  # type: ignore[attr-defined]
    return held


def _request(args: tuple, kwargs: dict) -> Any:
    return kwargs["request"] if "request" in kwargs else args[0]  # Flower's routers: keywords


def _announcing_push(push: Callable[..., Any], awaited: AwaitedObjects,
                     ring: Callable[[Any], None]) -> Any:
    """A message push that rings ``ring(request)`` once the objects it announced are in."""
    @functools.wraps(push)
    def announcing(*args: Any, **kwargs: Any) -> Any:
        request = _request(args, kwargs)
        try:
            reply = push(*args, **kwargs)
        except BaseException:
            ring(request)  # nothing waits for a refused push's objects: let the pulls look
            raise
        awaited.add(list(reply.objects_to_push), lambda: ring(request))
        return reply

    announcing.fedcure_held = True  # type: ignore[attr-defined]
    return announcing


def _counting_push(push: Callable[..., Any], awaited: AwaitedObjects) -> Any:
    """An object push that tells ``awaited`` which object landed."""
    @functools.wraps(push)
    def counting(*args: Any, **kwargs: Any) -> Any:
        reply = push(*args, **kwargs)
        awaited.stored(str(_request(args, kwargs).object_id))
        return reply

    counting.fedcure_held = True  # type: ignore[attr-defined]
    return counting


def _destinations(request: Any) -> list[int]:
    return [int(m.metadata.dst_node_id) for m in request.messages_list]


def install(hold_s: float = DEFAULT_HOLD_S, reply_hold_s: float = DEFAULT_REPLY_HOLD_S,
            *, fleet: ModuleType | None = None, runtime: ModuleType | None = None,
            bell: Doorbell | None = None) -> Doorbell | None:
    """Wrap the SuperLink's pull and push handlers (see the module's doc); the
    :class:`Doorbell` they share, or None (and a warning) when Flower differs."""
    if hold_s < 0 or reply_hold_s < 0:
        raise ValueError(f"holds must be >= 0, got {hold_s}, {reply_hold_s}")
    if fleet is None or runtime is None:
        fleet, runtime = _handler_modules()
    problems = check_flower(fleet, runtime)
    if problems:
        report_off(log, "SuperLink pulls are not held (each finds nothing at once): %s",
                   "; ".join(problems))
        return None
    if getattr(fleet.pull_messages, "fedcure_held", False):
        raise RuntimeError("held pulls are installed already")
    bell = bell or Doorbell()
    awaited = AwaitedObjects()
    fleet.pull_messages = _held_fleet_pull(fleet.pull_messages, bell, hold_s)
    runtime.pull_messages = _held_runtime_pull(runtime.pull_messages, bell, reply_hold_s)
    runtime.push_messages = _announcing_push(runtime.push_messages, awaited,
                                             lambda r: bell.ring_nodes(_destinations(r)))
    fleet.push_messages = _announcing_push(fleet.push_messages, awaited,
                                           lambda r: bell.ring_replies())
    runtime.push_object = _counting_push(runtime.push_object, awaited)
    fleet.push_object = _counting_push(fleet.push_object, awaited)
    return bell


class ThreadPoolWidth:
    """ASGI middleware: on its first request, widen the event loop's default worker-thread
    pool (anyio's limiter, through which FastAPI runs synchronous handlers) to ``threads``."""

    def __init__(self, app: Any, threads: int = DEFAULT_THREADS) -> None:
        self.app = app
        self.threads = threads
        self._done = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self._done:
            import anyio.to_thread

            limiter = anyio.to_thread.current_default_thread_limiter()
            limiter.total_tokens = max(limiter.total_tokens, self.threads)
            self._done = True
        await self.app(scope, receive, send)


def widen_thread_pool(threads: int = DEFAULT_THREADS) -> bool:
    """Make the SuperLink's app (built by ``flwr.superlink.main.create_app``) widen its worker
    pool to ``threads``; False (logged) when that function is gone."""
    import flwr.superlink.main as main

    create = getattr(main, "create_app", None)
    if not callable(create):
        log.warning("flwr.superlink.main.create_app is gone: the SuperLink keeps 40 workers, "
                    "and more held pulls than that wait for a worker")
        return False

    @functools.wraps(create)
    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = create(*args, **kwargs)
        app.add_middleware(ThreadPoolWidth, threads=threads)
        return app

    main.create_app = create_app
    return True


__all__ = ["AwaitedObjects", "DEFAULT_HOLD_S", "DEFAULT_REPLY_HOLD_S", "DEFAULT_THREADS",
           "Doorbell", "HELD_MIN_S", "ThreadPoolWidth", "check_flower", "install",
           "widen_thread_pool"]
