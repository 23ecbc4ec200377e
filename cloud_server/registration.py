"""Registration on the event loop: the window, the Register calls waiting, and formation.

:class:`RegistrationWindow` opens when the run starts (:meth:`~RegistrationWindow.open`) and
closes after ``timeout_s`` seconds or when formation runs. Each Register call records its client
with the controller, then waits for formation and for its edge to connect. Formation runs once
(in a worker thread) when the expected clients are in, or when the window closes with at least
M clients; a failed attempt wakes every waiting call (they answer FAILED_PRECONDITION) and the
cloud keeps registering. Used by :class:`~cloud_server.runloop.RunLoop`; raises
:class:`~cloud_server.refusal.Refusal`, never a gRPC error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from cloud_server.controller import CloudController
from cloud_server.edge_streams import EdgeStreams
from cloud_server.refusal import Reason, Refusal
from cloud_server.state import ClientEntry, Phase

log = logging.getLogger("fedcure.cloud")


class RegistrationWindow:
    """The registration window of one run and the formation it triggers.

    Parameters
    ----------
    controller:
        The run's state and transitions.
    edges:
        The edges' task streams: formation's first tasks are published to them, and a Register
        call waits for its edge's stream.
    timeout_s:
        The window, seconds from :meth:`open`; one Register call waits this long, and at least
        until shortly after the window closes.
    spawn:
        Runs a coroutine in the background of the run (formation).
    is_closing:
        Whether the cloud is shutting down (a waiting call then answers UNAVAILABLE).
    """

    def __init__(self, controller: CloudController, edges: EdgeStreams, *, timeout_s: float,
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 is_closing: Callable[[], bool]) -> None:
        self.controller = controller
        self.edges = edges
        self.timeout_s = float(timeout_s)
        self._spawn = spawn
        self._is_closing = is_closing
        #: set once formation ran (or the run resumed or closes); replaced after a failure
        self.formed = asyncio.Event()
        #: the window is over (registration goes on until formation succeeds)
        self.closed = False
        self._opened_at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def open(self) -> None:
        """Start the window on the running event loop."""
        self._opened_at = time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expired)

    def skip(self) -> None:
        """No registration (a resumed run is formed already): close the window, wake waiters."""
        self.closed = True
        self.stop()

    def stop(self) -> None:
        """Cancel the window's timer and wake every waiting Register call."""
        if self._timer is not None:
            self._timer.cancel()
        self.formed.set()

    async def register(self, entry: ClientEntry, time_remaining: float | None
                       ) -> tuple[ClientEntry, str]:
        """Record a registration, then wait for formation and for the client's edge to
        connect: the stored client and its edge's address. ``time_remaining``: seconds the
        caller still waits (None: no deadline)."""
        c = self.controller
        began = time.monotonic()
        client = c.register(entry)
        self.maybe_form()
        # wait timeout_s, and at least until a little after the registration window closes
        # (formation may run then)
        window_end = self._opened_at + self.timeout_s + min(5.0, self.timeout_s)
        budget = max(self.timeout_s, window_end - began)
        if time_remaining is not None:
            budget = min(budget, max(0.0, time_remaining - 0.05))

        def left() -> float:
            return max(0.0, budget - (time.monotonic() - began))

        formed = self.formed  # a failed formation replaces the event (and sets this one)
        try:
            await asyncio.wait_for(formed.wait(), left())
        except asyncio.TimeoutError:
            raise Refusal(
                Reason.DEADLINE_EXCEEDED,
                f"coalition formation has not run yet: {len(c.clients)} of "
                f"{c.roster.awaited} expected clients registered; call Register again",
            ) from None
        self._check_open()
        if c.phase == Phase.REGISTERING:  # this formation attempt failed
            raise Refusal(Reason.FAILED_PRECONDITION,
                          f"{c.formation_error}; the cloud keeps registering: call Register "
                          "again (with a corrected profile)")
        assert client.edge_id is not None and client.client_id is not None
        try:
            await asyncio.wait_for(self.edges[client.edge_id].connected.wait(), left())
        except asyncio.TimeoutError:
            raise Refusal(
                Reason.DEADLINE_EXCEEDED,
                f"client {client.name!r} belongs to edge {client.edge_id}, which has not "
                "connected to the cloud yet; call Register again",
            ) from None
        self._check_open()
        return client, c.roster.edge_addresses[client.edge_id]

    def withdraw(self, name: str, reason: str) -> int:
        """Client ``name`` will not take part (``Association.Withdraw``): formation stops
        waiting for it, and runs now if everyone else is in. Returns the clients awaited."""
        c = self.controller
        awaited = c.registry.withdraw(name, reason,
                                      open_=c.phase == Phase.REGISTERING and not c.forming)
        self.maybe_form()
        return awaited

    def _check_open(self) -> None:
        if self._is_closing():
            raise Refusal(Reason.UNAVAILABLE, "the cloud is shutting down")

    def _expired(self) -> None:
        self.closed = True
        c = self.controller
        if c.phase == Phase.REGISTERING and not c.forming:
            n = len(c.clients)
            if n >= c.num_edges:
                log.warning("registration window over: forming coalitions with %d of %d "
                            "expected clients", n, c.roster.awaited)
            else:
                log.warning("registration window over with %d clients; formation waits for "
                            "at least %d (one per edge)", n, c.num_edges)
        self.maybe_form()

    def maybe_form(self) -> None:
        """Start formation (in the background) when the controller says it is time."""
        if self.controller.should_form(self.closed):
            self.controller.start_forming()
            if self._timer is not None:
                self._timer.cancel()
            self._spawn(self._run_formation())

    async def _run_formation(self) -> None:
        c = self.controller
        try:
            tasks = await asyncio.to_thread(c.form_and_build)
        except Exception as err:  # noqa: BLE001 - reported to every waiting client
            # the cloud stays up and keeps registering: a changed or new registration retries
            log.exception("coalition formation failed; still registering")
            c.formation_failed(err)
            failed, self.formed = self.formed, asyncio.Event()
            failed.set()  # wake every waiting Register: they answer FAILED_PRECONDITION
            self.maybe_form()
            return
        c.begin_training()
        self.formed.set()
        await self.edges.publish(tasks)


__all__ = ["RegistrationWindow"]
