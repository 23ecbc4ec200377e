"""``fedcure launch``: the three deployment roles as separate OS processes on 127.0.0.1.

    fedcure launch --edges 2 --clients 6 --rounds 10 --dataset digits --out DIR [options]

The twin of the docker compose file for machines without Docker: one ``fedcure-cloud``, M
``fedcure-edge`` (each with its own Flower SuperLink) and N ``fedcure-client`` (each with its own
Flower SuperNode), all on free loopback ports, talking plaintext gRPC/HTTP on 127.0.0.1 (or TLS
with ``--tls-dir``, a folder written by ``fedcure certs``). It waits for the run to finish, shows
the progress from the cloud's ``Monitor.Status``, and leaves in ``--out``:

- ``result.json``, plots, ``final_model.safetensors``, ``model.pt``/``.pt2`` (by the cloud);
- ``config.json`` (the configuration every role used), ``launch.json`` (ports, pids, exit codes);
- ``logs/cloud.log``, ``logs/edge<M>.log``, ``logs/client<I>.log``;
- ``work/edge<M>/`` (SuperLink home and logs) and ``work/client<I>/`` (data file, SuperNode log,
  applied directives).

Every process it starts is stopped by PID at the end, on failure, and on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcure_app.cli.errors import (
    UsageError,
    at_least,
    check_dataset,
    check_out_dir,
    config_defaults_help,
    load_file,
)
from fedcure_app.cli.launch_report import (
    WarningLines,
    add_warnings,
    coalition_table,
    demonstrated_table,
    print_flower,
    report_failure,
    summary_table,
)
from fedcure_app.cli.launch_wait import StatusPoller, phase_label, progress_line, progress_text
from fedcure_app.cli.launch_wait import status_text, supervise, wait_edge_ready
from fedcure_app.cli.launch_wait import wait_listening as _wait_listening
from fedcure_app.cli.own_data import add_task_options, apply_task, cloud_flags, init_arrays
from fedcure_app.config import METHOD_PRESETS, FedCureConfig, apply_flat

log = logging.getLogger(__name__)

#: default shortest task deadline under launch (s)
LAUNCH_DEADLINE_MIN_S = 120.0
#: without --eval-every, a launch evaluates the global model about this many times (plus the
#: initial model), so that even a short run draws an accuracy curve
LAUNCH_EVALUATIONS = 10

#: where the live view goes unless told otherwise (or the next free port above it)
DEFAULT_DASHBOARD = "127.0.0.1:8080"

#: launch option -> flat configuration key
_OPTIONS: dict[str, str] = {
    "dataset": "dataset", "data_dir": "data-dir", "rounds": "global-rounds",
    "clients": "num-clients", "edges": "num-edges", "seed": "seed", "partition": "partition",
    "eval_every": "eval-every", "tau_c": "tau-c", "tau_e": "tau-e",
    "max_concurrent": "max-concurrent", "lr": "lr", "beta": "beta", "formation": "formation",
    "scheduler": "scheduler", "max_client_weight": "max-client-weight",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="run cloud, edges and clients as separate processes on this machine",
        description="Start fedcure-cloud, --edges fedcure-edge and --clients fedcure-client "
        "processes on 127.0.0.1, wait for the run, collect logs and results in --out.",
    )
    p.add_argument("--edges", type=int, required=True, help="edge servers (coalitions)")
    p.add_argument("--clients", type=int, help="client processes (required; with --task: "
                   "the entries of --clients-data)")
    p.add_argument("--max-clients", type=int, metavar="N", help="with --clients-data: launch "
                   "up to N entries (default: as many as the available memory holds)")
    add_run_options(p)
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                   help="where every client trains (fedcure-client --device; default cpu)")
    p.add_argument("--cpufreq", choices=["emulate", "sysfs", "off"], default="emulate",
                   help="how clients apply frequency directives (default emulate)")
    p.add_argument("--tls-dir", help="folder from `fedcure certs` (ca.crt, server.crt/key): "
                   "TLS everywhere instead of plaintext")
    p.add_argument("--supernode-auth", action="store_true",
                   help="edges admit only the SuperNodes of their assigned clients (Flower "
                        "SuperNode authentication; needs --tls-dir)")
    p.add_argument("--dashboard", default=DEFAULT_DASHBOARD, metavar="HOST:PORT",
                   help="the cloud's live view (web page and Prometheus /metrics); default "
                        f"{DEFAULT_DASHBOARD}, or the next free port above it (port 0: any "
                        "free port); another address than loopback needs --dashboard-token")
    p.add_argument("--dashboard-token", default=os.environ.get("FEDCURE_DASHBOARD_TOKEN", ""),
                   help="secret the live view asks of every request (default "
                        "$FEDCURE_DASHBOARD_TOKEN)")
    p.add_argument("--no-dashboard", action="store_true", help="no live view")
    config_defaults_help(p, _OPTIONS)
    p.set_defaults(func=run)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options ``fedcure launch`` shares with ``fedcure testbed``: the run's configuration,
    ``--out``, the token, timeouts, threads, progress."""
    p.add_argument("--rounds", type=int, help="global rounds")
    p.add_argument("--dataset", choices=["digits", "mnist", "cifar10", "svhn", "cinic10"])
    p.add_argument("--data-dir", help="directory holding the dataset files "
                   "(default: $FEDCURE_DATA_DIR, else ./data)")
    add_task_options(p)
    p.add_argument("--out", default="results/launch",
                   help="folder for results, logs and work dirs")
    p.add_argument("--config", help="TOML/JSON configuration file (options override it)")
    p.add_argument("--method", choices=list(METHOD_PRESETS),
                   help="one of the paper's methods: sets --formation and --scheduler "
                   "(default: none, those two options decide)")
    p.add_argument("--formation", choices=["fedcure", "none", "kmeans", "meanshift",
                                           "selfish", "pareto"])
    p.add_argument("--scheduler", choices=["fedcure", "greedy", "fair", "random"])
    p.add_argument("--partition", choices=["edge-noniid", "dirichlet", "iid", "shards"])
    p.add_argument("--tau-c", type=int, help="local steps per edge round")
    p.add_argument("--tau-e", type=int, help="edge rounds per global round")
    p.add_argument("--max-concurrent", type=int, help="K, coalitions training at once")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--beta", type=float)
    p.add_argument("--eval-every", type=int,
                   help="evaluate the global model every N global rounds (default: about "
                   f"{LAUNCH_EVALUATIONS} times a run, ⌈rounds/{LAUNCH_EVALUATIONS}⌉)")
    p.add_argument("--seed", type=int)
    p.add_argument("--token", default=os.environ.get("FEDCURE_TOKEN", ""),
                   help="shared secret for every role (default $FEDCURE_TOKEN)")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="stop everything after this many seconds (0: no limit)")
    p.add_argument("--register-timeout", type=float, default=300.0,
                   help="the cloud's registration window (s)")
    p.add_argument("--deadline-min", type=float,
                   help="shortest task deadline (s) before the cloud gives up on a coalition "
                        f"(default {LAUNCH_DEADLINE_MIN_S:.0f}: Flower starts one process per "
                        "message, slow on a shared host)")
    p.add_argument("--max-client-weight", type=float, metavar="W",
                   help="the largest share of its coalition's FedAvg weight one client may "
                        "take, whatever count it registered (default 0.5; 1: plain FedAvg)")
    p.add_argument("--edge-timeout", type=float, default=0.0, metavar="S",
                   help="per edge round reply deadline: a client that has not answered within "
                        "S seconds is dropped from the round (0: wait for every client)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per ClientApp (OMP_NUM_THREADS; default 1: many "
                        "clients share this host)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")


