"""``fedcure simulate``: the whole method on a simulated clock, with a live progress bar."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from fedcure_app.cli.errors import (
    check_dataset,
    check_new_file,
    check_out_dir,
    checked_config,
    config_defaults_help,
)
from fedcure_app.cli.own_data import add_task_options, apply_task
from fedcure_app.config import METHOD_PRESETS, PEER_METHODS, FedCureConfig

log = logging.getLogger(__name__)

#: CLI option -> flat configuration key.
_OPTIONS: dict[str, str] = {
    "dataset": "dataset",
    "data_dir": "data-dir",
    "rounds": "global-rounds",
    "clients": "num-clients",
    "edges": "num-edges",
    "executor": "executor",
    "cuda_graphs": "cuda-graphs",
    "seed": "seed",
    "partition": "partition",
    "eval_every": "eval-every",
    "tau_c": "tau-c",
    "tau_e": "tau-e",
    "max_concurrent": "max-concurrent",
    "beta": "beta",
    "formation": "formation",
    "scheduler": "scheduler",
    "lr": "lr",
    "batch_size": "batch-size",
    "momentum": "momentum",
    "tau_c_unit": "tau-c-unit",
    "ell": "ell",
    "fraction": "fraction",
    "buffer_k": "buffer-k",
    "concurrency": "concurrency",
    "server_lr": "server-lr",
    "tiers": "tiers",
    "frequency": "frequency",
    "time_budget": "time-budget-s",
    "eval_every_s": "eval-every-s",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="run FedCure (or a baseline) on a simulated clock",
        description="Run the semi-asynchronous hierarchy on a simulated clock and write the "
        "per-round records (JSON) and plots.",
    )
    p.add_argument("--config", help="TOML/JSON configuration file (CLI options override it)")
    p.add_argument("--dataset", choices=["digits", "mnist", "cifar10", "svhn", "cinic10"])
    p.add_argument("--data-dir", help="directory holding the dataset files "
                   "(default: $FEDCURE_DATA_DIR, else ./data)")
    p.add_argument("--method", choices=[*METHOD_PRESETS, *PEER_METHODS],
                   help="one of the paper's methods: sets --formation and --scheduler "
                   "(default: none, those two options decide); or a peer on the same clock, "
                   "devices and data: fedavg, hierfavg, fedbuff, fedat (docs/DESIGN.md, "
                   "'The peers')")
    p.add_argument("--formation", choices=["fedcure", "none", "kmeans", "meanshift",
                                           "selfish", "pareto"])
    p.add_argument("--scheduler", choices=["fedcure", "greedy", "fair", "random"])
    p.add_argument("--rounds", type=int, help="global rounds (edge-model arrivals)")
    p.add_argument("--clients", type=int)
    p.add_argument("--edges", type=int)
    p.add_argument("--partition", choices=["edge-noniid", "dirichlet", "iid", "shards"])
    p.add_argument("--executor", choices=["inprocess", "batched", "flower"],
                   help="who trains the clients: inprocess (one after another, default), "
                   "batched (a coalition's clients as one computation: same results "
                   "to float tolerance, fastest on a GPU), flower (Flower ClientApps on "
                   "virtual SuperNodes)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_const", const=False,
                   help="batched executor on a GPU: launch each step's kernels one by one "
                   "instead of replaying each edge round as a CUDA graph")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--tau-c", type=int,
                   help="local steps per edge round (epochs with --tau-c-unit epochs)")
    p.add_argument("--tau-c-unit", choices=["steps", "epochs"],
                   help="what --tau-c counts: mini-batch steps, or local epochs "
                   "(⌈|D_n|/batch size⌉ steps per client; inprocess and batched executors only)")
    p.add_argument("--tau-e", type=int, help="edge rounds per global round")
    p.add_argument("--max-concurrent", type=int, help="K, coalitions training at once")
    p.add_argument("--beta", type=float, help="β of the scheduling rule")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", default="results/simulate", help="folder for JSON and plots")
    p.add_argument("--lr", type=float, help="client learning rate")
    p.add_argument("--batch-size", type=int, help="client mini-batch size")
    p.add_argument("--momentum", type=float,
                   help="SGD momentum of local training, fresh every edge round "
                   "(inprocess and batched executors only)")
    p.add_argument("--ell", type=float, help="ℓ, the cloud's base mixing weight (ξ = ℓ·k^φ)")
    g = p.add_argument_group("the peers (with --method fedavg|hierfavg|fedbuff|fedat)")
    g.add_argument("--fraction", type=float, help="fedavg: C, clients sampled per round (0.1)")
    g.add_argument("--buffer-k", type=int, help="fedbuff: K, updates per server step (10)")
    g.add_argument("--concurrency", type=int,
                   help="fedbuff: clients training at once (default all)")
    g.add_argument("--server-lr", type=float, help="fedbuff: η_g, server learning rate (1.0)")
    g.add_argument("--tiers", type=int, help="fedat: latency tiers (5)")
    g.add_argument("--frequency", choices=["top", "fedcure"],
                   help="a peer's client CPU frequency: top (f_max, default) or fedcure "
                   "(Theorem 2)")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop at the first global round at or past this simulated time")
    p.add_argument("--eval-every-s", type=float, metavar="SECONDS",
                   help="evaluate every this many simulated seconds instead of --eval-every "
                   "rounds")
    add_device_option(p)
    p.add_argument("--workers", type=int,
                   help="worker processes training a coalition's clients in parallel "
                   "(default: number of cores; 1 = in this process; same results either way)")
    p.add_argument("--threads", type=int,
                   help="torch threads per process (default 1, or $FEDCURE_NUM_THREADS)")
    p.add_argument("--json", help="also write the result JSON here")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument("--dashboard", metavar="HOST:PORT",
                   help="serve the live view (web page, Prometheus /metrics) of the run here, "
                        "e.g. 127.0.0.1:8080 (in-process executor; another address than "
                        "loopback needs --dashboard-token)")
    p.add_argument("--dashboard-token", default=os.environ.get("FEDCURE_DASHBOARD_TOKEN", ""),
                   help="secret the live view asks of every request (default "
                        "$FEDCURE_DASHBOARD_TOKEN)")
    add_task_options(p)
    config_defaults_help(p, _OPTIONS)
    p.set_defaults(func=run)


#: ``fedcure_app.training.DEVICES``, spelled here so that building the parser imports no torch
#: (every ``fedcure`` command builds every sub-command's parser)
DEVICE_CHOICES: tuple[str, ...] = ("cpu", "cuda", "auto")


def add_device_option(p: argparse.ArgumentParser) -> None:
    """``--device {cpu,cuda,auto}`` (shared by ``simulate`` and ``experiment``)."""
    p.add_argument("--device", choices=list(DEVICE_CHOICES), default="cpu",
                   help="where clients train and the global model is evaluated; auto: a CUDA "
                   "GPU when torch sees one, else the CPU (results are not bit-identical "
                   "across devices)")


def checked_device(name: str):
    """The torch device of ``--device name``; :class:`UsageError` (one line) when CUDA is asked
    for and unavailable."""
    from fedcure_app.cli.errors import UsageError
    from fedcure_app.training import resolve_device

    try:
        return resolve_device(name)
    except ValueError as err:
        raise UsageError(str(err)) from None


def options_config(args: argparse.Namespace, options: dict[str, str],
                   extra: dict[str, Any] | None = None,
                   extra_flags: dict[str, str] | None = None) -> FedCureConfig:
    """The configuration of a command line: ``--config`` file (if any), then the ``--method``
    preset, then the options given (``options`` maps argparse dest → flat key) and ``extra``;
    ``formation``/``scheduler`` options go last so that they override the preset's.
    Errors (:class:`~fedcure_app.cli.errors.UsageError`) name the options and file keys the
    user wrote; ``extra_flags`` names the options behind ``extra``'s keys."""
    return checked_config(args, options, extra, extra_flags)


