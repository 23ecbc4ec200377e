"""Network namespaces, veth pairs to a bridge and ``tbf`` shaping, through ``ip`` and ``tc``.

The side-effect half of the testbed's network (the plan is :mod:`fedcure_app.testbed.plan`).
Everything it makes is named ``<prefix>-...``, so :func:`destroy` removes a run's namespaces (and
with them every veth, the bridge and the qdiscs) by prefix, and :func:`clean_leftovers` those of
runs whose process is gone. Processes run inside a namespace through ``nsenter --net`` (it keeps
this machine's mounts, /sys/fs/cgroup included, which ``ip netns exec`` would hide), and keep the
pid they were started with.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fedcure_app.testbed.plan import DEAD_END, DEAD_END_MAC, Node, Plan, owner_pid, tbf_args

log = logging.getLogger(__name__)

#: tools the testbed runs
TOOLS = ("ip", "tc", "nsenter")


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed (one line: the command and its error)."""


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        err = " ".join((proc.stderr or proc.stdout).split()) or f"exit code {proc.returncode}"
        raise NetnsError(f"`{' '.join(argv)}` failed: {err}")
    return proc


def _probe(prefix: str) -> str | None:
    """Make and delete ``<prefix>-probe`` with a bridge, a veth pair and a tbf qdisc inside: the
    only sure test of what this kernel offers (built-in modules leave no trace in /sys). Returns
    the first error, or None."""
    ns = f"{prefix}-probe"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "-n", ns, "link", "add", "br0", "type", "bridge"],
        ["ip", "-n", ns, "link", "add", "a0", "type", "veth", "peer", "name", "b0"],
        ["tc", "-n", ns, "qdisc", "add", "dev", "a0", "root", "tbf", *tbf_args(10.0)],
    ]
    try:
        for argv in steps:
            _run(argv)
    except (NetnsError, subprocess.TimeoutExpired) as err:
        return str(err)
    finally:
        _run(["ip", "netns", "del", ns], check=False)
    return None


def kernel_problem(prefix: str = "fedcureprobe") -> str | None:
    """Why this machine cannot run a testbed (one line), or None. Leaves nothing behind: the
    only thing it makes is a probe namespace ``<prefix>-probe``, deleted at once."""
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, tc, cgroups); run it with sudo"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing command(s) {', '.join(missing)} (install iproute2 and util-linux)"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces"
    err = _probe(prefix)
    if err:
        return f"this kernel cannot make the testbed's links (bridge, veth, tbf): {err}"
    return None


def netns_path(name: str) -> str:
    """Where ``ip netns`` keeps namespace ``name``."""
    run = Path("/run/netns")
    return str((run if run.is_dir() else Path("/var/run/netns")) / name)


def in_netns(name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``name`` (same pid, same mounts)."""
    return ["nsenter", f"--net={netns_path(name)}", "--", *[str(a) for a in argv]]


def list_namespaces() -> list[str]:
    """Names of every named network namespace (``ip netns list``)."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(name: str) -> list[int]:
    """Processes inside namespace ``name``."""
    out = _run(["ip", "netns", "pids", name], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def create(plan: Plan) -> None:
    """Make the hub with its bridge and every node's namespace, veth and shaping.

    On failure, removes what it made and raises :class:`NetnsError`."""
    hub = plan.hub
    try:
        _run(["ip", "netns", "add", hub])
        _run(["ip", "-n", hub, "link", "set", "lo", "up"])
        _run(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", hub, "link", "set", "br0", "up"])
        for node in plan.nodes():
            add_node(plan, node)
    except (NetnsError, subprocess.TimeoutExpired):
        destroy(plan.prefix)
        raise


def add_node(plan: Plan, node: Node) -> None:
    """One node: its namespace, ``eth0`` with its address, the peer on the bridge, shaping."""
    ns, hub = node.netns, plan.hub
    _run(["ip", "netns", "add", ns])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", node.peer,
          "netns", hub])
    _run(["ip", "-n", ns, "addr", "add", f"{node.address}/16", "dev", "eth0"])
    _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    _run(["ip", "-n", hub, "link", "set", node.peer, "master", "br0"])
    _run(["ip", "-n", hub, "link", "set", node.peer, "up"])
    if node.up_mbps is not None:
        _run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf",
              *tbf_args(node.up_mbps)])
    if node.down_mbps is not None:
        _run(["tc", "-n", hub, "qdisc", "add", "dev", node.peer, "root", "tbf",
              *tbf_args(node.down_mbps)])


