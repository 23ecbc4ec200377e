"""Flower's HTTP middlewares without a task group and two memory streams per request.

Flower 1.41 serves its Fleet and Runtime APIs with FastAPI behind middlewares written as
Starlette's ``BaseHTTPMiddleware`` (the protobuf translation, node authentication, tracing,
the runtime version check). Each such layer runs the rest of the app in a task of its own and
passes the response back through a memory stream, so that a streaming response can flow while
the app still runs. Four layers of that cost about 1 ms of CPU per request on the 2-core
machine (``tests/deployment/test_buffered_middleware.py`` measures both ways), and an edge round
at 32 clients is a few hundred requests.

No Fleet or Runtime API route streams its response: each answers one protobuf message. For
those paths (:data:`BUFFERED_PREFIXES`) :func:`install` has every ``BaseHTTPMiddleware`` run the
rest of the app inline and hand ``dispatch`` the response it collected: the same status,
headers and body, the same ``request.state``, the app's exception raised from ``call_next`` as
before. Every other path (the Control API, whose log and event streams do stream) goes through
Starlette's own code unchanged.

A held pull (:mod:`fedcure_app.flower.fastpath.held_pulls`) only waits longer inside the app, which
inline is the same. A client that disconnects while its request is handled is noticed when
the response is sent, as with any plain ASGI app.

FastAPI and Flower also run every synchronous dependency and handler in a worker thread
(``run_in_threadpool``): a thread hand-off and back per call, a third of a SuperNode's CPU in
a 32-client round. Flower's Fleet and Runtime handlers work on in-memory state and return at
once, so on the buffered paths they run on the event loop instead, except on the paths named
``threaded`` (the SuperLink's held pulls, which wait up to seconds and keep their threads).
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

#: the paths whose requests run the middlewares inline (every route under them answers one
#: message: Flower's Fleet and Runtime APIs and FedCure's object batches)
BUFFERED_PREFIXES: tuple[str, ...] = ("/v1/fleet/", "/v1/runtime/")

_installed: dict[str, Any] = {}
#: set while a request on a buffered path that may run its sync calls inline is handled
_INLINE_SYNC: contextvars.ContextVar[bool] = contextvars.ContextVar("fedcure_inline_sync",
                                                                    default=False)
#: the paths whose sync calls keep their worker threads (set by :func:`install`)
_threaded: set[str] = set()


async def _run_in_threadpool(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Starlette's ``run_in_threadpool``, on the event loop while :data:`_INLINE_SYNC` is set."""
    if _INLINE_SYNC.get():
        return func(*args, **kwargs)
    return await _installed["threadpool"](func, *args, **kwargs)


async def _buffered_call(self: Any, scope: MutableMapping[str, Any], receive: Any,
                         send: Any) -> None:
    """``BaseHTTPMiddleware.__call__`` for one buffered request (see the module docstring)."""
    from starlette.middleware.base import _CachedRequest
    from starlette.responses import Response

    request = _CachedRequest(scope, receive)
    wrapped_receive = request.wrapped_receive

    async def call_next(_request: Any) -> Response:
        start: dict[str, Any] | None = None
        body: list[bytes] = []

        async def collect(message: MutableMapping[str, Any]) -> None:
            nonlocal start
            kind = message["type"]
            if kind == "http.response.start":
                start = dict(message)
            elif kind == "http.response.body":
                body.append(message.get("body", b""))

        await self.app(scope, wrapped_receive, collect)
        if start is None:
            raise RuntimeError("No response returned.")
        response = Response(content=b"".join(body), status_code=start["status"])
        response.raw_headers = list(start.get("headers", []))
        return response

    token = _INLINE_SYNC.set(scope.get("path") not in _threaded)
    try:
        response = await self.dispatch_func(request, call_next)
        await response(scope, wrapped_receive, send)
    finally:
        _INLINE_SYNC.reset(token)


def install(prefixes: tuple[str, ...] = BUFFERED_PREFIXES, threaded: tuple[str, ...] = ()
            ) -> bool:
    """Make every ``BaseHTTPMiddleware`` of this process run inline for HTTP requests whose
    path starts with one of ``prefixes``, and their sync dependencies and handlers on the event
    loop unless the path is one of ``threaded``; idempotent. False (and Starlette unchanged)
    when Starlette's middleware lacks what this relies on."""
    from starlette import concurrency
    from starlette.middleware import base

    if "call" in _installed:
        _threaded.update(threaded)
        return True
    from fedcure_app.flower.fastpath.gate import version_problem

    outside = version_problem(patch="buffered_middleware")
    if outside is not None:
        log.debug("Flower's middlewares run as Starlette runs them: %s", outside)
        return False
    original = base.BaseHTTPMiddleware.__call__
    if not hasattr(base, "_CachedRequest") or not hasattr(base._CachedRequest,
                                                          "wrapped_receive"):
        import starlette

        log.warning("Starlette %s has no _CachedRequest.wrapped_receive: Flower's middlewares "
                    "run as Starlette runs them", getattr(starlette, "__version__", "?"))
        return False

    async def __call__(self: Any, scope: MutableMapping[str, Any], receive: Any,
                       send: Any) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(prefixes):
            await _buffered_call(self, scope, receive, send)
        else:
            await original(self, scope, receive, send)

    base.BaseHTTPMiddleware.__call__ = __call__  # type: ignore[method-assign]
    _installed["call"] = original
    _threaded.update(threaded)
    _installed["threadpool"] = concurrency.run_in_threadpool
    _rebind(concurrency.run_in_threadpool, _run_in_threadpool)
    return True


def _rebind(old: Callable[..., Any], new: Callable[..., Any]) -> None:
    """Point every loaded module's ``run_in_threadpool`` that is ``old`` at ``new`` (FastAPI
    and Flower import it by name); modules imported later take Starlette's, which is ``new``."""
    for module in list(sys.modules.values()):
        if getattr(module, "run_in_threadpool", None) is old:
            module.run_in_threadpool = new  # type: ignore[attr-defined]


def uninstall() -> None:
    """Undo :func:`install` (tests)."""
    from starlette.middleware import base

    original = _installed.pop("call", None)
    if original is not None:
        base.BaseHTTPMiddleware.__call__ = original  # type: ignore[method-assign]
    threadpool = _installed.pop("threadpool", None)
    if threadpool is not None:
        _rebind(_run_in_threadpool, threadpool)
    _threaded.clear()


__all__ = ["BUFFERED_PREFIXES", "install", "uninstall"]
