"""``fedcure testbed``: a deployment with real heterogeneity on one Linux machine (root).

    sudo fedcure testbed --out DIR [--edges 3 --clients 9] [--mix jetson-orin-nano*5,rpi4 |
        --profiles FILE] [--client-cores auto] [--dataset mnist --data-dir DIR]
        [--dashboard 127.0.0.1:8080 | --no-dashboard] [launch's options]

``fedcure launch`` (:mod:`fedcure_app.cli.launch`, whose code runs the roles here too) with each
role in a network namespace of its own: every client's link to the others is shaped (``tbf``)
to its device profile's uplink and downlink Mbit/s, every edge's to the configuration's
``edge-link-mbps``, and clients apply frequency directives with ``--cpufreq cgroup``: a CPU
quota that makes this host train at the profile's speed at the directed frequency
(:mod:`fedcure_app.devices.cgroup`; the host's one-core speed is measured once, here, before
any role starts). Devices: client i gets ``--profiles`` entry i, or ``--mix`` entry i (both
cycling), every profile slowed by one factor so that the clients' quotas fit this host
(``--client-cores``, :mod:`fedcure_app.testbed.scaling`). The cloud's live view is served on
this host's ``--dashboard`` address through a proxy in the cloud's namespace
(:mod:`fedcure_app.testbed.proxy`). Without root, or on a kernel that lacks namespaces, veths,
bridges or tbf, it says so in one line and exits 2 before it starts anything. It removes its
namespaces (and with them every veth, the bridge and the qdiscs), cgroups and processes on
normal exit, on error and on Ctrl-C, and at start those of an earlier run whose process is
gone. What it does not emulate: round-trip delay and loss (this kernel has no netem), thermal
throttling, memory size (docs/testbed.md).

Output as ``fedcure launch`` (``result.json``, plots, logs, work dirs), plus ``profiles.json``
(each client's device profile) and ``testbed.json`` (namespaces, addresses, link rates, the
host's speed, pids, exit codes).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fedcure_app.cli.errors import UsageError, config_defaults_help
from fedcure_app.cli.launch import _OPTIONS, DEFAULT_DASHBOARD, Site, add_run_options
from fedcure_app.cli.testbed_peer import add_peer_options, check_peer_options
from fedcure_app.config import FedCureConfig

log = logging.getLogger(__name__)

#: default device presets, dealt to the clients in id order (cycling): one slow device in six,
#: so that after formation, which mixes the initial edges' clients, a coalition that holds one
#: stays slow and the others hold none (a coalition is as slow as its slowest member). The
#: Orin Nano computes 7.7× as fast as the Pi 3 at f_max and the frequency rule keeps it near its
#: f_max (1.5 GHz): enough that the Pi's compute outweighs the messaging every edge round adds
#: (about 0.6 s per client on a 2-core host), so the coalitions' latencies stay apart
DEFAULT_MIX = "jetson-orin-nano*5,rpi3"
#: defaults of the run's configuration under ``fedcure testbed`` (a ``--config`` file or the
#: options override them): few enough rounds for about four minutes on a 2-core host, τ_c large
#: enough that the clients' compute, not the messaging, sets an edge round's length, one
#: coalition in flight (K = 1: any target share is reachable, and after round 0 one coalition's
#: clients have the host); a Dirichlet(0.5) label split and a learning rate of 0.05 so that the
#: 20 rounds visibly learn (the paper's edge non-IID split gives 9 clients on 3 edges only 6 of
#: the 10 digits, and at lr 0.01 the run ended at 27.8 %; the compose demo uses the same two)
TESTBED_DEFAULTS: dict[str, tuple[str, str, int | float | str]] = {
    # option dest: (configuration section, field, value)
    "rounds": ("run", "global_rounds", 20),
    "tau_c": ("method", "tau_c", 30),
    "tau_e": ("method", "tau_e", 2),
    "max_concurrent": ("method", "max_concurrent", 1),
    "partition": ("data", "partition", "dirichlet"),
    "lr": ("method", "lr", 0.05),
}
#: the deployment's messaging in the cloud's latency prior under ``fedcure testbed``, unless
#: ``--config`` sets it: ``bench/testbed.py``'s calibration on an idle 2-core host (seconds of
#: messaging per edge round; training samples of each client's own work per edge round). With
#: the paper's model alone (both 0) the prior sees only compute, 7.7× apart for the default
#: ``rpi3`` and Orin, and T̂ of the ``rpi3``'s coalition starts at several times its latency
TESTBED_MESSAGING: dict[str, float | int] = {
    "edge_round_overhead_s": 1.55,
    "edge_round_client_samples": 177,
}
#: default base of the run prefix (namespaces and cgroups are named <base><pid>-...)
DEFAULT_PREFIX_BASE = "fctb"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "testbed",
        help="run cloud, edges and clients in network namespaces with shaped links and "
             "CPU quotas from their device profiles (root)",
        description="fedcure launch with real heterogeneity: each role in its own network "
        "namespace, client links shaped to their profiles' Mbit/s, client CPU throttled by "
        "cgroup quotas to their profiles' speed at the directed frequency. Needs root.",
    )
    p.add_argument("--edges", type=int, default=3, help="edge servers (coalitions)")
    p.add_argument("--clients", type=int, default=9, help="client processes")
    add_run_options(p)
    p.add_argument("--cpufreq", choices=["cgroup", "emulate", "off"], default="cgroup",
                   help="how clients apply frequency directives (default cgroup: real CPU "
                        "quotas; emulate/off leave every client at this host's full speed)")
    devices = p.add_mutually_exclusive_group()
    devices.add_argument("--mix", default=DEFAULT_MIX,
                         help="device presets dealt to the clients in id order (client i gets "
                              "entry i, cycling; NAME*K repeats an entry K times) "
                              f"(default {DEFAULT_MIX})")
    devices.add_argument("--profiles", metavar="FILE",
                         help="JSON/TOML device profiles: client i gets entry i (cycling)")
    p.add_argument("--client-cores", default="auto", metavar="C|auto",
                   help="with --cpufreq cgroup: every profile is slowed by one common factor so "
                        "that the fastest client computes on C host cores at f_max (0 < C <= "
                        "1); auto: the largest factor <= 1 under which the clients' quotas "
                        "together fit this host's cores less half a core for the roles "
                        "(default auto)")
    p.add_argument("--host-samples-per-s", type=float, default=0.0, metavar="R",
                   help="this host's training samples/s on one core for the dataset's model "
                        "(default 0: measured at start)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX_BASE,
                   help="namespaces and cgroups are named <prefix><pid>-... (1-8 lowercase "
                        "letters)")
    p.add_argument("--dashboard", default=DEFAULT_DASHBOARD, metavar="HOST:PORT",
                   help="the cloud's live view (web page and Prometheus /metrics) on this "
                        f"host; default {DEFAULT_DASHBOARD}, or the next free port above it "
                        "(port 0: any free port); another address than loopback needs "
                        "--dashboard-token")
    p.add_argument("--dashboard-token", default=os.environ.get("FEDCURE_DASHBOARD_TOKEN", ""),
                   help="secret the live view asks of every request (default "
                        "$FEDCURE_DASHBOARD_TOKEN)")
    p.add_argument("--no-dashboard", action="store_true", help="no live view")
    add_peer_options(p)
    for action in p._actions:  # the testbed's own defaults, not the configuration's
        if action.dest in TESTBED_DEFAULTS:
            value = TESTBED_DEFAULTS[action.dest][2]
            action.help = f"{action.help} (default: {value}, unless --config sets it)"
    config_defaults_help(p, _OPTIONS)
    p.set_defaults(func=run, out="results/testbed")


def parse_mix(text: str) -> list[str]:
    """``--mix``'s presets in order: comma-separated names, ``NAME*K`` repeating one K times.
    Raises :class:`UsageError` naming an unknown preset or a bad count."""
    from fedcure_app.devices import PRESETS

    out: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        name, star, count = item.partition("*")
        name = name.strip()
        if star and not (count.strip().isdigit() and 1 <= int(count) <= 10_000):
            raise UsageError(f"--mix: {item!r}: NAME*K needs a whole K from 1 to 10000")
        if name not in PRESETS:
            raise UsageError(f"--mix: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        out.extend([name] * (int(count) if star else 1))
    return out


def client_profiles(cfg: FedCureConfig, mix: list[str] | None,
                    profiles_file: str | None) -> list[Any]:
    """Every client's device profile: ``profiles_file`` entry i, or ``mix`` entry i (both
    cycling)."""
    from fedcure_app.devices import PRESETS, load_profiles

    n = cfg.federation.num_clients
    if profiles_file:
        loaded = load_profiles(profiles_file)
        return [loaded[i % len(loaded)] for i in range(n)]
    assert mix
    return [PRESETS[mix[i % len(mix)]] for i in range(n)]


def client_cores_option(text: str) -> float | None:
    """``--client-cores``: None for ``auto``, else C in (0, 1]; :class:`UsageError` otherwise."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise UsageError(f"--client-cores must be auto or a number in (0, 1], got {text!r}")
    return value