def set_link(plan: Plan, node: Node, up: bool) -> None:
    """Take ``node``'s link down (its veth peer on the bridge) or bring it back."""
    _run(["ip", "-n", plan.hub, "link", "set", node.peer, "up" if up else "down"])


def shape(plan: Plan, node: Node, up_mbps: float | None, down_mbps: float | None) -> None:
    """Shape ``node``'s link to ``up_mbps`` (what it sends) and ``down_mbps`` (what it
    receives) with ``tbf``, replacing its shaping; None removes that direction's shaping.
    ``shape(plan, node, node.up_mbps, node.down_mbps)`` puts back the plan's rates."""
    for ns, dev, rate in ((node.netns, "eth0", up_mbps), (plan.hub, node.peer, down_mbps)):
        if rate is None:
            _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
        else:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                  *tbf_args(rate)])


def cut(a: Node, b: Node, cut: bool = True) -> None:
    """Cut ``a`` from ``b`` (both ways), or heal the cut, leaving both their other links up.

    Each routes the other's address to :data:`~fedcure_app.testbed.plan.DEAD_END`, whose
    link-layer address is pinned (a permanent neighbour entry) to one no interface has: the
    packets leave, the bridge floods them and nobody takes them. The cut is silent, like a
    partition beyond the first hop: no error reaches either side (no failed neighbour probe, no
    "host unreachable"), open connections hang until the cut heals or their keepalives give
    up. Healing deletes the two routes; idempotent both ways."""
    for node, other in ((a, b), (b, a)):
        if cut:
            _run(["ip", "-n", node.netns, "neigh", "replace", DEAD_END, "lladdr", DEAD_END_MAC,
                  "nud", "permanent", "dev", "eth0"])
        argv = ["ip", "-n", node.netns, "route", "replace" if cut else "del",
                f"{other.address}/32", "via", DEAD_END, "dev", "eth0"]
        proc = _run(argv, check=cut)
        if not cut and proc.returncode != 0 and "No such process" not in proc.stderr:
            raise NetnsError(f"`{' '.join(argv)}` failed: {' '.join(proc.stderr.split())}")


def qdisc(ns: str, dev: str) -> str:
    """``tc qdisc show`` of ``dev`` in ``ns`` (for checks)."""
    return _run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout


def destroy(prefix: str) -> list[str]:
    """Kill every process inside ``<prefix>-*`` namespaces and delete them (their veths, the
    bridge and the qdiscs go with them); return the names deleted. Raises nothing."""
    from fedcure_app.runtime.processes import stop_pids

    gone = []
    names = [n for n in list_namespaces() if n.startswith(f"{prefix}-")]
    pids = sorted({p for n in names for p in namespace_pids(n) if p != os.getpid()})
    if pids:
        log.info("stopping %d leftover process(es) in %s-* namespaces", len(pids), prefix)
        stop_pids(pids, grace_s=3.0)
    for n in names:
        proc = _run(["ip", "netns", "del", n], check=False)
        if proc.returncode == 0:
            gone.append(n)
        else:
            log.warning("cannot delete network namespace %s: %s", n, proc.stderr.strip())
    return gone


def clean_leftovers(base: str) -> list[str]:
    """Remove the namespaces and cgroups of earlier runs named ``<base><pid>-*`` whose process
    ``pid`` is gone (a crashed run); return the prefixes cleaned."""
    from fedcure_app.devices.cgroup import CgroupError, find_cpu_controller, remove_cgroups
    from fedcure_app.runtime.processes import alive

    prefixes = set()
    for n in list_namespaces():
        pid = owner_pid(n, base)
        if pid is not None and pid != os.getpid() and not alive(pid):
            prefixes.add(f"{base}{pid}")
    try:
        ctl = find_cpu_controller()
        for d in ctl.base.glob(f"{base}*"):
            pid = owner_pid(d.name, base)
            if pid is not None and pid != os.getpid() and not alive(pid):
                prefixes.add(f"{base}{pid}")
    except CgroupError:
        pass
    for prefix in sorted(prefixes):
        log.warning("removing the leftovers of an earlier testbed run (%s-*)", prefix)
        destroy(prefix)
        remove_cgroups(f"{prefix}-")
    return sorted(prefixes)


__all__ = ["NetnsError", "TOOLS", "add_node", "clean_leftovers", "create", "cut",
           "destroy", "in_netns", "kernel_problem", "list_namespaces", "namespace_pids",
           "netns_path", "qdisc", "set_link", "shape"]
