"""The live view's HTTP side: one page, its event stream and ``/metrics``, from a snapshot source.

:class:`LiveServer` serves, read-only, from ``source()`` (a callable returning a frozen
:class:`~fedcure_app.live.model.LiveState`; it must not block on the driver's lock):

``GET /``                 the page (``static/index.html``; its script and style beside it)
``GET /static/<file>``    the page's files, shipped in the package (no CDN: works offline)
``GET /api/state``        one snapshot as JSON (``?since=N``: the rounds from index N)
``GET /events``           server-sent events: a snapshot every ``interval_s`` while something
                          changed (rounds only once per connection), a comment every 15 s
``GET /metrics``          the Prometheus text format (:mod:`fedcure_app.live.metrics`)

It runs the standard library's threading HTTP server in a daemon thread, one thread per
connection; each one reads the snapshot reference and writes it, so a slow reader never
delays the driver. Security (:func:`check_bind`): loopback by default; any other address needs
a token, which every request must then carry (``Authorization: Bearer TOKEN``, or
``?token=TOKEN``, which the page passes on to its own requests); a request without it gets 401.
Without a token the server answers only requests whose ``Host`` names a loopback address (a
web page elsewhere cannot reach it through DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fedcure_app.live.metrics import exposition
from fedcure_app.live.model import LiveState

log = logging.getLogger("fedcure.live")

#: the page's files: name -> content type
STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}
#: every answer carries these
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self'; script-src 'self'; connect-src 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: seconds between SSE keep-alive comments
KEEPALIVE_S = 15.0


class DashboardError(ValueError):
    """A live view address or token that cannot be used (one line)."""


def parse_address(text: str, flag: str = "--dashboard") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) split and checked; raises :class:`DashboardError`."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise DashboardError(f"{flag} expects HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """``host`` is ``localhost`` or a loopback IP address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(address: str, token: str, flag: str = "--dashboard",
               token_flag: str = "--dashboard-token") -> tuple[str, int]:
    """The (host, port) to serve the live view on; an address other than loopback without a
    token raises :class:`DashboardError` (the page would show the run to the network)."""
    host, port = parse_address(address, flag)
    if not is_loopback(host) and not token:
        raise DashboardError(
            f"{flag} {address}: a live view on a non-loopback address needs {token_flag} "
            "(every request must then carry it)")
    if token and len(token) < 8:
        raise DashboardError(f"{token_flag} must be at least 8 characters")
    return host, port


def static_file(name: str) -> bytes:
    """One of the page's files (package data of :mod:`fedcure_app.live`)."""
    return resources.files("fedcure_app.live").joinpath("static", name).read_bytes()