def host_samples_per_s(cfg: FedCureConfig) -> float:
    """Samples/s this machine trains the dataset's model on one core (torch, one thread), per
    second of CPU time this process gets: what a CPU quota hands out. On a busy host wall-clock
    seconds would also count the waits for a core (one busy 2-core host measured 2 648 digits
    samples per wall second and 9 722 per CPU second)."""
    import time

    import torch

    from fedcure_app.data import load_dataset
    from fedcure_app.devices import calibrate_host
    from fedcure_app.models import build_model
    from fedcure_app.training import train_local

    ds = load_dataset(cfg.data.dataset, cfg.data.data_dir)
    x = torch.from_numpy(ds.x_train[:1024])
    y = torch.from_numpy(ds.y_train[:1024])
    model = build_model(ds.name, ds.num_classes)
    b = cfg.method.batch_size
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return calibrate_host(
            lambda steps: train_local(model, x, y, steps=steps, lr=0.01, batch_size=b, seed=0),
            samples_per_step=min(b, len(y)), clock=time.process_time)
    finally:
        torch.set_num_threads(threads)


class _NetnsStatus:
    """The cloud's ``Monitor.Status`` read through :mod:`fedcure_app.testbed.monitor` running in
    the cloud's namespace: the latest reply (None while the cloud does not answer)."""

    def __init__(self, netns: str, address: str, log_path: Path) -> None:
        from fedcure_app.runtime.processes import Child
        from fedcure_app.testbed.netns import in_netns

        self._last: str = "-"
        self._lock = threading.Lock()
        self.child = Child("monitor", in_netns(netns, [sys.executable, "-m",
                                                       "fedcure_app.testbed.monitor", address]),
                           log_path=log_path, on_line=self._line)

    def _line(self, line: str) -> None:
        with self._lock:
            self._last = line.strip()

    def __call__(self) -> Any:
        from fedcure_app.protocol import cloud_pb2 as pb

        with self._lock:
            line = self._last
        if not line or line == "-":
            return None
        try:
            reply = pb.StatusReply()
            reply.ParseFromString(base64.b64decode(line))
            return reply
        except Exception:  # noqa: BLE001 - a partial line: no news
            return None

    def close(self) -> None:
        self.child.stop(3.0)


