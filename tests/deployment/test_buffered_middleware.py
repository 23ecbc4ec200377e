"""Flower's middlewares run inline on the Fleet and Runtime paths
(:mod:`fedcure_app.flower.fastpath.buffered_middleware`): every answer is the one Starlette's own
``BaseHTTPMiddleware`` gives, byte for byte, on Flower's real SuperNode app and on an app whose
middlewares read the body, set state and headers and see the app's errors; other paths (a
streaming response) still go through Starlette's code; and the inline path costs less."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.testclient import TestClient
from starlette.middleware.base import BaseHTTPMiddleware

from fedcure_app.flower.fastpath import buffered_middleware as bm

PROTOBUF = {"content-type": "application/protobuf", "accept": "application/protobuf"}
#: the event loop's thread in the app under test (set by its outermost middleware)
LOOP_THREAD = [0]


@contextlib.contextmanager
def inline(on: bool):
    if on:
        assert bm.install()
    try:
        yield
    finally:
        bm.uninstall()


class Tagging(BaseHTTPMiddleware):
    """Reads the body, leaves its length in the request's state, adds a header."""

    async def dispatch(self, request, call_next):
        body = await request.body()
        request.state.seen = len(body)
        try:
            response = await call_next(request)
        except RuntimeError as err:
            return Response(f"caught {err}", status_code=503)
        response.headers["x-tag"] = f"{self.tag}:{len(body)}"
        return response

    def __init__(self, app, tag: str) -> None:
        super().__init__(app)
        self.tag = tag


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/fleet/echo")
    async def echo(request: Request):
        body = await request.body()
        return Response(body[::-1] + str(request.state.seen).encode(),
                        media_type="application/protobuf", headers={"x-app": "1"})

    @app.post("/v1/runtime/refuse")
    async def refuse():
        raise HTTPException(status_code=409, detail="taken")

    @app.post("/v1/runtime/break")
    async def broken():
        raise RuntimeError("the handler broke")

    def caller_thread() -> int:  # a sync dependency
        return threading.get_ident()

    def where(dep: int = Depends(caller_thread)) -> Response:  # a sync handler
        def at(ident: int) -> str:
            return "loop" if ident == LOOP_THREAD[0] else "worker"

        return Response(f"{at(dep)}:{at(threading.get_ident())}")

    for path in ("/v1/runtime/sync", "/v1/fleet/pull-messages", "/v1/control/sync"):
        app.post(path)(where)

    @app.middleware("http")
    async def note_loop(request, call_next):
        LOOP_THREAD[0] = threading.get_ident()
        return await call_next(request)

    @app.get("/v1/control/stream")
    async def stream():
        async def chunks():
            for i in range(3):
                yield f"chunk{i};".encode()
        return StreamingResponse(chunks(), media_type="text/plain")

    app.add_middleware(Tagging, tag="inner")
    app.add_middleware(Tagging, tag="outer")
    return app


def _answers(app: FastAPI, requests) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    out = []
    with TestClient(app, raise_server_exceptions=False) as http:
        for method, path, body, headers in requests:
            r = http.request(method, path, content=body, headers=headers)
            out.append((r.status_code, sorted((k, v) for k, v in r.headers.items()
                                              if k != "date"), r.content))
    return out


REQUESTS = [
    ("POST", "/v1/fleet/echo", b"abcdef" * 1000, PROTOBUF),
    ("POST", "/v1/fleet/echo", b"", PROTOBUF),
    ("POST", "/v1/runtime/refuse", b"x", PROTOBUF),
    ("POST", "/v1/runtime/break", b"x", PROTOBUF),
    ("POST", "/v1/runtime/nowhere", b"x", PROTOBUF),
    ("GET", "/v1/control/stream", None, {}),
]


