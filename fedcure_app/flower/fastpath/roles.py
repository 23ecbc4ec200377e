"""What each role installs of the fast path, and Flower's own server entry points it wraps: the
only places the roles (``edge_server``, ``client``) reach into Flower beyond its public API.

Each function asks the gate through the patches it installs (each says why it stays off), so a
role calls it unconditionally and runs at stock Flower speed where the gate is closed.
"""

from __future__ import annotations

from typing import Any


def tune_edge_grid(grid: Any, edge_timeout_s: float) -> None:
    """The edge ServerApp's patches on its ``grid``: a reply's objects are retried after 10 ms,
    not Flower's 1 s, and given up after half the edge timeout (``edge_timeout_s``; 0: Flower's
    patience) instead of when the SuperLink's upload session expires
    (:mod:`~fedcure_app.flower.fastpath.object_pulls`); a message's objects go in one request
    each way (:mod:`~fedcure_app.flower.fastpath.object_batches`), and the replies with theirs
    in one pull (:mod:`~fedcure_app.flower.fastpath.message_batches`)."""
    from flwr.superlink.grid import http_grid

    from fedcure_app.flower.fastpath.message_batches import install_grid as install_reply_pulls
    from fedcure_app.flower.fastpath.object_batches import install_grid
    from fedcure_app.flower.fastpath.object_pulls import quick_pulls

    quick_pulls(http_grid, "pull_objects",
                max_time_s=edge_timeout_s / 2 if edge_timeout_s else None)
    install_grid(grid, http_grid)
    install_reply_pulls(grid, http_grid)


def run_flower_superlink(argv: list[str]) -> None:
    """Flower's ``flower-superlink`` main with ``argv`` as its arguments, in this process (whose
    patches are installed)."""
    import sys

    from flwr.superlink.cli.flower_superlink import flower_superlink

    sys.argv = ["flower-superlink", *argv]
    flower_superlink()


def run_flower_supernode(argv: list[str]) -> None:
    """Flower's ``flower-supernode`` main with ``argv`` as its arguments, in this process (whose
    patches are installed)."""
    import sys

    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


def set_task_identity(task_id: int, run_id: int, node_id: int) -> None:
    """Tell Flower which task the ClientApp code runs for (what ``flwr-clientapp`` sets before
    it calls the app), in a trainer process that is not ``flwr-clientapp``."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id = int(task_id)
    TaskIdentity.run_id = int(run_id)
    TaskIdentity.node_id = int(node_id)


__all__ = ["run_flower_superlink", "run_flower_supernode", "set_task_identity",
           "tune_edge_grid"]