class LiveServer:
    """The live view of ``source()`` on ``host:port`` (see the module docstring).

    ``interval_s``: shortest time between two events of one stream; ``token``: required on
    every request when set; ``tls``: (certificate, key) PEM files to serve HTTPS with. ``start()`` binds (port 0: any free port) and returns the port;
    ``stop()`` ends every stream and closes the socket.
    """

    def __init__(self, source: Callable[[], LiveState], host: str = "127.0.0.1",
                 port: int = 8080, *, token: str = "", interval_s: float = 1.0,
                 title: str = "FedCure", tls: tuple[str, str] | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval must be > 0 s, got {interval_s}")
        self.source = source
        self.host, self.port = host, int(port)
        self.token = token
        self.interval_s = float(interval_s)
        self.title = title
        #: (certificate, key) PEM files: serve HTTPS (None: plain HTTP)
        self.tls = tls
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The page's address (without the token)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/"

    def start(self) -> int:
        """Bind and serve from a daemon thread; the bound port. Raises ``OSError`` when the
        address cannot be bound."""
        server = self

        class Handler(_Handler):
            live = server

        family_v6 = ":" in self.host
        cls = _Server6 if family_v6 else _Server4
        self._httpd = cls((self.host, self.port), Handler)
        if self.tls is not None:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                ctx.load_cert_chain(*self.tls)
            except (OSError, ssl.SSLError):
                self._httpd.server_close()
                raise
            # the handshake runs in the connection's thread, not in the accepting one
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="fedcure-live", daemon=True)
        self._thread.start()
        log.info("live view on %s%s", self.url, " (token required)" if self.token else "")
        return self.port

    def stop(self) -> None:
        """Stop serving: open streams end within one interval."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    # -------------------------------------------------------------- requests
    def authorised(self, headers: Any, query: dict[str, list[str]]) -> bool:
        """The request carries the token (always true without one)."""
        if not self.token:
            return True
        given = ""
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer "):].strip()
        elif query.get("token"):
            given = query["token"][0]
        return hmac.compare_digest(given.encode(), self.token.encode())


class _Server4(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hung up, or spoke plain HTTP to HTTPS: one debug line, no traceback
        import sys

        log.debug("live view: connection from %s failed: %s", client_address,
                  sys.exc_info()[1])


class _Server6(_Server4):
    import socket as _socket

    address_family = _socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    live: LiveServer
    server_version = "fedcure-live"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _host_ok(self) -> bool:
        if self.live.token:
            return True
        host = self.headers.get("Host", "")
        if host.startswith("["):
            name = host[1:host.find("]")]
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return is_loopback(name) or name == self.live.host

    def do_HEAD(self) -> None:  # noqa: N802 - stdlib's name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if not self._host_ok():
            self._send(HTTPStatus.FORBIDDEN, b"forbidden: unexpected Host header\n")
            return
        if not self.live.authorised(self.headers, query):
            self._send(HTTPStatus.UNAUTHORIZED, b"401: this live view needs its token\n",
                       extra={"WWW-Authenticate": 'Bearer realm="fedcure"'})
            return
        path = parts.path
        try:
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, static_file("index.html"), STATIC["index.html"])
            elif path.startswith("/static/") and path[len("/static/"):] in STATIC:
                name = path[len("/static/"):]
                self._send(HTTPStatus.OK, static_file(name), STATIC[name])
            elif path == "/metrics":
                self._send(HTTPStatus.OK, exposition(self.live.source),
                           "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/api/state":
                since = _int(query.get("since", ["0"])[0])
                body = json.dumps(self.live.source().to_json(since)).encode()
                self._send(HTTPStatus.OK, body, "application/json")
            elif path == "/events":
                self._events()
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # noqa: BLE001 - one request failed; the view goes on
            log.exception("live view: %s failed", path)
            try:
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")
            except OSError:
                pass

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only\n", extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815 - stdlib's names

    def _events(self) -> None:
        """Server-sent events: a snapshot whenever one changed, at most every interval."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        for k, v in SECURITY_HEADERS.items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        live = self.live
        sent: tuple[Any, ...] = ()  # the rounds the page holds (resent from the first changed)
        last_key: Any = None  # holds the last view: its identity is the change test
        last_write = 0.0
        while not live._stopping.is_set():
            state = live.source()
            key = (state.view, state.phase, state.clients_registered,
                   state.edges_connected, state.progress, state.counts)
            now = time.monotonic()
            if (last_key is None or key[0] is not last_key[0] or key[1:] != last_key[1:]
                    or state.progress):
                event = state.to_json(first_change(sent, state.view.history))
                sent = state.view.history
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
                last_key, last_write = key, now
            elif now - last_write >= KEEPALIVE_S:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                last_write = now
            live._stopping.wait(live.interval_s)


def first_change(old: Sequence[Any], new: Sequence[Any]) -> int:
    """The index of the first round in ``new`` that differs from ``old`` (a page holding
    ``old`` gets the rounds from there: a later evaluation may fill an earlier round's
    accuracy), or the shorter one's length."""
    for i, (a, b) in enumerate(zip(old, new)):
        if a is not b and a != b:
            return i
    return min(len(old), len(new))


def _int(text: str) -> int:
    try:
        return max(0, int(text))
    except ValueError:
        return 0



#: how many ports above the asked one a busy dashboard port may move to
DASHBOARD_PORT_TRIES = 20


def dashboard_address(address: str) -> str:
    """``address`` (HOST:PORT) with a port free now: PORT itself or the next free one of
    :data:`DASHBOARD_PORT_TRIES` above it; port 0: any free port. Raises ``RuntimeError``."""
    import socket

    from fedcure_app.runtime.processes import free_port

    host, port = parse_address(address)
    fmt = f"[{host}]" if ":" in host else host
    if port == 0:
        return f"{fmt}:{free_port(host)}"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for p in range(port, min(port + DASHBOARD_PORT_TRIES, 65536)):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, p))
            except OSError:
                continue
            return f"{fmt}:{p}"
    raise RuntimeError(f"--dashboard {address}: no free port in {port}-"
                       f"{port + DASHBOARD_PORT_TRIES - 1}; pass another or --no-dashboard")


__all__ = ["DASHBOARD_PORT_TRIES", "DashboardError", "LiveServer", "check_bind",
           "dashboard_address", "first_change", "is_loopback", "parse_address", "static_file"]