_PORT_CHECK = ("import socket, sys\n"
               "try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5)\n"
               "except OSError:\n sys.exit(1)\n")


class NamespaceSite(Site):
    """Each role in its own network namespace with shaped links; clients under CPU quotas."""

    command = "testbed"
    mode = "testbed"

    def __init__(self, args: argparse.Namespace) -> None:
        from fedcure_app.testbed.plan import run_prefix

        self.args = args
        self.prefix = run_prefix(args.prefix, os.getpid())
        self.plan: Any = None
        self.host_sps: float | None = None
        #: cores other processes kept busy before the start (None: not measured)
        self.busy_cores: float | None = None
        self.profiles: list[Any] = []
        self.scaling: Any = None
        self.proxy: Any = None
        self.created = False

    def setup(self, cfg: FedCureConfig, out: Path) -> FedCureConfig:
        from fedcure_app.config import apply_flat
        from fedcure_app.testbed import netns
        from fedcure_app.testbed.plan import make_plan

        netns.clean_leftovers(self.args.prefix)
        mix = None if self.args.profiles else parse_mix(self.args.mix)
        self.profiles = client_profiles(cfg, mix, self.args.profiles)
        if self.args.cpufreq == "cgroup":
            from fedcure_app.testbed.hostload import measure_busy_cores, warn_oversubscribed

            cores = os.cpu_count() or 1
            self.busy_cores = measure_busy_cores(cores)
            if self.busy_cores is not None:
                log.info("other processes keep %.2f of this host's %d cores busy",
                         self.busy_cores, cores)
            self.host_sps = self.args.host_samples_per_s or host_samples_per_s(cfg)
            log.info("this host trains %s at %.0f samples/s on one core", cfg.data.dataset,
                     self.host_sps)
            self.profiles = self._scale(cfg.data.dataset)
            warn_oversubscribed(self.profiles, cfg.data.dataset, self.host_sps, cores,
                                busy_cores=self.busy_cores)
        path = out / "profiles.json"
        path.write_text(json.dumps([p.model_dump(mode="json") for p in self.profiles],
                                   indent=1))
        cfg = apply_flat(cfg, {"profiles-file": str(path), **messaging_defaults(self.args)})
        self.plan = make_plan(self.prefix, cfg.federation.num_edges, self.profiles,
                              cfg.devices.edge_link_mbps)
        self.created = True
        netns.create(self.plan)
        return cfg

    def _scale(self, model: str) -> list[Any]:
        """The profiles slowed to fit this host (``--client-cores``); warns when the slowest
        fall under the CPU actuator's smallest quota."""
        from fedcure_app.devices.cgroup import MIN_FRACTION
        from fedcure_app.testbed.scaling import scale_profiles

        assert self.host_sps is not None
        self.scaling = scale_profiles(self.profiles, model, self.host_sps,
                                      os.cpu_count() or 1,
                                      client_cores_option(self.args.client_cores))
        if self.scaling.below_floor:
            log.warning("after scaling, %s compute(s) on less than the smallest CPU quota "
                        "(%.1f %% of a core) and will run faster than their profiles; use "
                        "fewer clients or devices closer in speed",
                        ", ".join(self.scaling.below_floor), 100 * MIN_FRACTION)
        return list(self.scaling.profiles)

    def dashboard(self, address: str, logs: Path) -> tuple[str, str]:
        """The cloud serves its live view on its own namespace's loopback; a proxy in that
        namespace (:mod:`fedcure_app.testbed.proxy`) holds the host's listening socket."""
        import socket

        from fedcure_app.live.server import dashboard_address
        from fedcure_app.live.server import parse_address
        from fedcure_app.runtime.processes import Child
        from fedcure_app.testbed.netns import in_netns

        shown = dashboard_address(address)
        host, port = parse_address(shown)
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(64)
            inside = f"127.0.0.1:{port}"  # the cloud's namespace holds nothing else but its port
            fd = listener.fileno()
            self.proxy = Child("dashboard-proxy", in_netns(self.plan.cloud.netns, [
                sys.executable, "-m", "fedcure_app.testbed.proxy", str(fd), inside]),
                log_path=logs / "dashboard-proxy.log", pass_fds=(fd,))
        finally:
            listener.close()
        return inside, shown

    def _node(self, role: str) -> Any:
        return next(n for n in self.plan.nodes() if n.role == role)

    def host(self, role: str) -> str:
        return self._node(role).address

    def wrap(self, role: str, argv: list[str]) -> list[str]:
        from fedcure_app.testbed.netns import in_netns

        return in_netns(self._node(role).netns, argv)

    def client_args(self, index: int) -> list[str]:
        if self.args.cpufreq != "cgroup":
            return []
        return ["--host-samples-per-s", f"{self.host_sps:.6g}", "--cgroup-prefix", self.prefix]

    def port_open(self, role: str, host: str, port: int) -> bool:
        from fedcure_app.testbed.netns import in_netns

        argv = in_netns(self._node(role).netns,
                        [sys.executable, "-c", _PORT_CHECK, host, str(port)])
        return subprocess.run(argv, capture_output=True).returncode == 0

    def status_poller(self, address: str, tls_dir: str | None) -> Any:
        return _NetnsStatus(self.plan.cloud.netns, address,
                            Path(self.args.out).resolve() / "logs" / "monitor.log")

    def summary_rows(self) -> list[tuple[str, str]]:
        sc = self.scaling
        if sc is None:
            return []
        return [("device speeds", scaling_text(sc, self.host_sps or 0.0, os.cpu_count() or 1))]

    def teardown(self) -> None:
        from fedcure_app.devices.cgroup import remove_cgroups
        from fedcure_app.testbed import netns

        if self.proxy is not None:
            self.proxy.stop(3.0)
        if self.created:
            netns.destroy(self.prefix)
            remove_cgroups(f"{self.prefix}-")

    def record(self) -> dict[str, Any]:
        plan, sc = self.plan, self.scaling
        return {
            "prefix": self.prefix, "host_samples_per_s": self.host_sps,
            "busy_cores_before": self.busy_cores,
            "cpufreq": self.args.cpufreq,
            "scaling": None if sc is None else {
                "factor": sc.factor, "client_cores": list(sc.cores),
                "total_cores": sc.total_cores, "below_floor": list(sc.below_floor)},
            "nodes": [] if plan is None else [
                {"role": n.role, "netns": n.netns, "address": n.address,
                 "up_mbps": n.up_mbps, "down_mbps": n.down_mbps,
                 **({"profile": self.profiles[int(n.role[6:])].name}
                    if n.role.startswith("client") else {})}
                for n in plan.nodes()],
        }