def config_from_args(args: argparse.Namespace) -> FedCureConfig:
    """The configuration: file (if any), then the method preset, then the explicit options,
    then the task of ``--task`` with the clients of ``--clients-data``."""
    return apply_task(options_config(args, _OPTIONS), args)


def _check_flower_knobs(cfg: FedCureConfig, args: argparse.Namespace) -> None:
    """:class:`UsageError` when ``--executor flower`` meets a knob its ClientApps ignore."""
    from fedcure_app.cli.errors import UsageError
    from fedcure_app.federation import simulation_only_knobs

    for flag in ("test_data", "init_model"):
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag.replace('_', '-')}: not supported with --executor "
                             "flower; use --executor inprocess or batched")
    clock_only = [flag for flag, on in ((f"--method {cfg.peers.peer}", cfg.peers.peer != "none"),
                                        ("--time-budget", cfg.run.time_budget_s is not None),
                                        ("--eval-every-s", cfg.run.eval_every_s is not None)) if on]
    if clock_only:
        raise UsageError(f"{', '.join(clock_only)}: runs on the simulated clock only; use "
                         "--executor inprocess or batched")
    bad = simulation_only_knobs(cfg)
    if bad:
        raise UsageError(f"{', '.join('--' + k for k in bad)}: not supported with --executor "
                         "flower (its ClientApps train τ_c plain-SGD steps); use --executor "
                         "inprocess or batched")
    if args.device != "cpu":
        raise UsageError("--device: the flower executor trains in its ClientApps on the CPU; "
                         "use --executor inprocess or batched")


