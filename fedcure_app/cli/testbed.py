"""``fedcure testbed``: a deployment with real heterogeneity on one Linux machine (root).

    sudo fedcure testbed --out DIR [--edges 3 --clients 6] [--mix rpi4,jetson-nano,laptop |
        --profiles FILE] [--dataset mnist --data-dir DIR] [launch's options]

``fedcure launch`` (:mod:`fedcure_app.cli.launch`, whose code runs the roles here too) with each
role in a network namespace of its own: every client's link to the others is shaped (``tbf``)
to its device profile's uplink and downlink Mbit/s, every edge's to the configuration's
``edge-link-mbps``, and clients apply frequency directives with ``--cpufreq cgroup``: a CPU
quota that makes this host train at the profile's speed at the directed frequency
(:mod:`fedcure_app.devices.cgroup`; the host's one-core speed is measured once, here, before
any role starts). Devices: client i gets ``--profiles`` entry i (cycling), or, by default, the
``--mix`` preset of its initial edge (edge m gets entry m of the mix, cycling), so that the
initial coalitions differ in speed. Without root, or on a kernel that lacks namespaces, veths,
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
from fedcure_app.cli.launch import _OPTIONS, Site, add_run_options
from fedcure_app.config import FedCureConfig

log = logging.getLogger(__name__)

#: default device presets, one per initial edge (cycling)
DEFAULT_MIX = ("rpi4", "jetson-nano", "laptop")
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
    p.add_argument("--clients", type=int, default=6, help="client processes")
    add_run_options(p)
    p.add_argument("--cpufreq", choices=["cgroup", "emulate", "off"], default="cgroup",
                   help="how clients apply frequency directives (default cgroup: real CPU "
                        "quotas; emulate/off leave every client at this host's full speed)")
    devices = p.add_mutually_exclusive_group()
    devices.add_argument("--mix", default=",".join(DEFAULT_MIX),
                         help="device presets, comma-separated: initial edge m's clients get "
                              f"entry m (cycling) (default {','.join(DEFAULT_MIX)})")
    devices.add_argument("--profiles", metavar="FILE",
                         help="JSON/TOML device profiles: client i gets entry i (cycling)")
    p.add_argument("--host-samples-per-s", type=float, default=0.0, metavar="R",
                   help="this host's training samples/s on one core for the dataset's model "
                        "(default 0: measured at start)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX_BASE,
                   help="namespaces and cgroups are named <prefix><pid>-... (1-8 lowercase "
                        "letters)")
    config_defaults_help(p, _OPTIONS)
    p.set_defaults(func=run, out="results/testbed")


def client_profiles(cfg: FedCureConfig, mix: list[str] | None,
                    profiles_file: str | None) -> list[Any]:
    """Every client's device profile: ``profiles_file`` entry i, or the ``mix`` preset of the
    client's initial edge."""
    from fedcure_app.devices import PRESETS, load_profiles

    n = cfg.federation.num_clients
    if profiles_file:
        loaded = load_profiles(profiles_file)
        return [loaded[i % len(loaded)] for i in range(n)]
    from fedcure_app.federation import partition_for
    from fedcure_app.data import load_dataset

    assert mix
    part = partition_for(cfg, load_dataset(cfg.data.dataset, cfg.data.data_dir))
    return [PRESETS[mix[int(part.initial_assignment[i]) % len(mix)]] for i in range(n)]


def host_samples_per_s(cfg: FedCureConfig) -> float:
    """Samples/s this machine trains the dataset's model on one core (torch, one thread)."""
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
            samples_per_step=min(b, len(y)))
    finally:
        torch.set_num_threads(threads)


