"""FedCure's own routes on Flower's servers, answered in front of Flower's HTTP stack.

Every request to a Flower 1.41 server passes a dozen ASGI layers before its handler runs: the
Control API's four middlewares (pass-through off ``/v1/control/``), the protobuf translation,
the error translation, runtime tracing, node authentication, the Fleet event log, then
FastAPI's routing and dependency injection. On a small machine that is 3 ms or more of CPU per
request, most of what a FedCure route (:mod:`message_routes`, :mod:`task_batches`) costs, and
an edge serves a few of them per client per edge round.

:class:`FastRoutes` is an ASGI layer put in front of that stack (``app.add_middleware`` after
Flower built the app). A ``POST`` to one of its paths is served here, through the same Flower
functions the stack would call, in the same order:

1. the body must be ``application/protobuf`` and parse as the route's request type (Flower's
   own errors otherwise);
2. the route's ``serve(request, message)`` authenticates with Flower's own checks
   (``authenticate_node`` for a SuperNode's signature, ``authenticate_superexec_request`` for
   the executor's, ``authenticate_task`` for a task's token) and answers a protobuf message;
3. any error is answered by Flower's ``http_error_translator``, as on Flower's own routes.

A request the layer cannot serve exactly as the stack would goes down the stack unchanged (the
routes are registered there too): when Flower's runtime tracing is on (``FLWR_TRACING_ENABLED``)
or a Fleet event-log plugin is configured. Routes whose handler waits (held pulls) run in a
worker thread, as FastAPI runs them.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("fedcure.flower.fast_routes")


@dataclass(frozen=True)
class Route:
    """One FedCure route: its protobuf request type, ``serve(request, message)`` (a Starlette
    request bound to Flower's app, the parsed message: the answer, a protobuf message), and
    whether ``serve`` may wait (then it runs in a worker thread)."""

    request_type: type
    serve: Callable[[Any, Any], Any]
    threaded: bool = False


class FastRoutes:
    """ASGI middleware: ``POST`` requests to a path of ``routes`` are served here (see the
    module's doc); everything else goes to ``app`` unchanged."""

    def __init__(self, app: Any, routes: dict[str, Route]) -> None:
        self.app = app
        self.routes = dict(routes)

    def _declines(self, scope: Any) -> bool:
        """True when Flower's stack must serve the request (it would do more than this)."""
        if os.getenv("FLWR_TRACING_ENABLED") == "1":
            return True
        app = scope.get("app")
        return scope["path"].startswith("/v1/fleet/") and getattr(
            getattr(app, "state", None), "fleet_event_log_plugin", None) is not None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = (self.routes.get(scope["path"])
                 if scope["type"] == "http" and scope.get("method") == "POST" else None)
        if route is None or self._declines(scope):
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request

        from flwr.supercore.error.http import http_error_translator

        request = Request(scope, receive)
        response = await http_error_translator(
            request, functools.partial(_serve, route=route))
        await response(scope, receive, send)


async def _serve(request: Any, route: Route) -> Any:
    """The protobuf answer of ``route`` to ``request`` (raises as Flower's stack would)."""
    from fastapi.responses import Response
    from flwr.supercore.error import ApiErrorCode, FlowerError
    from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE
    from google.protobuf.message import DecodeError
    from starlette.concurrency import run_in_threadpool

    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != PROTOBUF_MEDIA_TYPE:
        raise FlowerError(ApiErrorCode.UNSUPPORTED_CONTENT_TYPE,
                          f"Unsupported Content-Type: {content_type!r}")
    message = route.request_type()
    try:
        message.ParseFromString(await request.body())
    except DecodeError as err:  # as Flower's protobuf translation answers it
        raise FlowerError(ApiErrorCode.INVALID_PROTOBUF_PAYLOAD,
                          f"Invalid protobuf payload: {err!r}") from err
    request.state.protobuf_request = message  # where Flower's checks read it
    if route.threaded:
        answer = await run_in_threadpool(route.serve, request, message)
    else:
        answer = route.serve(request, message)
    return Response(answer.SerializeToString(), media_type=PROTOBUF_MEDIA_TYPE)


def install(main: Any, routes: Callable[[], dict[str, Route]], what: str) -> bool:
    """Put :class:`FastRoutes` with ``routes()`` in front of every app ``main.create_app``
    (Flower's SuperLink or SuperNode app factory) builds in this process; False (logged) when
    that factory is gone (the routes are then served by Flower's stack only)."""
    create = getattr(main, "create_app", None)
    if not callable(create):
        log.warning("%s go through Flower's whole HTTP stack: its app factory is gone", what)
        return False

    @functools.wraps(create)
    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = create(*args, **kwargs)
        app.add_middleware(FastRoutes, routes=routes())
        return app

    main.create_app = create_app
    return True


__all__ = ["FastRoutes", "Route", "install"]
