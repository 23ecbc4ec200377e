"""``python -m client.supernode ARGS``: Flower's ``flower-supernode`` with short idle waits.

Flower 1.41's SuperNode main loop (``flwr.supernode.start_client_internal``) sleeps a hard-coded
3 s whenever a pull from the SuperLink finds no message, and polls its own state every 0.5 s
for the ClientApp's reply. Neither has a setting. In a FedCure edge round every client's next
message arrives a moment after the slowest client answered, so the 3 s sleep lands inside almost
every round. This entry point runs the very same SuperNode (same arguments, same code) with the fast path's
idle clock installed (:mod:`fedcure_app.flower.fastpath.idle_clock`): the idle 3 s become a
short back-off (a pull the edge's SuperLink held is asked again at once), and the reply poll
becomes a wait that the ClientApp's push ends. Where the fast path's gate is closed, or the loop
is no longer the one it replaces, Flower runs unchanged (one line says why) and the wake FIFO is
removed, so the executor polls (:func:`drop_wake_fifo`).

``python -m client.supernode --argv-file FILE`` imports Flower and installs the patch first, then
waits for ``FILE`` (a JSON list of the arguments) to appear: ``fedcure-client`` starts it before
it registers, while it does not know its edge's address yet, so the seconds Flower's import takes
do not land in the first task.

Settings come from the environment (seconds): ``FEDCURE_SUPERNODE_IDLE_MIN_S`` (default
0.01), ``FEDCURE_SUPERNODE_IDLE_MAX_S`` (0.2), ``FEDCURE_SUPERNODE_REPLY_POLL_S`` (0.01),
``FEDCURE_SUPERNODE_HOT_S`` (2) and ``FEDCURE_SUPERNODE_HOT_MAX_S`` (0.04); see
:class:`fedcure_app.config.WarmClientConfig` for their ranges.
"""

from __future__ import annotations

import logging
import os
import sys
import time as _time

from fedcure_app.flower.fastpath.idle_clock import IdleClock, install, wake_on_replies

log = logging.getLogger("fedcure.client.supernode")


def clock_from_env(env: dict[str, str] | None = None) -> IdleClock:
    """The :class:`IdleClock` the ``FEDCURE_SUPERNODE_*`` variables describe (checked)."""
    from fedcure_app.config import WarmClientConfig

    env = dict(os.environ if env is None else env)
    cfg = WarmClientConfig.from_env(env)
    return IdleClock(cfg.supernode_idle_min_s, cfg.supernode_idle_max_s,
                     cfg.supernode_reply_poll_s, hot_s=cfg.supernode_hot_s,
                     hot_max_s=cfg.supernode_hot_max_s)


def drop_wake_fifo(env: dict[str, str] | None = None) -> None:
    """Remove the wake FIFO (``FEDCURE_WAKE_FIFO``) this SuperNode would have written to: its
    executor opens the FIFO only once this SuperNode's Runtime API listens, and without it the
    executor polls with its short back-off instead of waiting for wake-ups that never come."""
    from pathlib import Path

    from client.wake import WAKE_ENV

    path = (os.environ if env is None else env).get(WAKE_ENV)
    if path:
        Path(path).unlink(missing_ok=True)


def read_argv_file(path: str, poll_s: float = 0.02) -> list[str]:
    """The argument list in JSON file ``path``, waiting for the file to appear."""
    import json
    from pathlib import Path

    p = Path(path)
    while not p.exists():
        _time.sleep(poll_s)
    args = json.loads(p.read_text())
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SystemExit(f"client.supernode: {path} must hold a JSON list of strings")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-supernode`` (arguments as for it, or ``--argv-file FILE``: read from that
    JSON file once it exists, Flower imported meanwhile) with :class:`IdleClock` installed."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for logger in (log, logging.getLogger("fedcure.flower.object_batches"),
                   logging.getLogger("fedcure.flower.task_batches")):
        logger.addHandler(handler)  # Flower configures its own logger; the root stays untouched
        logger.setLevel(logging.INFO)
        logger.propagate = False
    from fedcure_app.runtime.tracing import set_role, trace_flower_log

    set_role("supernode")
    # before Flower is imported: its unused SQL object store (SQLAlchemy, Alembic) stays out
    from fedcure_app.flower.fastpath.lazy_sql import defer_sql_object_store

    defer_sql_object_store()
    trace_flower_log()  # FEDCURE_TRACE_DIR: Flower's receive/send log lines become events
    from client.wake import writer_from_env

    from fedcure_app.flower.fastpath.quiet_server import install as quiet_uvicorn

    quiet_uvicorn()  # its Runtime API server wakes every few seconds, not 10 times a second
    clock = clock_from_env()
    if install(clock, waker=writer_from_env()):
        wake_on_replies(clock)
        log.info("SuperNode idle wait %.3g..%.3g s, reply poll %.3g s (Flower's: 3 s, 0.5 s)",
                 clock.idle_min_s, clock.idle_max_s, clock.reply_poll_s)
    else:  # nothing will wake the executor: without the FIFO it polls with its short back-off
        drop_wake_fifo()
    from fedcure_app.flower.fastpath.batch_routes import install_server
    from fedcure_app.flower.fastpath.object_batches import install_client

    install_client()  # a message's objects in one request each way (where the SuperLink can)
    from fedcure_app.flower.fastpath.message_batches import (
        install_client as install_message_batches,
    )

    install_message_batches()  # and a message with its objects in one request each way
    install_server(on="supernode")  # and the executor's, on this SuperNode's Runtime API
    from fedcure_app.flower.fastpath.task_batches import install_server as serve_task_bundles

    serve_task_bundles()  # a task's input in one request, its reply and status in another
    from fedcure_app.flower.fastpath.buffered_middleware import install as inline_middlewares

    if inline_middlewares():  # its Runtime API's middlewares without a task per request
        log.info("Flower's middlewares run inline on the Runtime API")
    from fedcure_app.flower.fastpath.roles import run_flower_supernode

    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["--argv-file"] and len(args) == 2:
        args = read_argv_file(args[1])
    run_flower_supernode(args)


if __name__ == "__main__":  # pragma: no cover
    main()