def config_from_args(args: argparse.Namespace) -> FedCureConfig:
    """The run's configuration: file (if any), then the method preset, then the options."""
    from fedcure_app.cli.simulate import options_config

    extra: dict[str, Any] = {}
    flags: dict[str, str] = {}
    if args.deadline_min is not None:
        extra["deadline-min-s"] = args.deadline_min
        flags["deadline-min-s"] = "--deadline-min"
    elif not (args.config and "deadline_min_s" in load_file(args.config).reliability
              .model_fields_set):
        extra["deadline-min-s"] = LAUNCH_DEADLINE_MIN_S
    if args.clients is None and getattr(args, "task", None) is None:
        raise UsageError("--clients N is required (or --task with --clients-data)")
    cfg = apply_task(options_config(args, _OPTIONS, extra, flags), args)
    if args.eval_every is None and not (
            args.config and "eval_every" in load_file(args.config).run.model_fields_set):
        every = max(1, -(-cfg.run.global_rounds // LAUNCH_EVALUATIONS))
        cfg = apply_flat(cfg, {"eval-every": every})
    return cfg


def check_inputs(args: argparse.Namespace, cfg: FedCureConfig) -> None:
    """Every check on the command line that needs no process: raises
    :class:`~fedcure_app.cli.errors.UsageError` (one line naming the option) before anything is
    created or started."""
    at_least(args, "threads", 1)
    at_least(args, "timeout", 0)
    at_least(args, "register_timeout", 0, strict=True)
    at_least(args, "edge_timeout", 0)
    tls_dir = getattr(args, "tls_dir", None)
    if getattr(args, "supernode_auth", False) and not tls_dir:
        raise UsageError("--supernode-auth needs --tls-dir (Flower authenticates SuperNodes "
                         "only over TLS); make one with `fedcure certs`")
    if tls_dir:
        try:
            _security_flags(tls_dir, "edge")
        except FileNotFoundError as err:
            raise UsageError(str(err)) from None
    if not getattr(args, "no_dashboard", True):
        from fedcure_app.live.server import DashboardError, check_bind

        try:
            check_bind(args.dashboard, args.dashboard_token)
        except DashboardError as err:
            raise UsageError(str(err)) from None
    if cfg.task is None:
        check_dataset(cfg.data.dataset, cfg.data.data_dir)
    else:  # one client process tree per --clients-data entry: as many as memory holds
        from fedcure_app.runtime.launch_memory import available_bytes, clients_refusal

        at_least(args, "max_clients", 1)
        if why := clients_refusal(cfg.federation.num_clients, available_bytes(),
                                  getattr(args, "max_clients", None)):
            raise UsageError(why)
    check_out_dir(args.out)
    init_arrays(cfg, args)  # a model that does not fit the task, refused before any start


class Site:
    """Where a deployment's roles run; this one: every role on 127.0.0.1 of this machine
    (``fedcure launch``). ``fedcure testbed`` (:mod:`fedcure_app.cli.testbed`) puts each role in
    a network namespace of its own instead, overriding these hooks."""

    #: the command's name (messages, the summary's title); the live page's mode for the run
    command, mode = "launch", "deployment"

    def setup(self, cfg: FedCureConfig, out: Path) -> FedCureConfig:
        """Prepare the site before any role starts; returns the configuration the roles use."""
        return cfg

    def host(self, role: str) -> str:
        """The address ``role`` (``cloud``, ``edge<m>``) listens on."""
        return "127.0.0.1"

    def wrap(self, role: str, argv: list[str]) -> list[str]:
        """``role``'s command line as started (``client<i>`` too)."""
        return argv

    def client_args(self, index: int) -> list[str]:
        """Extra ``fedcure-client`` options of client ``index``."""
        return []

    def port_open(self, role: str, host: str, port: int) -> bool:
        """Whether ``role``'s ``host:port`` accepts connections."""
        from fedcure_app.runtime.processes import port_open

        return port_open(host, port)

    def dashboard(self, address: str, logs: Path) -> tuple[str, str]:
        """The live view for the user's ``--dashboard`` ``address``: (where the cloud serves
        it, where the user reaches it). Here both are ``address``'s port or the next free one."""
        from fedcure_app.live.server import dashboard_address

        dash = dashboard_address(address)
        return dash, dash

    def summary_rows(self) -> list[tuple[str, str]]:
        """Rows the site adds to the end-of-run summary (label, value)."""
        return []

    def status_poller(self, address: str, tls_dir: str | None) -> Any:
        """A callable returning the cloud's ``Monitor.Status`` (None while unreachable), with
        ``close()``."""
        return StatusPoller(address, tls_dir)

    def teardown(self) -> None:
        """Undo :meth:`setup` after every role has stopped (also on error and Ctrl-C)."""

    def record(self) -> dict[str, Any]:
        """What the site adds to the run's record (``<command>.json``)."""
        return {}


@dataclass
class Roles:
    """The processes of one launch."""

    cloud: Any = None
    edges: list[Any] = field(default_factory=list)
    clients: list[Any] = field(default_factory=list)

    def all(self) -> list[Any]:
        return [c for c in [self.cloud, *self.edges, *self.clients] if c is not None]

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop clients, then edges, then the cloud (each with what it started); every role
        stops its own children on SIGTERM within ``grace_s``, or is killed with them."""
        for group in (self.clients, self.edges, [self.cloud] if self.cloud else []):
            threads = [threading.Thread(target=c.stop, args=(grace_s,)) for c in group]
            for t in threads:
                t.start()
            for t in threads:
                t.join()


def _security_flags(tls_dir: str | None, role: str) -> list[str]:
    if not tls_dir:
        return ["--insecure"]
    d = Path(tls_dir).resolve()
    for name in ("ca.crt", "server.crt", "server.key"):
        if not (d / name).is_file():
            raise FileNotFoundError(f"--tls-dir {d} lacks {name} (write it with `fedcure certs`)")
    if role == "cloud":
        return ["--tls-cert", str(d / "server.crt"), "--tls-key", str(d / "server.key")]
    if role == "edge":
        return ["--tls-ca", str(d / "ca.crt"), "--tls-cert", str(d / "server.crt"),
                "--tls-key", str(d / "server.key")]
    return ["--tls-ca", str(d / "ca.crt")]


def start_roles(cfg: FedCureConfig, args: argparse.Namespace, out: Path, roles: Roles,
                site: Site | None = None) -> dict[str, Any]:
    """Start cloud, edges (each serving its SuperLink) and clients, in that order, where ``site``
    says (default: all on 127.0.0.1); return the launch record."""
    from fedcure_app.data.names import client_name
    from fedcure_app.data.own import client_entries
    from fedcure_app.data.model_consent import own_clients_consent
    from fedcure_app.runtime.processes import Child, free_port, free_ports

    logs, work = out / "logs", out / "work"
    logs.mkdir(parents=True, exist_ok=True)
    config_file = out / "config.json"
    config_file.write_text(cfg.model_dump_json(by_alias=True, indent=1))
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(args.threads),
               GRPC_VERBOSITY=os.environ.get("GRPC_VERBOSITY", "NONE"))
    py = sys.executable
    token = ["--token", args.token] if args.token else []
    auth = ["--supernode-auth"] if getattr(args, "supernode_auth", False) else []
    tls_dir = getattr(args, "tls_dir", None)
    if auth and not tls_dir:
        raise ValueError("--supernode-auth needs --tls-dir (Flower authenticates SuperNodes "
                         "only over TLS); make one with `fedcure certs`")
    site = site or Site()
    m, n = cfg.federation.num_edges, cfg.federation.num_clients
    cloud_port = free_port()
    cloud_addr = f"{site.host('cloud')}:{cloud_port}"
    record: dict[str, Any] = {"cloud": cloud_addr, "edges": {}, "clients": {}}
    argv = [py, "-m", "cloud_server.cli", "--listen", cloud_addr, "--expected-clients", str(n),
            "--edges", str(m), "--rounds", str(cfg.run.global_rounds), "--config",
            str(config_file), "--out", str(out), "--register-timeout",
            str(args.register_timeout), *token, *_security_flags(tls_dir, "cloud"),
            *cloud_flags(args)]
    cloud_env = env
    if not getattr(args, "no_dashboard", True):
        dash, shown = site.dashboard(args.dashboard, logs)
        argv += ["--dashboard", dash, "--dashboard-mode", site.mode]
        # the token through the environment, not the command line others can read
        cloud_env = dict(env, FEDCURE_DASHBOARD_TOKEN=args.dashboard_token)
        record["dashboard"] = f"http://{shown}/"
    roles.cloud = Child("cloud", site.wrap("cloud", argv), log_path=logs / "cloud.log",
                        env=cloud_env)
    record["pids"] = {"cloud": roles.cloud.pid}
    _wait_listening(roles.cloud, site, site.host("cloud"), cloud_port)
    edge_ports = free_ports(m)
    for e, port in enumerate(edge_ports):
        host = site.host(f"edge{e}")
        argv = [py, "-m", "edge_server.cli", "--cloud", cloud_addr, "--edge-id", str(e),
                "--listen", f"{host}:{port}", "--work-dir", str(work / f"edge{e}"),
                "--edge-timeout", str(getattr(args, "edge_timeout", 0.0)), *token,
                *_security_flags(tls_dir, "edge"), *auth]
        child = Child(f"edge{e}", site.wrap(f"edge{e}", argv), log_path=logs / f"edge{e}.log",
                      env=env)
        roles.edges.append(child)
        record["edges"][e] = f"{host}:{port}"
        record["pids"][f"edge{e}"] = child.pid
    for e, child in enumerate(roles.edges):  # ready before the clients' start-up takes the CPU
        wait_edge_ready(child, site, site.host(f"edge{e}"), edge_ports[e],
                        work / f"edge{e}" / "serverapp.log")
    own = client_entries(cfg.data.clients_data) if cfg.task is not None else None
    consent, env = own_clients_consent(cfg.task, env)  # one owner runs every role here
    for i in range(n):
        data = ["--data", str(own[i].resolve())] if own else ["--num-partitions", str(n)]
        name = client_name(own[i]) if own else f"client-{i}"  # own data: its entry's name
        argv = [py, "-m", "client.cli", "--cloud", cloud_addr, "--name", name,
                "--partition-id", str(i), *data, *consent, "--cpufreq", args.cpufreq,
                *(["--device", args.device] if getattr(args, "device", "cpu") != "cpu" else []),
                "--work-dir", str(work / f"client{i}"), *token,
                *_security_flags(tls_dir, "client"), *auth, *site.client_args(i)]
        child = Child(f"client{i}", site.wrap(f"client{i}", argv),
                      log_path=logs / f"client{i}.log", env=env)
        child.client_name = name  # what its refusal line calls it (report_refused)
        roles.clients.append(child)
        record["pids"][f"client{i}"] = child.pid
        record["clients"][i] = {"name": name, "partition": i,
                                "data": data[1] if own else None,
                                "work_dir": str(work / f"client{i}"),
                                "log": str(logs / f"client{i}.log")}
    return record



def run(args: argparse.Namespace, site: Site | None = None) -> int:
    """Run a deployment where ``site`` says (default: ``fedcure launch``, all on 127.0.0.1);
    ``site.setup`` runs after the checks, ``site.teardown`` after every role stopped, also on
    error and Ctrl-C. Every warning it logs meanwhile goes into ``result.json``'s ``warnings``
    too."""
    site = site or Site()
    cfg = config_from_args(args)
    check_inputs(args, cfg)
    caught = WarningLines()
    logging.getLogger().addHandler(caught)
    try:
        return _run(args, site, cfg, caught)
    finally:
        logging.getLogger().removeHandler(caught)


def _run(args: argparse.Namespace, site: Site, cfg: FedCureConfig,
         caught: WarningLines) -> int:
    from rich.console import Console

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").unlink(missing_ok=True)
    console = Console(stderr=True)
    stop = threading.Event()
    previous = {}

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, on_signal)
    roles = Roles()
    record: dict[str, Any] = {}
    status = None
    code, reason = 1, "failed to start"
    started = time.monotonic()
    print_flower(console)
    try:
        try:
            cfg = site.setup(cfg, out)
            record = start_roles(cfg, args, out, roles, site)
        except RuntimeError as err:  # a role failed at start: its log's last line says why
            reason = str(err).splitlines()[0].rstrip(":; ")
            last = [ln for ln in str(err).splitlines()[1:] if ln.strip()]
            if last:
                reason = reason.replace(" at start; its log ends with", " at start") + \
                    f": {last[-1].strip()}"
            code = 2 if "exited with code 2" in reason else 1
            return report_failure(out, reason, code, tail="", command=site.command)
        console.print(f"cloud {record['cloud']}, {len(roles.edges)} edges, "
                      f"{len(roles.clients)} clients started; logs in {out / 'logs'}")
        if record.get("dashboard"):
            console.print(f"live view: {record['dashboard']}"
                          + ("  (add ?token=… or send Authorization: Bearer …)"
                             if args.dashboard_token else "")
                          + f"; Prometheus: {record['dashboard']}metrics")
        status = site.status_poller(record["cloud"], getattr(args, "tls_dir", None))
        code, reason = supervise(roles, status, cfg.run.global_rounds, args, stop,
                                 result_path=out / "result.json")
        if code == 0:
            # edges and clients end on their own once the cloud is done
            end = time.monotonic() + 60.0
            for child in [*roles.edges, *roles.clients]:
                if child.wait(max(0.0, end - time.monotonic())) is None:
                    log.warning("%s did not exit on its own; stopping it", child.name)
    finally:
        if status is not None:
            status.close()
        roles.stop()
        site.teardown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        record["exit_codes"] = {c.name: c.proc.returncode for c in roles.all()}
        record["wall_seconds"] = time.monotonic() - started
        record["reason"] = reason
        record.update(site.record())
        (out / f"{site.command}.json").write_text(json.dumps(record, indent=1, default=str))
    failed = {k: v for k, v in record["exit_codes"].items() if v not in (0, None)}
    result_path = out / "result.json"
    if code == 0 and result_path.is_file():
        result = add_warnings(result_path, caught.lines, site.command)
        console.print(summary_table(result, site.command, site.summary_rows()))
        # not cut to 80 columns when written to a file or pipe
        wide = console if console.is_terminal else Console(stderr=True, width=160)
        wide.print(coalition_table(result), demonstrated_table(result), sep="\n")
        if failed:
            console.print(f"[yellow]roles that exited with an error: {failed} "
                          f"(see {out / 'logs'})")
        console.print(f"results in {out}")
        return 0
    tail = roles.cloud.tail() if roles.cloud is not None else ""
    return report_failure(out, reason, code, tail if code not in (0, 130) else "",
                           command=site.command)


#: the names the two halves had here before (re-exported)
_summary, _coalition_table, _report_failure = summary_table, coalition_table, report_failure

__all__ = ["Site", "StatusPoller", "WarningLines", "add_run_options", "add_warnings",
           "config_from_args", "phase_label", "progress_line", "progress_text", "register",
           "run", "start_roles", "status_text", "supervise"]
