"""The edge ServerApp: what ``fedcure-edge`` submits to its own SuperLink (``flwr run``).

Flower starts it in a ``flwr-serverapp`` process. Its run config (written by
:func:`edge_server.superlink.edge_run_config`) names the edge's settings file in ``edge-file``;
:func:`run_edge_role` reads it and hands this SuperLink's grid to
:func:`edge_server.serve.serve_edge`, which serves the cloud's tasks with
:func:`fedcure_app.flower.edge.run_edge_task` until training is over.

:data:`edge_server.superlink.EDGE_SERVERAPP` names it in the generated app's
``pyproject.toml``. It lives in the role package because it is the role's work: the library's
ServerApp (:mod:`fedcure_app.flower.server_app`) runs the simulation and knows nothing of the roles.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from edge_server.serve import serve_edge
from edge_server.settings import EdgeSettings
from fedcure_app.flower.app_config import AppOptions, app_options
from fedcure_app.flower.fastpath.roles import tune_edge_grid
from fedcure_app.runtime.tracing import set_role

app = ServerApp()


def run_edge_role(grid: Grid, run_config: dict[str, Any], opts: AppOptions) -> None:
    """The deployed edge server: serve the cloud's tasks with
    :func:`fedcure_app.flower.edge.run_edge_task` on this SuperLink's grid until training is
    over."""
    if not opts.edge_file:
        raise ValueError("role 'edge' needs the run-config key edge-file (start the edge with "
                         "fedcure-edge, which writes it)")
    settings = EdgeSettings.load(opts.edge_file)
    set_role(f"edge{settings.edge_id}")
    # a reply is listed before its objects land: retry them after 10 ms, not Flower's 1 s, and
    # give up on a reply whose objects never come (its client died uploading) after half the
    # edge timeout (the messages live twice the timeout, so the other replies outlast that
    # wait); objects in one request each way, the replies with theirs in one pull
    tune_edge_grid(grid, settings.edge_timeout_s)
    log(INFO, "[fedcure] edge %d: serving the cloud at %s; clients reach this SuperLink at %s",
        settings.edge_id, settings.cloud, settings.advertise)
    stats = serve_edge(grid, settings)
    log(INFO, "[fedcure] edge %d done: %d tasks, %d edge rounds", settings.edge_id, stats.tasks,
        stats.edge_rounds)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under the edge's SuperLink."""
    run_config = dict(context.run_config)
    run_edge_role(grid, run_config, app_options(run_config))


__all__ = ["app", "run_edge_role"]
