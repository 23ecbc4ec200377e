"""Flower ServerApp: the whole FedCure hierarchy on Flower's Simulation Runtime.

``role = "simulation"`` (the default): the cloud strategy and the event-driven engine run here
on a simulated clock, while every client's local training runs in the ClientApp on a virtual
SuperNode, reached through :class:`~fedcure_app.simulation.flower_executor.FlowerExecutor`
(one :class:`~fedcure_app.flower.edge.CoalitionGrid` per coalition task). The run config
(``[tool.flwr.app.config]`` plus ``--run-config`` overrides) is turned into the one
:class:`~fedcure_app.config.FedCureConfig` by :func:`fedcure_app.flower.app_config.
config_from_run_config`; the executor is forced to ``flower``. Results: ``result.json`` and the
standard plots in ``out-dir`` (relative paths resolve against the ServerApp's working
directory, which under ``flwr run`` is the directory the local SuperLink was started from; the
absolute path is logged).

The deployed edge server has its own ServerApp in its role package (``edge_server.app:app``,
which ``fedcure-edge`` submits to its SuperLink with ``role = "edge"``): the library imports no
role (docs/DESIGN.md).
"""

from __future__ import annotations

import json
import time
import warnings
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fedcure_app.flower.app_config import (
    AppOptions,
    app_options,
    client_fingerprint,
    config_from_run_config,
)
from fedcure_app.config import FedCureConfig, apply_flat

app = ServerApp()

# Flower's Ray backend calls ray.init() in this process after the ServerApp is loaded; Ray then
# warns that a future version will stop hiding GPUs from actors that ask for none. FedCure's
# ClientApps ask for none and train on the CPU, so the notice says nothing about this run.
warnings.filterwarnings("ignore", message=r"Tip: In future versions of Ray",
                        category=FutureWarning)


def resolve_out_dir(out_dir: str | Path, cwd: Path | None = None) -> Path:
    """``out_dir`` as an absolute path (``~`` expanded; relative to ``cwd`` or the working dir)."""
    p = Path(out_dir).expanduser()
    if not p.is_absolute():
        p = (cwd or Path.cwd()) / p
    return p.resolve()


def simulation_config(run_config: dict[str, Any]) -> FedCureConfig:
    """The FedCure configuration of a run config, with the executor forced to ``flower``."""
    return apply_flat(config_from_run_config(run_config), {"executor": "flower"})


class RunFailed(RuntimeError):
    """A run stopped by a mistake in its set-up (SuperNodes, configuration, dataset): the
    ServerApp has logged why in one line; raised without the traceback chain."""


def clear_outputs(out: Path) -> list[str]:
    """Remove the files an earlier run wrote to ``out`` (``result.json`` and the plots), so
    that a run that fails leaves none to be taken for its own; returns the names removed."""
    from fedcure_app.run_plots import RUN_PLOTS

    removed = []
    for name in ("result.json", *RUN_PLOTS):
        path = out / name
        if path.is_file():
            path.unlink()
            removed.append(name)
    return removed


def _progress_line(row: dict[str, Any], total: int, t0: float) -> str:
    acc = "" if row["accuracy"] is None else f" acc {100 * row['accuracy']:.2f}%"
    return (f"[fedcure] round {row['round']}/{total} coalition {row['coalition']} "
            f"sim {row['time_s']:.1f}s staleness {row['staleness']} xi {row['xi']:.3f}"
            f"{acc} (wall {time.perf_counter() - t0:.1f}s)")


