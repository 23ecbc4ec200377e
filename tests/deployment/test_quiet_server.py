"""uvicorn servers that sleep between requests: they still answer, refresh their Date header,
and stop at once when told to, while waking only once per tick."""

from __future__ import annotations

import threading
import time
import types

import httpx
import pytest
import uvicorn
from uvicorn.server import Server

from fedcure_app.flower.fastpath.quiet_server import check_uvicorn, install


def _quiet_class(tick_s: float) -> type:
    cls = type("QuietServer", (Server,), {})  # patch a subclass: other servers stay as they are
    assert install(tick_s, server_class=cls)
    return cls


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_patch_fits_the_installed_uvicorn():
    assert check_uvicorn() == []


def _started(tick_s: float) -> tuple[Server, threading.Thread, list[int]]:
    """A quiet server on a free port, run in a thread, with the counters of its wake-ups."""
    server = _quiet_class(tick_s)(uvicorn.Config(_app, host="127.0.0.1", port=0,
                                                 log_level="warning"))
    ticks: list[int] = []
    on_tick = server.on_tick

    async def counting(counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(counter)

    server.on_tick = counting
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    return server, thread, ticks


def test_a_quiet_server_answers_and_stops_at_once_though_its_tick_is_long():
    server, thread, ticks = _started(30.0)
    port = server.servers[0].sockets[0].getsockname()[1]
    reply = httpx.get(f"http://127.0.0.1:{port}/")
    assert reply.text == "ok" and "date" in reply.headers
    time.sleep(0.5)
    assert ticks == [0]  # no wake-up in half a second (uvicorn's own: 5)
    t0 = time.monotonic()
    server.should_exit = True  # from another thread, as Flower's SuperNode does
    thread.join(5.0)
    assert not thread.is_alive() and time.monotonic() - t0 < 2.0


def test_each_wake_up_refreshes_the_date_header():
    server, thread, ticks = _started(0.05)
    time.sleep(0.5)
    server.should_exit = True
    thread.join(5.0)
    assert len(ticks) >= 3 and all(c % 10 == 0 for c in ticks)  # on_tick refreshes at % 10


def test_a_changed_uvicorn_is_left_alone():
    class Changed:
        async def main_loop(self):
            pass  # no 0.1 s tick any more

        async def on_tick(self, counter):
            return self.should_exit

    assert check_uvicorn(Changed)
    assert not install(1.0, server_class=Changed)
    with pytest.raises(ValueError):
        install(0.0, server_class=types.new_class("X", (Server,)))


def test_what_holds_a_shutdown_back_is_let_go_when_the_server_is_told_to_stop():
    from fedcure_app.flower.fastpath.quiet_server import on_exit

    server, thread, _ = _started(30.0)
    released: list[str] = []
    on_exit(lambda: released.append("held pulls"))
    server.should_exit = True
    thread.join(5.0)
    assert released == ["held pulls"] and not thread.is_alive()