def test_inline_answers_equal_starlettes_for_state_headers_errors_and_streams():
    with inline(False):
        plain = _answers(_app(), REQUESTS)
    with inline(True):
        fast = _answers(_app(), REQUESTS)
    assert fast == plain
    assert plain[0][0] == 200 and plain[0][2].endswith(b"6000")
    assert dict(plain[0][1])["x-tag"] == "outer:6000" and dict(plain[0][1])["x-app"] == "1"
    assert plain[2][0] == 409 and plain[3][0] == 503 and plain[3][2] == b"caught the handler broke"
    assert plain[5][2] == b"chunk0;chunk1;chunk2;"


def _where(path: str, on: bool, threaded: tuple[str, ...] = ()) -> bytes:
    if on:
        assert bm.install(threaded=threaded)
    try:
        with TestClient(_app()) as http:
            return http.post(path, content=b"", headers=PROTOBUF).content
    finally:
        bm.uninstall()


def test_sync_dependencies_and_handlers_run_on_the_loop_unless_their_path_is_threaded():
    assert _where("/v1/runtime/sync", False) == b"worker:worker"
    assert _where("/v1/runtime/sync", True) == b"loop:loop"
    held = "/v1/fleet/pull-messages"
    assert _where(held, True, threaded=(held,)) == b"worker:worker"
    assert _where(held, True) == b"loop:loop"
    assert _where("/v1/control/sync", True) == b"worker:worker"


def test_a_path_outside_the_prefixes_goes_through_starlettes_own_code(monkeypatch):
    from starlette.middleware import base

    calls = []
    real = base.BaseHTTPMiddleware.__call__

    async def counting(self, scope, receive, send):
        if scope["type"] == "http":
            calls.append(scope["path"])
        await real(self, scope, receive, send)

    monkeypatch.setattr(base.BaseHTTPMiddleware, "__call__", counting)
    with inline(True):
        _answers(_app(), REQUESTS)
    # three middleware layers: only the control path reaches Starlette's code, once per layer
    assert calls == ["/v1/control/stream"] * 3


def test_flowers_supernode_app_answers_the_same_inline():
    from flwr.supernode.main import create_app
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate import NodeStateFactory

    requests = [
        ("POST", "/v1/runtime/acquire-task", b"", PROTOBUF),  # unsigned
        ("POST", "/v1/runtime/acquire-task", b"\xff\xff", PROTOBUF),  # not a protobuf
        ("POST", "/v1/runtime/pull-task-input", b"", {"content-type": "text/plain"}),
        ("POST", "/v1/runtime/send-task-heartbeat", b"", PROTOBUF),  # no token
        ("GET", "/health", None, {}),
    ]
    answers = []
    for on in (False, True):
        with inline(on):
            answers.append(_answers(create_app(NodeStateFactory(objectstore_factory=ObjectStoreFactory()),
                                              b"s" * 32), requests))
    assert answers[0] == answers[1]
    assert [a[0] for a in answers[0][:4]] != [200] * 4  # refusals, answered as Flower does


def test_inline_middlewares_cost_a_fraction_of_starlettes():
    # CPU per request through the two-layer app, called directly (no sockets): the goal
    # lives in the bench; this pins down that the inline path is the cheaper one
    async def per_request_s(app) -> float:
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "path": "/v1/fleet/echo", "raw_path": b"/v1/fleet/echo",
                 "query_string": b"", "root_path": "", "scheme": "http", "state": {},
                 "headers": [(b"content-type", b"application/protobuf")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}

        async def one():
            done = False

            async def receive():
                nonlocal done
                if not done:
                    done = True
                    return {"type": "http.request", "body": b"x" * 200, "more_body": False}
                await asyncio.sleep(3600)

            await app(scope, receive, send)

        for _ in range(20):
            await one()
        t0 = time.process_time()
        for _ in range(300):
            await one()
        return (time.process_time() - t0) / 300

    with inline(False):
        plain = asyncio.run(per_request_s(_app()))
    with inline(True):
        fast = asyncio.run(per_request_s(_app()))
    assert fast < 0.7 * plain, (fast, plain)


@pytest.fixture(autouse=True)
def _clean():
    yield
    bm.uninstall()
