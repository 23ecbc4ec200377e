"""Serving the cloud: bind the gRPC server (plaintext or TLS, the request guard, message
limits), start the :class:`CloudService` (its run loop resumes a checkpoint when asked), run until
the run ends or ``stop`` is set, linger so pollers see DONE, shut down; and :class:`CloudServer`,
the same from a background thread (tests, benchmarks, notebooks).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import GRPC_OPTIONS, edge_link_handler
from cloud_server.fedeval import evaluated_handler
from cloud_server.guard import MalformedRequestGuard
from cloud_server.progress import progress_handler
from cloud_server.service import CloudService
from cloud_server.state import Phase


class AddressInUse(OSError):
    """The listen address cannot be bound."""


def add_servicers(server: grpc.aio.Server, service: CloudService) -> None:
    """Serve the three services on ``service``'s handlers; EdgeLink with the codec's fast wire
    path for models (and Progress and Evaluated beside it)."""
    pb_grpc.add_AssociationServicer_to_server(service, server)
    server.add_generic_rpc_handlers((edge_link_handler(service), progress_handler(service),
                                     evaluated_handler(service)))
    pb_grpc.add_MonitorServicer_to_server(service, server)


#: the services the health checker reports on besides the server as a whole ("")
HEALTH_SERVICES = ("", "fedcure.v1.Association", "fedcure.v1.EdgeLink", "fedcure.v1.Monitor")


def add_health(server: grpc.aio.Server) -> health.aio.HealthServicer:
    """Serve ``grpc.health.v1.Health`` (grpcio-health-checking) on ``server``: NOT_SERVING
    until :func:`set_health` says otherwise."""
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    return checker


async def set_health(checker: health.aio.HealthServicer, serving: bool) -> None:
    """Every service of :data:`HEALTH_SERVICES` SERVING or NOT_SERVING."""
    status = (health_pb2.HealthCheckResponse.SERVING if serving
              else health_pb2.HealthCheckResponse.NOT_SERVING)
    for name in HEALTH_SERVICES:
        await checker.set(name, status)


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:PORT`` for IPv6) split and checked; raises ``ValueError``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen expects HOST:PORT (e.g. 0.0.0.0:9090), got {listen!r}")
    return host, int(port)


def _bind(server: grpc.aio.Server, listen: str,
          credentials: grpc.ServerCredentials | None = None) -> int:
    parse_listen(listen)
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise AddressInUse(
            f"cannot listen on {listen}: the port is already in use or the address is not "
            "one of this host's")
    return port


async def serve(service: CloudService, listen: str, *,
                on_bound: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None, grace_s: float = 2.0,
                credentials: grpc.ServerCredentials | None = None,
                linger_s: float = 3.0,
                max_message_bytes: int | None = None) -> dict[str, Any] | None:
    """Run ``service`` on ``listen`` (host:port) until it is done or ``stop`` is set.

    ``credentials``: TLS server credentials (``cloud_server.security``); None serves plaintext.
    ``linger_s``: after a finished run, keep answering ``Monitor.Status`` (phase DONE) this long
    so that clients polling it learn that training is over (``stop`` cuts it short).
    ``max_message_bytes``: largest request accepted (RESOURCE_EXHAUSTED above; default the
    codec's limit).
    The standard ``grpc.health.v1.Health`` service answers on the same port: SERVING once
    the cloud takes registrations (its checkpoint, if any, restored), NOT_SERVING once the run
    finished or the cloud is stopping.
    Returns the result dict (None when stopped before the end). Raises :class:`AddressInUse`.
    """
    options = list(GRPC_OPTIONS)
    if max_message_bytes is not None:
        if max_message_bytes < 1024:
            raise ValueError(f"max message size must be >= 1 KiB, got {max_message_bytes} B")
        options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
        options.append(("grpc.max_receive_message_length", int(max_message_bytes)))
    server = grpc.aio.server(options=options, interceptors=[MalformedRequestGuard()])
    add_servicers(server, service)
    checker = add_health(server)
    await set_health(checker, False)
    port = _bind(server, listen, credentials)
    service.start()
    await server.start()
    await set_health(checker, not service.run.done)  # a resumed run may be complete already
    if on_bound is not None:
        on_bound(port)
    waiters = [asyncio.ensure_future(service.wait_done())]
    if stop is not None:
        waiters.append(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        await set_health(checker, False)
        if (linger_s > 0 and service.controller.phase == Phase.DONE
                and not (stop and stop.is_set())):
            pending = [w for w in waiters if not w.done()]  # the stop event, if any
            if pending:
                await asyncio.wait(pending, timeout=linger_s)
            else:
                await asyncio.sleep(linger_s)
    finally:
        for w in waiters:
            w.cancel()
        await checker.enter_graceful_shutdown()
        await service.close()
        await server.stop(grace_s)
    return service.controller.result


class CloudServer:
    """A :class:`CloudService` served from a background thread (tests, benchmarks, notebooks).

    ``start()`` returns the bound port; ``stop()`` shuts it down; ``join(timeout)`` waits for the
    run to end on its own (``linger_s`` after a finished run, as :func:`serve`).
    """

    def __init__(self, service: CloudService, listen: str = "127.0.0.1:0",
                 credentials: grpc.ServerCredentials | None = None,
                 max_message_bytes: int | None = None, linger_s: float = 0.0) -> None:
        self.service = service
        self.linger_s = float(linger_s)
        self.listen = listen
        self.credentials = credentials
        self.max_message_bytes = max_message_bytes
        self.port: int | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()

    @property
    def address(self) -> str:
        """``host:port`` the server listens on (after :meth:`start`)."""
        host = self.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> int:
        """Serve from a daemon thread; returns the bound port (raises what binding raised)."""
        self._thread = threading.Thread(target=self._run, name="fedcure-cloud", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the cloud server did not start")
        if self.error is not None:
            raise self.error
        assert self.port is not None
        return self.port

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def bound(port: int) -> None:
                self.port = port
                self._ready.set()

            await serve(self.service, self.listen, on_bound=bound, stop=self._stop, grace_s=0.5,
                        credentials=self.credentials, linger_s=self.linger_s,
                        max_message_bytes=self.max_message_bytes)

        try:
            asyncio.run(main())
        except BaseException as err:  # noqa: BLE001
            self.error = err
        finally:
            self._ready.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the server thread to end (the run finished or was stopped)."""
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (streams end UNAVAILABLE) and wait for the thread."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's event loop and return its result (for inspection)."""
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(_as_coro(fn), self._loop)
        return fut.result(10)


async def _as_coro(fn: Callable[[], Any]) -> Any:
    return fn()


__all__ = ["AddressInUse", "CloudServer", "HEALTH_SERVICES", "add_health", "add_servicers",
           "parse_listen", "serve", "set_health"]
