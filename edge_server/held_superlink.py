"""``python -m edge_server.held_superlink ARGS``: Flower's ``flower-superlink`` with held pulls.

The same SuperLink (same arguments, same code) with its two pull handlers wrapped so that a pull
which finds nothing waits for a message instead of answering at once
(:mod:`fedcure_app.flower.fastpath.held_pulls`), its web server's worker pool wide enough for one
held pull per client, and its web server's idle wake-ups cut from ten a second to one every few
seconds (:mod:`fedcure_app.flower.fastpath.quiet_server`). ``fedcure-edge`` starts its SuperLink
this way. The holds come from the environment (:class:`fedcure_app.config.EdgeLinkConfig`:
``FEDCURE_SUPERLINK_HOLD_S``, ``FEDCURE_SUPERLINK_REPLY_HOLD_S``,
``FEDCURE_SUPERLINK_THREADS``); a bad value stops it with one line and exit status 2.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("fedcure.edge.superlink")


def holds(hold_s: float, reply_hold_s: float, *, quiet: bool) -> tuple[float, float]:
    """The holds to install (seconds): the configured ones, or none (logged) when the web
    server's stop hook could not be installed (``quiet`` False), since a held pull that nothing
    lets go on SIGTERM keeps the SuperLink from stopping for up to its hold."""
    if quiet or (hold_s <= 0 and reply_hold_s <= 0):
        return hold_s, reply_hold_s
    from fedcure_app.flower.fastpath.gate import report_off

    report_off(log, "pulls are not held: uvicorn's stop cannot let a held pull go")
    return 0.0, 0.0


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-superlink`` (arguments as for it) with held pulls installed."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for name in ("fedcure.edge.superlink", "fedcure.flower.held_pulls",
                 "fedcure.flower.object_batches"):
        logging.getLogger(name).addHandler(handler)  # Flower configures its own logger
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).propagate = False
    from fedcure_app.config import ConfigError, EdgeLinkConfig

    try:
        cfg = EdgeLinkConfig.from_env(dict(os.environ))
    except ConfigError as err:
        print(f"fedcure-edge: error: SuperLink settings: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    from fedcure_app.flower.fastpath.held_pulls import install, widen_thread_pool
    from fedcure_app.flower.fastpath.quiet_server import install as quiet_uvicorn
    from fedcure_app.flower.fastpath.quiet_server import on_exit

    # the web server wakes every few seconds, not 10 times a second; its stop hook (on_exit)
    # is what lets held pulls go, so without it nothing is held
    hold_s, reply_hold_s = holds(cfg.superlink_hold_s, cfg.superlink_reply_hold_s,
                                 quiet=quiet_uvicorn())
    # no hold: Flower's handlers unchanged (no ring bookkeeping on every push)
    bell = install(hold_s, reply_hold_s) if hold_s > 0 or reply_hold_s > 0 else None
    if bell is not None:
        on_exit(bell.close)  # on SIGTERM the held pulls end at once: the server stops at once
        log.info("held pulls: a SuperNode's up to %.3g s, the ServerApp's up to %.3g s "
                 "(%d worker threads)", cfg.superlink_hold_s, cfg.superlink_reply_hold_s,
                 cfg.superlink_threads)
    from fedcure_app.flower.fastpath.batch_routes import install_server
    from fedcure_app.flower.fastpath.object_batches import PULL_PATH, PUSH_PATH

    # a message's objects in one request each way: a SuperNode's and the edge ServerApp's
    if install_server(on="superlink"):
        log.info("object batches: %s, %s and the Runtime API's", PULL_PATH, PUSH_PATH)
    from fedcure_app.flower.fastpath.message_batches import (
        PULL_MESSAGE_PATH,
        PUSH_MESSAGE_PATH,
        REPLIES_PATH,
    )
    from fedcure_app.flower.fastpath.message_routes import install_server as install_message_routes

    # a SuperNode's message in two requests (pull with objects and confirmation; push with
    # objects) instead of five; the ServerApp's replies with theirs in one pull
    if install_message_routes():
        log.info("message batches: %s, %s, %s", PULL_MESSAGE_PATH, PUSH_MESSAGE_PATH,
                 REPLIES_PATH)
    if bell is not None:  # installed last, so it runs first: before the routes served in
        widen_thread_pool(cfg.superlink_threads)  # front of Flower's stack, held ones included
    from fedcure_app.flower.fastpath.buffered_middleware import install as inline_middlewares

    # Flower's middlewares without a task and two streams per Fleet and Runtime request
    # and their sync calls on the event loop, but for the held pulls, which wait in threads
    if inline_middlewares(threaded=("/v1/fleet/pull-messages", "/v1/runtime/pull-messages",
                                    PULL_MESSAGE_PATH, REPLIES_PATH)):
        log.info("Flower's middlewares run inline on the Fleet and Runtime APIs")
    from fedcure_app.flower.fastpath.roles import run_flower_superlink

    run_flower_superlink(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":  # pragma: no cover
    main()
