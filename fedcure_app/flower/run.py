"""Run the FedCure Flower App (ServerApp + ClientApp) in this process, without a SuperLink.

``flwr run . --stream`` is the way to run the Flower path (README); this helper is for tests
and benchmarks that want the same apps on Flower's Simulation Runtime (virtual SuperNodes on
Ray) from Python, with a given run config and without a SuperLink process to start and stop.

Flower 1.41's public ``flwr.simulation.run_simulation`` hands every app an *empty* run config,
while the FedCure ClientApp reads its dataset and partition from the run config. So this helper
calls the runtime's internal ``_run_simulation`` (``flwr`` is pinned to ``>=1.41,<1.43``) with
an app directory holding a generated ``pyproject.toml`` whose ``[tool.flwr.app.config]`` is the
full run config: the ServerApp and every node see exactly that config, as under ``flwr run``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from fedcure_app.flower.app_config import default_run_config, flag
from fedcure_app.flower.tools import write_app_dir
from fedcure_app.flower.tools import write_app_dir

log = logging.getLogger(__name__)


def full_run_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every run-config key at its default, with ``overrides`` applied (keys checked)."""
    rc = default_run_config()
    for key, value in (overrides or {}).items():
        k = key.replace("_", "-")
        if k not in rc:
            raise KeyError(f"unknown run-config key {key!r}")
        rc[k] = value
    rc.pop("executor", None)  # the ServerApp forces "flower"
    rc.pop("cuda-graphs", None)  # the simulator's batched executor only
    return rc


def _offline_defaults() -> None:
    """Flower telemetry, Flower's update check and Ray's usage stats off unless the environment
    asks for them.

    Flower reads ``FLWR_TELEMETRY_ENABLED`` once, when ``flwr.supercore.telemetry`` is first
    imported (often before this function runs), so its module constant is set as well.
    """
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if os.environ["FLWR_TELEMETRY_ENABLED"] != "1":
        import flwr.supercore.telemetry as telemetry

        telemetry.FLWR_TELEMETRY_ENABLED = "0"


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def ray_failed_to_start(err: BaseException) -> bool:
    """Whether a Simulation Runtime error comes from Ray's node start-up timing out."""
    seen: BaseException | None = err
    while seen is not None:
        if "timed out during startup" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def run_flower_simulation(
    overrides: dict[str, Any] | None = None,
    *,
    num_supernodes: int | None = None,
    client_num_cpus: float = 1.0,
    ray_num_cpus: int | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """Run the Flower App on virtual SuperNodes; return the ServerApp's ``result.json`` dict.

    ``overrides``: run-config keys (``{"num-clients": 6, "out-dir": "/tmp/x"}``; results go
    straight into ``out-dir`` unless ``"run-folders": True``, then into ``out-dir/0/``);
    ``num_supernodes`` defaults to ``num-clients``; ``client_num_cpus``: CPUs Ray reserves per
    ClientApp actor (actors = Ray CPUs / this); ``ray_num_cpus``: CPUs Ray may use (default:
    all). Telemetry, update checks and Ray usage stats are off unless the environment says
    otherwise.
    """
    _offline_defaults()
    from flwr.app import Context, RecordDict
    from flwr.supercore.telemetry import EventType
    from flwr.simulation.run_simulation import _run_simulation

    from fedcure_app.flower.client_app import app as client_app
    from fedcure_app.flower.server_app import app as server_app
    from fedcure_app.flower.server_app import resolve_out_dir

    rc = full_run_config(overrides)
    out = resolve_out_dir(rc["out-dir"])
    rc["out-dir"] = str(out)
    if "run-folders" not in (overrides or {}):
        rc["run-folders"] = False  # the caller's out-dir is the run's (fedcure simulate --out)
    n = int(num_supernodes or rc["num-clients"])
    init_args: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": verbose}
    if ray_num_cpus is not None:
        init_args["num_cpus"] = ray_num_cpus
    backend_config = {
        "client_resources": {"num_cpus": client_num_cpus, "num_gpus": 0.0},
        "init_args": init_args,
    }
    result_path = (out / "0" if flag(rc["run-folders"], "run-folders") else out) / "result.json"
    before = result_path.stat().st_mtime_ns if result_path.is_file() else None
    for attempt in (1, 2):
        try:
            with tempfile.TemporaryDirectory(prefix="fedcure-app-") as app_dir:
                write_app_dir(Path(app_dir), rc)
                context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                  run_config=dict(rc))
                _run_simulation(
                    num_supernodes=n,
                    exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
                    client_app=client_app,
                    server_app=server_app,
                    backend_name="ray",
                    backend_config=backend_config,
                    server_app_context=context,
                    app_dir=app_dir,
                    is_app=True,
                    verbose_logging=verbose,
                )
            break
        except RuntimeError as err:
            if attempt == 2 or not ray_failed_to_start(err):
                raise
            # Ray gives its raylet a fixed 30 s to register; a loaded host can miss that
            log.warning("Ray did not start (%s); starting the simulation once more",
                        _root_cause(err))
    if not result_path.is_file() or result_path.stat().st_mtime_ns == before:
        raise RuntimeError(f"the ServerApp wrote no {result_path}; see the log above")
    return json.loads(result_path.read_text())


__all__ = ["full_run_config", "run_flower_simulation"]
