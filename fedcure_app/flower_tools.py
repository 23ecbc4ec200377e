"""Helpers every way of starting Flower shares: its console scripts and a generated app dir.

- :func:`flower_bin`: the path of a Flower console script (``flwr``, ``flower-superlink``,
  ``flower-supernode``) installed next to this Python, so that a role started from a virtual
  environment runs that environment's Flower even when it is not on ``PATH``;
- :func:`write_app_dir`: a Flower App directory holding only a generated ``pyproject.toml``
  whose components are installed modules and whose ``[tool.flwr.app.config]`` is a full run
  config. ``flwr run DIR`` (the edge role) and the Simulation Runtime (``flower_run``) take it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tomli_w

#: The FedCure ServerApp that runs the whole hierarchy on Flower's Simulation Runtime.
SIMULATION_SERVERAPP = "fedcure_app.server_app:app"
#: The FedCure ClientApp (local training), for simulation and deployment alike.
CLIENTAPP = "fedcure_app.client_app:app"


def flower_bin(name: str) -> str:
    """The console script ``name`` next to this Python, else ``name`` (found on PATH)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


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


__all__ = ["CLIENTAPP", "SIMULATION_SERVERAPP", "flower_bin", "write_app_dir"]