class _NetnsStatus:
    """The cloud's ``Monitor.Status`` read through :mod:`fedcure_app.testbed.monitor` running in
    the cloud's namespace: the latest reply (None while the cloud does not answer)."""

    def __init__(self, netns: str, address: str, log_path: Path) -> None:
        from fedcure_app.processes import Child
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

    def __init__(self, args: argparse.Namespace) -> None:
        from fedcure_app.testbed.plan import run_prefix

        self.args = args
        self.prefix = run_prefix(args.prefix, os.getpid())
        self.plan: Any = None
        self.host_sps: float | None = None
        self.profiles: list[Any] = []
        self.created = False

    def setup(self, cfg: FedCureConfig, out: Path) -> FedCureConfig:
        from fedcure_app.config import apply_flat
        from fedcure_app.testbed import netns
        from fedcure_app.testbed.plan import make_plan

        mix = None if self.args.profiles else [m.strip() for m in self.args.mix.split(",")]
        self.profiles = client_profiles(cfg, mix, self.args.profiles)
        path = out / "profiles.json"
        path.write_text(json.dumps([p.model_dump(mode="json") for p in self.profiles],
                                   indent=1))
        cfg = apply_flat(cfg, {"profiles-file": str(path)})
        if self.args.cpufreq == "cgroup":
            self.host_sps = self.args.host_samples_per_s or host_samples_per_s(cfg)
            log.info("this host trains %s at %.0f samples/s on one core", cfg.data.dataset,
                     self.host_sps)
            warn_oversubscribed(self.profiles, cfg.data.dataset, self.host_sps)
        self.plan = make_plan(self.prefix, cfg.federation.num_edges, self.profiles,
                              cfg.devices.edge_link_mbps)
        self.created = True
        netns.create(self.plan)
        return cfg

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

    def teardown(self) -> None:
        from fedcure_app.devices.cgroup import remove_cgroups
        from fedcure_app.testbed import netns

        if self.created:
            netns.destroy(self.prefix)
            remove_cgroups(f"{self.prefix}-")

    def record(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "prefix": self.prefix, "host_samples_per_s": self.host_sps,
            "cpufreq": self.args.cpufreq,
            "nodes": [] if plan is None else [
                {"role": n.role, "netns": n.netns, "address": n.address,
                 "up_mbps": n.up_mbps, "down_mbps": n.down_mbps,
                 **({"profile": self.profiles[int(n.role[6:])].name}
                    if n.role.startswith("client") else {})}
                for n in plan.nodes()],
        }


def warn_oversubscribed(profiles: list[Any], model: str, host_sps: float,
                        host_cores: int | None = None) -> bool:
    """Warn (and return True) when the clients' quotas at f_max leave the roles less than
    :data:`~fedcure_app.devices.cgroup.ROLE_RESERVE_CORES` of this host's cores."""
    from fedcure_app.devices.cgroup import ROLE_RESERVE_CORES, cores_asked, oversubscribed

    cores = host_cores or os.cpu_count() or 1
    asked = cores_asked(profiles, model, host_sps)
    if not oversubscribed(asked, cores):
        return False
    log.warning("the %d clients' CPU quotas add up to %.2f cores at f_max and this host has %d "
                "(%.1f kept for the roles): coalitions that train at once will compute slower "
                "than their profiles; use fewer or slower devices (--mix, --profiles) for "
                "latencies true to the profiles", len(profiles), asked, cores,
                ROLE_RESERVE_CORES)
    return True


def check_testbed_inputs(args: argparse.Namespace) -> None:
    """The testbed's own options (raises :class:`UsageError`), before anything is made."""
    from fedcure_app.devices import PRESETS, ProfileError, load_profiles
    from fedcure_app.testbed.plan import run_prefix

    try:
        run_prefix(args.prefix, 1)
    except ValueError as err:
        raise UsageError(f"--prefix: {err}") from None
    if not (0 <= args.host_samples_per_s < float("inf")):
        raise UsageError("--host-samples-per-s must be a finite number >= 0 (0: measure)")
    if args.profiles:
        try:
            load_profiles(args.profiles)
        except ProfileError as err:
            raise UsageError(f"--profiles: {err}") from None
    else:
        mix = [m.strip() for m in args.mix.split(",")]
        unknown = [m for m in mix if m not in PRESETS]
        if unknown or not mix:
            raise UsageError(f"--mix: unknown preset(s) {', '.join(map(repr, unknown))}; "
                             f"choose from {', '.join(PRESETS)}")


def run(args: argparse.Namespace) -> int:
    from fedcure_app.cli import launch
    from fedcure_app.devices.cgroup import CgroupError, find_cpu_controller
    from fedcure_app.testbed import netns

    check_testbed_inputs(args)
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
    netns.clean_leftovers(args.prefix)
    return launch.run(args, NamespaceSite(args))


__all__ = ["DEFAULT_MIX", "NamespaceSite", "client_profiles", "host_samples_per_s", "register",
           "run", "warn_oversubscribed"]