def _run_on_flower(cfg: FedCureConfig, out: Path) -> dict[str, Any]:
    """The same run with real Flower ClientApps on virtual SuperNodes (Flower's Simulation
    Runtime, Ray); the ServerApp writes ``out/result.json`` and the plots itself."""
    from fedcure_app.flower.app_config import run_config_from_config
    from fedcure_app.flower.run import run_flower_simulation

    rc = run_config_from_config(cfg)
    rc["out-dir"] = str(out.resolve())
    return run_flower_simulation(rc)


def _test_dataset(cfg: FedCureConfig, args: argparse.Namespace) -> Any:
    """The clients' own data with ``--test-data`` as the test split (None without it: the
    engine loads the run's data itself)."""
    if getattr(args, "test_data", None) is None:
        return None
    from fedcure_app.data.own_federation import load_own_dataset

    return load_own_dataset(cfg.task, cfg.data.clients_data, holdout=cfg.data.holdout,
                            seed=cfg.run.seed, label_column=cfg.data.label_column,
                            test_data=args.test_data)


def _summary_table(result: dict[str, Any]):
    from rich.table import Table

    t = Table(title="FedCure simulation", show_header=False)
    acc = result["final_accuracy"]
    best = result["best_accuracy"]
    t.add_row("dataset", result["dataset"])
    t.add_row("rounds", str(result["rounds"]))
    where = " (federated)" if result.get("evaluation") == "federated" else ""
    t.add_row("final accuracy", f"{100 * acc:.2f} %{where}" if acc is not None else "-")
    t.add_row("best accuracy", f"{100 * best:.2f} %" if best is not None else "-")
    from fedcure_app.trained.names import class_rows

    for label, value in class_rows(result):
        t.add_row(label, value)
    if result.get("method"):  # a peer: no coalitions formed, no queues
        t.title = f"{result['method']} (peer) simulation"
        t.add_row("client steps", f"{result['client_steps']:,}")
        t.add_row("bytes on the cloud's links", f"{result['wan_bytes'] / 1e6:,.1f} MB")
    else:
        t.add_row("JSD initial → formed",
                  f"{result['initial_jsd']:.4f} → {result['formed_jsd']:.4f}")
    t.add_row("simulated time", f"{result['simulated_seconds']:.1f} s")
    t.add_row("latency COV", f"{result['latency_cov']:.3f}")
    t.add_row("energy", f"{result['energy_j']:.1f} J")
    share = ", ".join(f"{s:.2f}" for s in result["participation"]["share"])
    t.add_row("participation share", share)
    t.add_row("wall time", f"{result['wall_seconds']:.1f} s")
    return t


def run(args: argparse.Namespace) -> int:
    # the cheap checks first: a mistake is reported before torch is imported (seconds)
    cfg = config_from_args(args)
    if cfg.task is None:
        check_dataset(cfg.data.dataset, cfg.data.data_dir)
    check_out_dir(args.out)
    if args.json:
        check_new_file(args.json, "--json")
    if cfg.run.executor == "flower":
        _check_flower_knobs(cfg, args)
    from fedcure_app.runtime.threads import apply_thread_policy

    threads = apply_thread_policy(args.threads, where="fedcure simulate", export=True)
    device = checked_device(args.device)
    from fedcure_app.cli.own_data import init_arrays

    initial, dataset = init_arrays(cfg, args), _test_dataset(cfg, args)
    live = _start_dashboard(cfg, args)
    try:
        if live is not None and cfg.task is not None:
            # the clients' data read once, here rather than in the engine: the page names them
            from fedcure_app.data.own_federation import fitted_config, load_federation_data

            if dataset is None:
                dataset = load_federation_data(cfg)
            live[0].read_clients(fitted_config(cfg, dataset), dataset.client_names)
        return _simulate(cfg, args, threads, device, live, initial, dataset)
    finally:
        if live is not None:
            live[1].stop()