def scaling_text(sc: Any, host_sps: float, host_cores: int) -> str:
    """One line on how the profiles were scaled: the factor, each device's share of a host
    core at f_max, the total against the host's cores."""
    shares: dict[str, float] = {}
    for p, c in zip(sc.profiles, sc.cores):
        shares.setdefault(p.name, c)
    each = ", ".join(f"{n} {c:.2f}" for n, c in sorted(shares.items(), key=lambda kv: kv[1]))
    how = "as profiled" if sc.factor == 1.0 else f"profiles × {sc.factor:.3g}"
    return (f"{how}: host cores at f_max {each}; {sc.total_cores:.2f} of {host_cores} "
            f"together (host {host_sps:.0f} samples/s on one core)")


def check_testbed_inputs(args: argparse.Namespace) -> None:
    """The testbed's own options (raises :class:`UsageError`), before anything is made."""
    from fedcure_app.devices import ProfileError, load_profiles
    from fedcure_app.testbed.plan import run_prefix

    try:
        run_prefix(args.prefix, 1)
    except ValueError as err:
        raise UsageError(f"--prefix: {err}") from None
    if not (0 <= args.host_samples_per_s < float("inf")):
        raise UsageError("--host-samples-per-s must be a finite number >= 0 (0: measure)")
    client_cores_option(args.client_cores)
    if args.profiles:
        try:
            load_profiles(args.profiles)
        except ProfileError as err:
            raise UsageError(f"--profiles: {err}") from None
    else:
        parse_mix(args.mix)