def run_simulation_role(
    grid: Grid, run_config: dict[str, Any], opts: AppOptions | None = None
) -> dict[str, Any]:
    """Run the engine with the Flower executor on ``grid``; write and return the result dict."""
    from fedcure_app.simulation.engine import SimulationEngine, build_federation
    from fedcure_app.simulation.flower_executor import FlowerExecutor
    from fedcure_app.run_plots import write_run_plots

    opts = opts or app_options(run_config)
    cfg = simulation_config(run_config)
    out = resolve_out_dir(opts.out_dir)
    fed = cfg.federation
    log(INFO, "[fedcure] %s on %s: %d clients, %d edges, %d global rounds, tau_e=%d, "
        "tau_c=%d, formation=%s, scheduler=%s; results -> %s",
        "simulation", cfg.data.dataset, fed.num_clients, fed.num_edges, cfg.run.global_rounds,
        cfg.method.tau_e, cfg.method.tau_c, cfg.method.formation, cfg.method.scheduler, out)
    removed = clear_outputs(out)
    if removed:
        log(INFO, "[fedcure] removed the previous run's %s from %s", ", ".join(removed), out)
    federation = build_federation(cfg)
    executor = FlowerExecutor(
        grid, fed.num_clients,
        poll_s=opts.poll_interval_s, timeout_s=opts.edge_timeout_s,
        discovery_timeout_s=opts.discovery_timeout_s,
        discovery_stall_s=10.0,  # virtual SuperNodes register all at once
        extra_config={"data-key": client_fingerprint(cfg)},
        share_nodes=True,  # fewer virtual SuperNodes than clients: they take turns
    )
    t0 = time.perf_counter()
    total = cfg.run.global_rounds
    try:
        result = SimulationEngine(federation, executor).run(
            on_round=lambda row: log(INFO, "%s", _progress_line(row, total, t0))
        )
    finally:
        executor.close()
    st = executor.stats
    result["flower"] = {
        "num_supernodes": len(list(grid.get_node_ids())),
        "node_of_client": {str(c): n for c, n in executor.node_of_client.items()},
        "discovery_seconds": st.discovery_seconds,
        "tasks": st.tasks,
        "edge_rounds": st.edge_rounds,
        "edge_seconds": st.seconds,
        "seconds_per_edge_round": st.seconds_per_edge_round,
        # without the first task, whose messages also start the ClientApp actors
        "seconds_per_edge_round_warm": st.seconds_per_edge_round_after(1),
        "dropped": st.dropped,
        "ray_nodes": {f"{n:012x}": k for n, k in sorted(st.ray_nodes.items())},
        "per_task": [[r, s] for r, s in st.per_task],
    }
    if st.dropped:
        log(WARNING, "[fedcure] clients dropped from edge rounds: %s", st.dropped)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    write_run_plots(result, out, title=f"{result['dataset']} · {cfg.method.formation}/"
                    f"{cfg.method.scheduler} · flower")
    acc = result["final_accuracy"]
    log(INFO, "[fedcure] done: final accuracy %s, %.1f simulated s, %.3f s per edge round "
        "(Flower path); wrote %s", "-" if acc is None else f"{100 * acc:.2f}%",
        result["simulated_seconds"], st.seconds_per_edge_round, out / "result.json")
    return result


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run`` / the Simulation Runtime."""
    from fedcure_app.runtime.threads import apply_thread_policy

    apply_thread_policy(where="ServerApp")
    from fedcure_app.config import ConfigError
    from fedcure_app.data.errors import DatasetError
    from fedcure_app.simulation.flower_executor import DiscoveryError

    run_config = dict(context.run_config)
    try:
        opts = app_options(run_config)
        if opts.role != "simulation":
            raise ConfigError(f"role {opts.role!r} runs edge_server.app:app, the ServerApp "
                              "that fedcure-edge submits; this ServerApp runs the simulation "
                              "only")
        run_simulation_role(grid, run_config, opts)
    except (ConfigError, DatasetError, DiscoveryError) as err:
        # a mistake in the set-up: one line, and the run ends as failed without a traceback
        # of FedCure's internals (Flower still adds its own exit note)
        reason = " ".join(str(err).split())
        log(ERROR, "[fedcure] run failed: %s", reason)
        raise RunFailed(reason) from None
    except Exception as err:
        log(ERROR, "[fedcure] run failed: %s: %s", type(err).__name__,
            " ".join(str(err).split()))
        raise


__all__ = ["RunFailed", "app", "clear_outputs", "resolve_out_dir", "run_simulation_role",
           "simulation_config"]
