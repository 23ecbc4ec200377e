"""Flower ServerApp: the whole FedCure hierarchy on Flower's Simulation Runtime.

``role = "simulation"`` (the default): the cloud strategy and the event-driven engine run here
on a simulated clock, while every client's local training runs in the ClientApp on a virtual
SuperNode, reached through :class:`~fedcure_app.simulation.flower_executor.FlowerExecutor`
(one :class:`~fedcure_app.flower.edge.CoalitionGrid` per coalition task). The run config
(``[tool.flwr.app.config]`` plus ``--run-config`` overrides) is turned into the one
:class:`~fedcure_app.config.FedCureConfig` by :func:`fedcure_app.flower.app_config.
config_from_run_config`; the executor is forced to ``flower``. Results: ``result.json`` and the
standard plots in ``out-dir/<run id>/`` (relative paths resolve against the ServerApp's working
directory, which under ``flwr run`` is the directory the local SuperLink was started from; the
absolute path is logged); a finished run then points ``out-dir/latest`` at its folder, a failed
one leaves ``failed.txt`` there and touches nothing else
(:mod:`fedcure_app.flower.run_folders`). A failed run's last log line is FedCure's
``[fedcure] run failed: <why>``: Flower's traceback and exit note follow only with
``debug=true`` in the run config.

The deployed edge server has its own ServerApp in its role package (``edge_server.app:app``,
which ``fedcure-edge`` submits to its SuperLink with ``role = "edge"``): the library imports no
role (docs/DESIGN.md).
"""

from __future__ import annotations

import json
import logging
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


class QuietFailure(logging.Filter):
    """On Flower's logger: drop its report of a failure FedCure has already said in one line
    (the record that carries the traceback of ``err``, and the exit note after it), so that
    line is the last the run prints."""

    def __init__(self, err: BaseException) -> None:
        super().__init__()
        self.err = err
        self.dropped = False

    def _is_ours(self, exc: BaseException | None) -> bool:
        seen = 0
        while exc is not None and seen < 10:  # Flower may wrap it
            if exc is self.err:
                return True
            exc, seen = exc.__cause__ or exc.__context__, seen + 1
        return False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and self._is_ours(record.exc_info[1]):
            self.dropped = True
            return False
        return not (self.dropped and str(record.msg).startswith("Exit Code:"))


def quiet_flower_failure(err: BaseException) -> QuietFailure:
    """Install :class:`QuietFailure` for ``err`` on Flower's logger; returns it."""
    from flwr.common.logger import FLOWER_LOGGER

    quiet = QuietFailure(err)
    FLOWER_LOGGER.addFilter(quiet)
    return quiet


def _progress_line(row: dict[str, Any], total: int, t0: float) -> str:
    acc = "" if row["accuracy"] is None else f" acc {100 * row['accuracy']:.2f}%"
    return (f"[fedcure] round {row['round']}/{total} coalition {row['coalition']} "
            f"sim {row['time_s']:.1f}s staleness {row['staleness']} xi {row['xi']:.3f}"
            f"{acc} (wall {time.perf_counter() - t0:.1f}s)")


def results_dir(opts: AppOptions, run_id: int | str | None) -> Path:
    """Where run ``run_id`` writes: ``out-dir/<run id>/`` (``out-dir`` itself without
    run folders or a run id)."""
    from fedcure_app.flower.run_folders import run_dir

    base = resolve_out_dir(opts.out_dir)
    return run_dir(base, run_id) if opts.run_folders and run_id is not None else base


