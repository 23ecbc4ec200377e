"""Helpers every way of starting Flower shares: its console scripts and a generated app dir.

- :func:`flower_bin`: the path of a Flower console script (``flwr``, ``flower-superlink``,
  ``flower-supernode``) installed next to this Python, so that a role started from a virtual
  environment runs that environment's Flower even when it is not on ``PATH`` (the executables
  Flower starts by name are found through the ``PATH`` of
  :func:`fedcure_app.runtime.processes.flower_env`, which puts that directory first);
- :func:`write_app_dir`: a Flower App directory holding only a generated ``pyproject.toml``
  whose components are installed modules and whose ``[tool.flwr.app.config]`` is a full run
  config. ``flwr run DIR`` (the edge role) and the Simulation Runtime
  (:mod:`fedcure_app.flower.run`) take it;
- :func:`ray_node_metric`: which Ray node a ClientApp runs on, for its reply's metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tomli_w

from fedcure_app.runtime.processes import script_path

#: The FedCure ServerApp that runs the whole hierarchy on Flower's Simulation Runtime.
SIMULATION_SERVERAPP = "fedcure_app.flower.server_app:app"
#: The FedCure ClientApp (local training), for simulation and deployment alike.
CLIENTAPP = "fedcure_app.flower.client_app:app"


def flower_bin(name: str) -> str:
    """The console script ``name`` next to this Python, else ``name`` (found on PATH)."""
    return script_path(name)


def ray_node_metric() -> dict[str, int]:
    """``{"ray-node": id}`` where this process is a Ray worker (a ClientApp on the Simulation
    Runtime), else ``{}``: the first 48 bits of the Ray node id as an int (metrics hold numbers
    only), so the ServerApp can tell which cluster node trained each reply. Ray is looked up
    in ``sys.modules``, never imported: the deployed ClientApp runs without it."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    try:
        node = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - a driver without a node context
        return {}
    return {"ray-node": int(str(node)[:12], 16)} if node else {}


def write_app_dir(
    path: Path,
    run_config: dict[str, Any],
    *,
    serverapp: str = SIMULATION_SERVERAPP,
    clientapp: str = CLIENTAPP,
) -> Path:
    """Create ``path`` (if needed) with a ``pyproject.toml`` declaring a Flower App whose
    components are ``serverapp``/``clientapp`` (``module:attribute``) and whose run config is
    ``run_config``; return ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    doc = {
        "project": {"name": "fedcure", "version": "0.1.0"},
        "tool": {"flwr": {"app": {
            "publisher": "fedcure",
            "components": {"serverapp": serverapp, "clientapp": clientapp},
            "config": run_config,
        }}},
    }
    (path / "pyproject.toml").write_text(tomli_w.dumps(doc))
    return path


__all__ = ["CLIENTAPP", "SIMULATION_SERVERAPP", "flower_bin", "ray_node_metric",
           "write_app_dir"]