def _start_dashboard(cfg: FedCureConfig, args: argparse.Namespace):
    """The live view's feed and server, serving (None without ``--dashboard``); a bad
    address or one in use is a :class:`UsageError`."""
    if not getattr(args, "dashboard", None):
        return None
    from fedcure_app.cli.errors import UsageError
    from fedcure_app.live.server import DashboardError, LiveServer, check_bind
    from fedcure_app.live.simulation import SimulationFeed

    if cfg.run.executor == "flower":
        raise UsageError("--dashboard: the flower executor runs under Flower's Simulation "
                         "Runtime; use --executor inprocess to watch a simulation")
    try:
        host, port = check_bind(args.dashboard, args.dashboard_token)
    except DashboardError as err:
        raise UsageError(str(err)) from None
    feed = SimulationFeed(cfg, central_test=getattr(args, "test_data", None) is not None)
    server = LiveServer(feed, host, port, token=args.dashboard_token)
    try:
        server.start()
    except OSError as err:
        raise UsageError(f"--dashboard {args.dashboard}: cannot listen there "
                         f"({err.strerror or err})") from None
    return feed, server


def _simulate(cfg: FedCureConfig, args: argparse.Namespace, threads: int, device: Any,
              live: Any, initial: list | None = None, dataset: Any = None) -> int:
    """The run; ``initial``: the weights of ``--init-model``; ``dataset``: the clients' data
    when read already (``--test-data``, or the live view's names; None: the engine loads the
    run's data)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from fedcure_app.simulation.executors import resolve_workers
    from fedcure_app.simulation.engine import simulate
    from fedcure_app.run_plots import write_run_plots

    console = Console(stderr=True)
    if live is not None:
        console.print(f"live view: {live[1].url}; Prometheus: {live[1].url}metrics")
    workers = resolve_workers(args.workers)
    if getattr(args, "test_data", None) is not None and dataset is not None:
        console.print(f"[dim]central test set {args.test_data}: {dataset.test_size} test "
                      "samples[/]")
    if cfg.run.executor == "batched":
        console.print(f"[dim]batched executor: one process × {threads} torch "
                      f"thread{'s' if threads > 1 else ''} on {device}[/]")
    elif cfg.run.executor != "flower":
        console.print(f"[dim]{workers} worker process{'es' if workers > 1 else ''} × "
                      f"{threads} torch thread{'s' if threads > 1 else ''}[/]")
    final: list = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # every input checked above: nothing made before
    rounds = cfg.run.global_rounds
    state = {"acc": float("nan")}
    with Progress(
        TextColumn("[bold]round {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("sim {task.fields[sim]:.1f}s"),
        TextColumn("acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.no_progress,
        transient=False,
    ) as progress:
        task = progress.add_task("simulate", total=rounds, sim=0.0, acc="-")

        def on_round(row: dict[str, Any]) -> None:
            if row["accuracy"] is not None:
                state["acc"] = row["accuracy"]
            acc = "-" if state["acc"] != state["acc"] else f"{100 * state['acc']:.1f}%"
            progress.update(task, completed=row["round"], sim=row["time_s"], acc=acc)

        if cfg.run.executor == "flower":
            progress.stop()
            console.print("running on Flower's Simulation Runtime (virtual SuperNodes); "
                          "the ServerApp logs each round")
            result = _run_on_flower(cfg, out)
        else:
            result = simulate(cfg, on_round=on_round, workers=workers, device=device,
                              on_state=live[0].update if live is not None else None,
                              dataset=dataset, initial_arrays=initial, on_model=final.append)
            if live is not None:
                live[0].finish()
    paths = []
    if final:
        from fedcure_app.trained.files import model_info, run_task, write_model_files

        paths += write_model_files(out, final[0], run_task(cfg),
                                   model_info("fedcure simulate", result))
    paths.insert(0, out / "result.json")
    text = json.dumps(result, indent=1)
    paths[0].write_text(text)
    if args.json:
        jp = Path(args.json)
        jp.parent.mkdir(parents=True, exist_ok=True)
        jp.write_text(text)
        paths.append(jp)
    paths += write_run_plots(result, out)
    Console().print(_summary_table(result))
    Console().print(wrote_line(out, paths), soft_wrap=True, markup=False, highlight=False)
    return 0


def wrote_line(out: Path, paths: list[Path]) -> str:
    """``wrote OUT/: result.json, accuracy.png, …``: the files in ``out`` by name, any other
    (``--json`` elsewhere) by its full path after a ``;`` (printed without hard line breaks,
    so no path is cut in two)."""
    inside = [p.name for p in paths if p.parent == out]
    parts = [f"{out}{os.sep}: {', '.join(inside)}"] if inside else []
    parts += [str(p) for p in paths if p.parent != out]
    return "wrote " + "; ".join(parts)
