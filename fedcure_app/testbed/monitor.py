"""``python -m fedcure_app.testbed.monitor HOST:PORT``: the cloud's ``Monitor.Status``, polled
from inside a network namespace, one line per poll on stdout: the reply serialised and base64
encoded, or ``-`` while the cloud does not answer. ``fedcure testbed`` runs it in the cloud's
namespace (its own process cannot reach addresses that live only there). Exits on SIGTERM or
when stdout closes."""

from __future__ import annotations

import base64
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    import grpc

    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
    from fedcure_app.protocol.channel import open_channel

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m fedcure_app.testbed.monitor HOST:PORT", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    import logging

    logging.getLogger("fedcure.channel").setLevel(logging.ERROR)  # plaintext on purpose
    channel = open_channel(args[0], insecure=True)
    stub = pb_grpc.MonitorStub(channel)
    try:
        while not stop.is_set():
            try:
                reply = stub.Status(pb.StatusRequest(), timeout=2.0)
                line = base64.b64encode(reply.SerializeToString()).decode()
            except grpc.RpcError:
                line = "-"
            try:
                print(line, flush=True)
            except (BrokenPipeError, OSError):
                return 0
            stop.wait(0.5)
    finally:
        channel.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
