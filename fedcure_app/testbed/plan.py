"""Pure planning of a testbed's network: who gets which namespace, interface, address and rates.

Every role (the cloud, each edge, each client) gets a network namespace ``<prefix>-<role>`` with
one interface ``eth0`` whose peer sits in the hub namespace ``<prefix>-hub`` on the bridge
``br0``. Addresses come from one private /16 and live only inside these namespaces. A client's
link is shaped to its device profile's rates: ``up_mbps`` on its own ``eth0`` (what it sends),
``down_mbps`` on its peer in the hub (what it receives). An edge's link is shaped to the
configuration's ``edge_link_mbps`` both ways; the cloud's is not shaped. Rates in Mbit/s (10⁶
bit/s).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fedcure_app.devices.profiles import DeviceProfile

#: the private network every testbed address comes from (/16)
SUBNET = "10.213"
#: namespace and cgroup names: <base><pid>-..., so a crashed run's leftovers name their owner
PREFIX_RE = re.compile(r"^([a-z]{1,8})(\d{1,7})$")
#: Linux interface names have at most 15 characters
IFNAMSIZ = 15
#: an address of the subnet no node gets (the /16's last host): a next hop that never answers,
#: where :func:`fedcure_app.testbed.netns.cut` routes the traffic of a cut pair
DEAD_END = f"{SUBNET}.255.254"
#: the dead end's link-layer address: locally administered, on no interface, so frames to it
#: are flooded by the bridge and taken by nobody
DEAD_END_MAC = "02:00:00:00:de:ad"
#: hosts a plan may number (the last one of the /16 is :data:`DEAD_END`)
MAX_HOSTS = 254 * 256 - 1


@dataclass(frozen=True)
class Node:
    """One role's place in the testbed: namespace, hub-side interface name, address, rates
    (None: not shaped)."""

    role: str  # "cloud", "edge<m>" or "client<i>"
    netns: str
    peer: str  # its veth peer's name in the hub namespace
    address: str  # dotted IPv4, /16
    up_mbps: float | None = None
    down_mbps: float | None = None


@dataclass(frozen=True)
class Plan:
    """The whole testbed network: the hub namespace and every node."""

    prefix: str
    hub: str
    cloud: Node
    edges: tuple[Node, ...]
    clients: tuple[Node, ...]

    def nodes(self) -> tuple[Node, ...]:
        return (self.cloud, *self.edges, *self.clients)


def run_prefix(base: str, pid: int) -> str:
    """``<base><pid>``: the prefix of one run's namespaces and cgroups (checked)."""
    prefix = f"{base}{int(pid)}"
    if not PREFIX_RE.match(prefix):
        raise ValueError(f"testbed prefix base {base!r}: 1-8 lowercase letters")
    return prefix


def owner_pid(name: str, base: str) -> int | None:
    """The pid in a namespace or cgroup name made by :func:`run_prefix` with ``base``, else None."""
    m = re.match(rf"^{re.escape(base)}(\d{{1,7}})-", name)
    return int(m.group(1)) if m else None


def _address(index: int) -> str:
    """Host ``index`` (0-based) of the /16, skipping .0 and .255 in every /24."""
    if not 0 <= index < MAX_HOSTS:
        raise ValueError(f"no address for host {index}")
    return f"{SUBNET}.{index // 254}.{index % 254 + 1}"


def make_plan(prefix: str, num_edges: int, client_profiles: Sequence[DeviceProfile],
              edge_link_mbps: float | None) -> Plan:
    """The network of a run with ``num_edges`` edges and one client per profile."""
    if num_edges < 1 or not client_profiles:
        raise ValueError("a testbed needs at least one edge and one client")
    if len(f"{prefix}-c{len(client_profiles)}") > 40:
        raise ValueError(f"prefix {prefix!r} is too long")
    hosts = iter(range(1 + num_edges + len(client_profiles)))
    cloud = Node("cloud", f"{prefix}-cloud", "cloud", _address(next(hosts)))
    edges = tuple(Node(f"edge{m}", f"{prefix}-e{m}", f"e{m}", _address(next(hosts)),
                       edge_link_mbps, edge_link_mbps) for m in range(num_edges))
    clients = tuple(Node(f"client{i}", f"{prefix}-c{i}", f"c{i}", _address(next(hosts)),
                         float(p.uplink_mbps), float(p.downlink_mbps))
                    for i, p in enumerate(client_profiles))
    for n in (cloud, *edges, *clients):
        assert len(n.peer) <= IFNAMSIZ
    return Plan(prefix, f"{prefix}-hub", cloud, edges, clients)


def tbf_args(rate_mbps: float) -> list[str]:
    """``tc qdisc ... tbf`` arguments for ``rate_mbps``: a bucket of 4 ms of traffic but at
    least two full frames (tbf splits larger segmentation-offload packets itself), 200 ms of
    queue. A small bucket keeps a short transfer from going faster than the rate."""
    if not rate_mbps > 0:
        raise ValueError(f"rate must be > 0 Mbit/s, got {rate_mbps!r}")
    rate_bps = rate_mbps * 1e6
    burst = max(2 * 1_514, int(rate_bps / 8 * 0.004))
    return ["rate", f"{round(rate_bps)}bit", "burst", str(burst), "latency", "200ms"]


__all__ = ["DEAD_END", "DEAD_END_MAC", "IFNAMSIZ", "MAX_HOSTS", "Node", "Plan", "SUBNET",
           "make_plan", "owner_pid", "run_prefix", "tbf_args"]
