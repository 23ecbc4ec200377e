"""The warm client's trainer: one long-lived process that runs FedCure's ClientApp.

Started by :mod:`client.executor` as ``python -m client.trainer --fd N [--data-file PATH]``,
where ``N`` is its end of a private socket pair (inherited, never a listening socket: no other
process can reach it). It imports torch and :mod:`fedcure_app.flower.client_app` once, so the model,
the node's data file and the frequency actuator stay loaded across messages; with
``--data-file`` it loads that node data file and its model and runs a throw-away warm-up step
before it says it is ready (:func:`fedcure_app.flower.client_app.preload`), so the first task costs
training, not start-up. Then it answers requests on the pair:

- ``("train", message, context, task_id, started_at, startup_s)`` → ``("ok", reply, context)``
  from ``fedcure_app.flower.client_app.app(message, context)`` (Flower's own ClientApp call), or
  ``("error", reason)`` when the ClientApp raised; ``startup_s``: seconds of this message the
  executor spent starting this trainer (reported with the reply as ``startup-s``);
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


def serve(conn: Connection, data_file: str | None = None) -> int:
    """Answer requests on ``conn`` until it closes; return the exit code. ``data_file``: the
    node data file to load before saying ready."""
    from fedcure_app.flower.fastpath.roles import set_task_identity

    import fedcure_app.flower.client_app as client_app

    if data_file:
        try:
            log.info("node data %s loaded and warmed up in %.2f s", data_file,
                     client_app.preload(data_file))
        except Exception as err:  # noqa: BLE001 - the first message loads it (and says why)
            log.warning("could not preload %s (the first message will load it): %s",
                        data_file, err)
    from fedcure_app.runtime.processes import release_memory

    release_memory()  # what loading and the warm-up needed once
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
        _, message, context, task_id, started_at, startup_s = request
        set_task_identity(task_id, context.run_id, context.node_id)
        client_app.task_started_at = float(started_at)
        client_app.task_startup_s = float(startup_s)
        try:
            reply = client_app.app(message=message, context=context)
            out: tuple[Any, ...] = ("ok", reply, context)
        except Exception as ex:  # noqa: BLE001 - reported to the edge as an error reply
            log.exception("the ClientApp raised")
            out = ("error", f"{type(ex)}:<'{ex}'>")
        finally:
            client_app.task_started_at = None
            client_app.task_startup_s = None
        conn.send(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.trainer",
                                description="FedCure warm trainer (started by client.executor)")
    p.add_argument("--fd", type=int, required=True, help="inherited socket to the executor")
    p.add_argument("--data-file", help="node data file to load (and warm up on) before ready")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    from fedcure_app.runtime.tracing import set_role

    set_role("trainer")
    conn = Connection(args.fd)
    try:
        return serve(conn, args.data_file)
    finally:
        conn.close()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