def run_simulation_role(
    grid: Grid, run_config: dict[str, Any], opts: AppOptions | None = None,
    run_id: int | str | None = None,
) -> dict[str, Any]:
    """Run the engine with the Flower executor on ``grid``; write and return the result dict
    (in ``out-dir/<run_id>/``, then ``out-dir/latest`` names it; see :func:`results_dir`)."""
    from fedcure_app.flower.run_folders import mark_latest

    from fedcure_app.simulation.engine import SimulationEngine, build_federation
    from fedcure_app.simulation.flower_executor import FlowerExecutor
    from fedcure_app.run_plots import write_run_plots

    opts = opts or app_options(run_config)
    cfg = simulation_config(run_config)
    out = results_dir(opts, run_id)
    fed = cfg.federation
    log(INFO, "[fedcure] %s on %s: %d clients, %d edges, %d global rounds, tau_e=%d, "
        "tau_c=%d, formation=%s, scheduler=%s; results -> %s",
        "simulation", "own data (task)" if cfg.task is not None else cfg.data.dataset,
        fed.num_clients, fed.num_edges, cfg.run.global_rounds,
        cfg.method.tau_e, cfg.method.tau_c, cfg.method.formation, cfg.method.scheduler, out)
    start = start_model(opts.init_model, cfg) if opts.init_model else None  # before any data
    federation = build_federation(cfg)
    if start is not None:
        federation.initial_arrays = start
    executor = FlowerExecutor(
        grid, federation.cfg.federation.num_clients,  # less the clients refused
        poll_s=opts.poll_interval_s, timeout_s=opts.edge_timeout_s,
        discovery_timeout_s=opts.discovery_timeout_s,
        discovery_stall_s=10.0,  # virtual SuperNodes register all at once
        extra_config={"data-key": client_fingerprint(cfg)},
        share_nodes=True,  # fewer virtual SuperNodes than clients: they take turns
    )
    t0 = time.perf_counter()
    total = cfg.run.global_rounds
    engine = SimulationEngine(federation, executor)
    try:
        result = engine.run(
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
    from fedcure_app.trained.files import model_info, run_task, write_model_files

    write_model_files(out, engine.strategy.global_arrays, run_task(cfg),
                      model_info("flwr run", result))
    (out / "result.json").write_text(json.dumps(result, indent=1))
    write_run_plots(result, out, title=f"{result['dataset']} · {cfg.method.formation}/"
                    f"{cfg.method.scheduler} · flower")
    if out != resolve_out_dir(opts.out_dir):
        mark_latest(out.parent, out.name)
    acc = result["final_accuracy"]
    log(INFO, "[fedcure] done: final accuracy %s, %.1f simulated s, %.3f s per edge round "
        "(Flower path); wrote %s", "-" if acc is None else f"{100 * acc:.2f}%",
        result["simulated_seconds"], st.seconds_per_edge_round, out / "result.json")
    return result


def start_model(path: str, cfg: Any) -> list[Any]:
    """The weights of the run config's ``init-model`` checked against the run's model;
    :class:`~fedcure_app.config.ConfigError` in one line for a file that is not it."""
    from fedcure_app.config import ConfigError
    from fedcure_app.trained.files import ModelFileError, load_weights, run_task

    file = resolve_out_dir(path)  # ~ expanded, relative to the working directory
    try:
        arrays = load_weights(file, run_task(cfg))
    except ModelFileError as err:
        raise ConfigError(f"init-model: {err}") from None
    log(INFO, "[fedcure] starting from the model in %s", file)
    return arrays


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run`` / the Simulation Runtime."""
    from fedcure_app.runtime.threads import apply_thread_policy

    apply_thread_policy(where="ServerApp")
    from fedcure_app.config import ConfigError
    from fedcure_app.data.errors import DatasetError
    from fedcure_app.simulation.flower_executor import DiscoveryError

    run_config = dict(context.run_config)
    opts: AppOptions | None = None
    try:
        opts = app_options(run_config)
        if opts.role != "simulation":
            raise ConfigError(f"role {opts.role!r} runs edge_server.app:app, the ServerApp "
                              "that fedcure-edge submits; this ServerApp runs the simulation "
                              "only")
        run_simulation_role(grid, run_config, opts, run_id=context.run_id)
    except (ConfigError, DatasetError, DiscoveryError) as err:
        # a mistake in the set-up: one line, and the run ends as failed
        failed = RunFailed(" ".join(str(err).split()))
        _report_failure(failed, str(failed), opts, context.run_id)
        raise failed from None
    except Exception as err:
        reason = f"{type(err).__name__}: {' '.join(str(err).split())}"
        _report_failure(err, reason + ("" if opts is not None and opts.debug else
                                       " (debug=true in the run config shows the traceback)"),
                        opts, context.run_id)
        raise


def _report_failure(err: BaseException, reason: str, opts: AppOptions | None,
                    run_id: int | str | None) -> None:
    """``failed.txt`` in the run's folder, Flower's own report of ``err`` silenced (unless
    ``debug``), then the one line that ends the run's log."""
    from fedcure_app.flower.run_folders import note_failure

    if opts is not None:
        try:
            folder = results_dir(opts, run_id)
        except ValueError:
            folder = None
        if folder is not None and folder != resolve_out_dir(opts.out_dir):
            note_failure(folder, reason)
    if opts is None or not opts.debug:
        quiet_flower_failure(err)
    log(ERROR, "[fedcure] run failed: %s", reason)


__all__ = ["QuietFailure", "RunFailed", "app", "quiet_flower_failure", "resolve_out_dir",
           "results_dir", "run_simulation_role", "simulation_config", "start_model"]
