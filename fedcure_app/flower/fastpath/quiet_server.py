"""uvicorn servers that sleep between requests: one wake-up per ``tick_s`` instead of ten a second.

Flower 1.41 serves its APIs with uvicorn (the SuperLink's on the edge, and every SuperNode's
Runtime API on a client), and uvicorn's ``Server.main_loop`` wakes every 0.1 s to refresh the
``Date`` header and look for a shutdown request, whether or not a request came. On a small
machine each wake-up costs a process a few milliseconds of CPU (measured: a bare uvicorn server
idles at 28 ms of CPU a second on the 2-core test machine), so 32 clients' SuperNodes burn most
of a core doing nothing. :func:`install` replaces the loop, in the process that calls it, by one
that wakes every ``tick_s`` and at once when the server is told to stop (``should_exit`` set,
from a signal or from the thread that started the server), so shutdown is as quick as before.
The ``Date`` header is refreshed on every wake-up (at most ``tick_s`` old).

Only uvicorn loops that still look as this module expects are replaced (:func:`check_uvicorn`);
otherwise nothing changes and a warning says why.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

log = logging.getLogger("fedcure.flower.quiet_server")

#: called (once each) when a server of this process is told to stop
_ON_EXIT: list[Any] = []


def on_exit(fn: Any) -> None:
    """Call ``fn()`` when a server of this process is told to stop (``should_exit`` set): what
    would hold its shutdown back (held pulls) lets go."""
    _ON_EXIT.append(fn)


#: default seconds between wake-ups of an idle server
DEFAULT_TICK_S = 5.0
#: uvicorn's own tick (seconds) and the number of ticks it counts per Date-header refresh
UVICORN_TICK = "await asyncio.sleep(0.1)"
TICKS_PER_REFRESH = 10


def check_uvicorn(server_class: Any = None) -> list[str]:
    """Why uvicorn's server loop cannot be replaced (empty when it can)."""
    if server_class is None:
        from uvicorn.server import Server as server_class  # type: ignore[no-redef]
    try:
        loop_src = inspect.getsource(server_class.main_loop)
        tick_src = inspect.getsource(server_class.on_tick)
    except (OSError, TypeError, AttributeError) as err:
        return [f"cannot read uvicorn's server loop: {err}"]
    problems = []
    if UVICORN_TICK not in loop_src:
        problems.append(f"uvicorn's main_loop no longer waits with {UVICORN_TICK}")
    if f"counter % {TICKS_PER_REFRESH} == 0" not in tick_src or "self.should_exit" not in tick_src:
        problems.append("uvicorn's on_tick no longer refreshes per 10 ticks and checks "
                        "should_exit")
    return problems


def install(tick_s: float = DEFAULT_TICK_S, server_class: Any = None) -> bool:
    """Make every uvicorn ``Server`` of this process wake every ``tick_s`` seconds (and on
    ``should_exit``); False (and a warning) when uvicorn differs."""
    if tick_s <= 0:
        raise ValueError(f"tick_s must be > 0, got {tick_s}")
    if server_class is None:
        from uvicorn.server import Server as server_class  # type: ignore[no-redef]
    if getattr(server_class, "fedcure_tick_s", None) is not None:  # installed already
        server_class.fedcure_tick_s = tick_s
        return True
    from fedcure_app.flower.fastpath.gate import report_off, version_problem

    outside = version_problem(patch="quiet_server")
    problems = ([] if outside is None else [outside]) + check_uvicorn(server_class)
    if problems:
        report_off(log, "uvicorn servers keep waking 10 times a second: %s",
                   "; ".join(problems))
        return False

    def get_exit(self: Any) -> bool:
        return bool(self.__dict__.get("_fedcure_should_exit", False))

    def set_exit(self: Any, value: bool) -> None:
        self.__dict__["_fedcure_should_exit"] = value
        if value:
            while _ON_EXIT:
                _ON_EXIT.pop(0)()
        wake = self.__dict__.get("_fedcure_wake")
        if value and wake is not None:
            loop, event = wake
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has closed: nothing waits any more
                pass

    async def main_loop(self: Any) -> None:
        self.__dict__["_fedcure_wake"] = (asyncio.get_running_loop(), asyncio.Event())
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # each pass stands for a refresh period of uvicorn's ticks (Date header refreshed)
            counter = (counter + TICKS_PER_REFRESH) % 864000
            event = self.__dict__["_fedcure_wake"][1]
            try:
                await asyncio.wait_for(event.wait(), timeout=type(self).fedcure_tick_s)
            except asyncio.TimeoutError:
                pass
            should_exit = await self.on_tick(counter)

    server_class.should_exit = property(get_exit, set_exit)
    server_class.main_loop = main_loop
    server_class.fedcure_tick_s = tick_s
    return True


__all__ = ["DEFAULT_TICK_S", "check_uvicorn", "install", "on_exit"]
