"""The warm client's trainer: one long-lived process that runs FedCure's ClientApp.

Started by :mod:`client.executor` as ``python -m client.trainer --fd N``, where ``N`` is its end
of a private socket pair (inherited, never a listening socket: no other process can reach it).
It imports torch and :mod:`fedcure_app.client_app` once, so the model, the node's data file and
the frequency actuator stay loaded across messages, then answers requests on the pair:

- ``("train", message, context, task_id, started_at)`` → ``("ok", reply, context)`` from
  ``fedcure_app.client_app.app(message, context)`` (Flower's own ClientApp call), or
  ``("error", reason)`` when the ClientApp raised;
- ``("ping",)`` → ``("pong", pid)``.

It sends ``("ready", pid)`` once loaded and exits when the pair closes (its executor is gone).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger("fedcure.client.trainer")


def serve(conn: Connection) -> int:
    """Answer requests on ``conn`` until it closes; return the exit code."""
    from flwr.supercore.task_identity import TaskIdentity

    import fedcure_app.client_app as client_app

    conn.send(("ready", os.getpid()))
    while True:
        try:
            request: Any = conn.recv()
        except (EOFError, OSError):
            return 0
        kind = request[0]
        if kind == "ping":
            conn.send(("pong", os.getpid()))
            continue
        if kind != "train":
            conn.send(("error", f"unknown request {kind!r}"))
            continue
        _, message, context, task_id, started_at = request
        TaskIdentity.task_id = int(task_id)
        TaskIdentity.run_id = int(context.run_id)
        TaskIdentity.node_id = int(context.node_id)
        client_app.task_started_at = float(started_at)
        try:
            reply = client_app.app(message=message, context=context)
            out: tuple[Any, ...] = ("ok", reply, context)
        except Exception as ex:  # noqa: BLE001 - reported to the edge as an error reply
            log.exception("the ClientApp raised")
            out = ("error", f"{type(ex)}:<'{ex}'>")
        finally:
            client_app.task_started_at = None
        conn.send(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.trainer",
                                description="FedCure warm trainer (started by client.executor)")
    p.add_argument("--fd", type=int, required=True, help="inherited socket to the executor")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    conn = Connection(args.fd)
    try:
        return serve(conn)
    finally:
        conn.close()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
