"""Run the stock Flower App (``stock_app``) on Flower's Simulation Runtime; print a JSON line.

    python3 bench/flower_stock/run_stock.py '{"data-dir": "/path/to/mnist", "num-server-rounds": 23}'

Drives the runtime in-process, the way ``fedcure_app.flower.run`` does for the
FedCure app (virtual SuperNodes on Ray, one ClientApp actor per CPU), so that no SuperLink with
fixed ports has to be started on a machine other people share; ``flwr run bench/flower_stock``
runs the same app through a SuperLink (see ``pyproject.toml``). The printed ``seconds`` is the
ServerApp's ``strategy.start`` alone; ``wall_seconds`` includes Ray's start-up.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(overrides: dict) -> dict:
    import tomli_w
    from flwr.app import Context, RecordDict
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    from fedcure_app.flower.run import _offline_defaults, ray_failed_to_start
    from stock_app.client_app import app as client_app
    from stock_app.server_app import app as server_app

    _offline_defaults()
    doc = tomllib.loads((HERE / "pyproject.toml").read_text())
    rc = doc["tool"]["flwr"]["app"]["config"]
    for k, v in overrides.items():
        if k not in rc:
            raise KeyError(f"unknown run-config key {k!r}")
        rc[k] = v
    with tempfile.TemporaryDirectory(prefix="stock-") as tmp:
        rc["out-file"] = str(Path(tmp) / "out.json")
        app_dir = Path(tmp) / "app"
        app_dir.mkdir()
        (app_dir / "pyproject.toml").write_text(tomli_w.dumps(doc))
        for attempt in (1, 2, 3):  # Ray gives its raylet 30 s to register: retry when loaded
            t0 = time.perf_counter()
            try:
                _run_simulation(
                    num_supernodes=int(rc["num-clients"]),
                    exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
                    client_app=client_app, server_app=server_app, backend_name="ray",
                    backend_config={"client_resources": {"num_cpus": 1.0, "num_gpus": 0.0},
                                    "init_args": {"logging_level": "ERROR",
                                                  "log_to_driver": False}},
                    server_app_context=Context(run_id=0, node_id=0, node_config={},
                                               state=RecordDict(), run_config=dict(rc)),
                    app_dir=str(app_dir), is_app=True,
                )
                break
            except RuntimeError as err:
                if attempt == 3 or not ray_failed_to_start(err):
                    raise
        wall = time.perf_counter() - t0
        out = json.loads(Path(rc["out-file"]).read_text())
    out["wall_seconds"] = wall
    out["local_steps"] = int(rc["num-server-rounds"]) * int(rc["clients-per-round"]) * int(
        rc["local-steps"])
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})),
          flush=True)
    os._exit(0)  # Ray's atexit hooks can hang a loaded machine after the result is out
