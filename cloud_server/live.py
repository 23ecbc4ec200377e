"""The cloud's live view: a :class:`~fedcure_app.live.model.LiveState` of a running
:class:`~cloud_server.controller.CloudController`, built without its lock.

It combines what the controller publishes after every transition (``strategy_view``, the
``Monitor.Status`` snapshot) with its :class:`~cloud_server.state.Tally`; every piece is an
immutable object or a copy, so the page, its event stream and the Prometheus scrape
(:class:`fedcure_app.live.server.LiveServer`) never wait on the cloud and the cloud never waits on
a socket. ``fedcure-cloud --dashboard HOST:PORT`` serves it (:func:`start_dashboard`).
"""

from __future__ import annotations

from typing import Any

from fedcure_app.live.model import Counts, LiveState, Progress
from fedcure_app.trained.names import run_classes
from fedcure_app.live.server import LiveServer


def live_state(controller: Any, mode: str = "deployment") -> LiveState:
    """Where ``controller``'s run stands, for the live view and ``/metrics``; ``mode``:
    ``deployment``, or ``testbed`` under ``fedcure testbed`` (the page's title names it)."""
    status = controller.status()
    view = controller.strategy_view
    late, expired, refused = controller.tally.snapshot()
    dropped = sum(p.dropped for p in view.history)
    return LiveState(
        source="cloud", clock="wall", mode=mode, phase=status.phase.name.lower(),
        evaluation="federated" if controller.federated_evaluation else "central",
        classes=run_classes(controller.cfg),
        global_rounds=status.global_rounds, clients_registered=status.clients_registered,
        expected_clients=status.expected_clients, edges_connected=status.edges_connected,
        num_edges=status.num_edges, elapsed_s=controller.log.elapsed_s(), view=view,
        progress=tuple(Progress(p.coalition, p.edge_round, p.tau_e, tuple(p.waiting),
                                p.elapsed_s, p.eta_s) for p in status.progress),
        counts=Counts(accepted=len(view.history), late=late, dropped=dropped,
                      expired=expired, refused=refused))


def start_dashboard(controller: Any, host: str, port: int, token: str = "",
                    interval_s: float = 1.0, tls: tuple[str, str] | None = None,
                    mode: str = "deployment") -> LiveServer:
    """Serve the live view of ``controller`` on ``host:port`` (started; raises ``OSError``
    when the address cannot be bound). ``tls``: (certificate, key) PEM files: HTTPS;
    ``mode``: what the page's title calls the run (``deployment`` or ``testbed``)."""
    if mode not in ("deployment", "testbed"):
        raise ValueError(f"a cloud's live view mode is deployment or testbed, got {mode!r}")
    server = LiveServer(lambda: live_state(controller, mode), host, port, token=token,
                        interval_s=interval_s, tls=tls)
    server.start()
    return server


__all__ = ["live_state", "start_dashboard"]
