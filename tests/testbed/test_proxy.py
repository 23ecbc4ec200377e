"""The testbed's live-view proxy (fedcure_app.testbed.proxy), without namespaces: it serves an
inherited listening socket, joins every connection to the target and copies both ways until
either side closes (a streamed answer included); it exits on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fedcure_app.testbed.proxy import main, serve


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - stdlib's name
        body = f"hello {self.path}".encode() * 5000  # larger than one copy chunk
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


@pytest.fixture
def target():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield httpd.server_address
    httpd.shutdown()
    httpd.server_close()


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_every_connection_reaches_the_target_and_gets_its_whole_answer(target):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    t = threading.Thread(target=serve, args=(listener, target, stop), daemon=True)
    t.start()
    try:
        port = listener.getsockname()[1]
        answers = [_get(port, f"/p{i}") for i in range(3)]
        for i, a in enumerate(answers):
            assert a.startswith(b"HTTP/1.0 200") and a.endswith(f"hello /p{i}".encode())
            assert a.count(f"hello /p{i}".encode()) == 5000
    finally:
        stop.set()
        t.join(5)
        listener.close()
    assert not t.is_alive()


def test_a_target_that_does_not_answer_closes_the_connection():
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    target = dead.getsockname()
    dead.close()  # nothing listens there now
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    t = threading.Thread(target=serve, args=(listener, target, stop), daemon=True)
    t.start()
    try:
        try:  # closed with the request unread: an empty answer or a reset
            assert _get(listener.getsockname()[1], "/") == b""
        except ConnectionResetError:
            pass
    finally:
        stop.set()
        t.join(5)
        listener.close()


def test_the_proxy_process_serves_the_inherited_socket_and_stops_on_sigterm(target):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "fedcure_app.testbed.proxy",
                             str(listener.fileno()), f"{target[0]}:{target[1]}"],
                            pass_fds=(listener.fileno(),))
    listener.close()  # only the proxy holds it now
    try:
        end = time.monotonic() + 30
        while True:
            try:
                assert _get(port, "/x").endswith(b"hello /x")
                break
            except (ConnectionError, AssertionError):
                assert time.monotonic() < end and proc.poll() is None
                time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("argv", [[], ["x", "127.0.0.1:1"], ["3", "nowhere"]])
def test_bad_arguments_exit_2(argv, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip()