def set_by_config(args: argparse.Namespace) -> dict[str, set[str]]:
    """Section → the fields the ``--config`` file sets (empty without one)."""
    from fedcure_app.cli.errors import load_file

    if not args.config:
        return {}
    given = load_file(args.config)
    return {name: set(section.model_fields_set) for name in type(given).model_fields
            if (section := getattr(given, name)) is not None}  # an optional section (task)


def apply_testbed_defaults(args: argparse.Namespace) -> None:
    """Fill in :data:`TESTBED_DEFAULTS` for the options neither given nor set by ``--config``."""
    given = set_by_config(args)
    for dest, (section, key, value) in TESTBED_DEFAULTS.items():
        if getattr(args, dest) is None and key not in given.get(section, set()):
            setattr(args, dest, value)


def messaging_defaults(args: argparse.Namespace) -> dict[str, float | int]:
    """:data:`TESTBED_MESSAGING` as configuration keys, less those ``--config`` sets."""
    given = set_by_config(args).get("devices", set())
    return {key.replace("_", "-"): value for key, value in TESTBED_MESSAGING.items()
            if key not in given}


def run(args: argparse.Namespace) -> int:
    from fedcure_app.cli import launch
    from fedcure_app.devices.cgroup import CgroupError, find_cpu_controller
    from fedcure_app.testbed import netns

    check_testbed_inputs(args)
    check_peer_options(args)
    apply_testbed_defaults(args)
    launch.check_inputs(args, launch.config_from_args(args))  # the user's mistakes first
    problem = netns.kernel_problem(f"{args.prefix}{os.getpid()}")
    if problem is None and args.cpufreq == "cgroup":
        try:
            find_cpu_controller()
        except CgroupError as err:
            problem = f"no writable cgroup CPU controller ({err.strerror or err})"
    if problem:
        print(f"fedcure testbed: error: {problem}", file=sys.stderr)
        return 2
    if args.peer:
        from fedcure_app.cli import testbed_peer

        return testbed_peer.run(args, NamespaceSite)
    return launch.run(args, NamespaceSite(args))


__all__ = ["DEFAULT_MIX", "NamespaceSite", "TESTBED_DEFAULTS", "TESTBED_MESSAGING",
           "apply_testbed_defaults", "messaging_defaults", "set_by_config",
           "client_cores_option", "client_profiles", "host_samples_per_s", "parse_mix",
           "register", "run", "scaling_text"]
