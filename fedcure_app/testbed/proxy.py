"""``python -m fedcure_app.testbed.proxy FD HOST:PORT``: the cloud's live view on the host.

``fedcure testbed`` binds the host's listening socket (e.g. 127.0.0.1:8080, in the machine's own
network namespace) and hands it to this process as file descriptor ``FD``; this process runs in
the cloud's namespace, where ``HOST:PORT`` (the cloud's live view, on that namespace's own
loopback) is reachable. Every connection accepted on ``FD`` is joined to a new connection to
``HOST:PORT`` and bytes are copied both ways until either side closes. A socket keeps the
namespace it was made in, so this one process bridges exactly one host port to exactly one
address inside the testbed, and nothing else of the namespaces is reachable from the host.
Exits on SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading

log = logging.getLogger("fedcure.testbed.proxy")

#: bytes copied per read
CHUNK = 64 * 1024
#: seconds to wait for the cloud's live view to accept a connection
CONNECT_TIMEOUT_S = 5.0


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends; then end ``dst``'s sending side."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _join(conn: socket.socket, target: tuple[str, int]) -> None:
    """Serve one accepted connection: copy both ways between it and ``target``."""
    try:
        upstream = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
    except OSError as err:
        log.debug("live view %s:%d not reachable: %s", *target, err)
        conn.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
    back.start()
    _pipe(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def serve(listener: socket.socket, target: tuple[str, int], stop: threading.Event) -> None:
    """Accept on ``listener`` until ``stop`` is set; one thread per connection."""
    listener.settimeout(0.5)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            if stop.is_set():
                break
            raise
        conn.settimeout(None)
        threading.Thread(target=_join, args=(conn, target), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from fedcure_app.live.server import DashboardError, parse_address

    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 2 or not args[0].isdigit():
            raise DashboardError("usage: python -m fedcure_app.testbed.proxy FD HOST:PORT")
        target = parse_address(args[1], "HOST:PORT")
    except DashboardError as err:
        print(err, file=sys.stderr)
        return 2
    listener = socket.socket(fileno=int(args[0]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve(listener, target, stop)
    finally:
        listener.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
