"""The Flower client executor: a coalition's edge rounds on real Flower ClientApps.

:class:`FlowerExecutor` is the twin of :class:`~fedcure_app.simulation.executors.
InProcessExecutor`: the engine hands it an :class:`~fedcure_app.tasks.EdgeTask` and gets an
:class:`~fedcure_app.tasks.EdgeResult`. Instead of training in this process it runs
:func:`fedcure_app.flower.edge.run_edge_task` on a :class:`~fedcure_app.flower.edge.CoalitionGrid`
over the coalition's nodes, so every local step happens in a ClientApp on a (virtual) SuperNode,
with Flower's Message API and ``FedAvg`` aggregation. Same seeds, same data, same weights: the
schedule trace is identical and the models agree up to float32 summation order.

On construction it waits until ``num_clients`` nodes are registered with the grid, then sends
each node a ``query`` Message and maps client id → node id from the replies (``partition-id``
in simulation, ``client-id`` where a SuperNode's node config names it). With
``share_nodes`` (the Simulation Runtime, whose virtual SuperNodes report ``num-partitions``,
the size of the whole federation) a federation smaller than ``num_clients`` is not an error:
client c trains on the node of partition ``c mod N`` (the ClientApp trains whichever client the
message names), so ``flwr run .`` works with Flower's default number of SuperNodes; only the
wall time differs, never the simulated clock or the results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedcure_app.flower.edge import CoalitionGrid, pull_replies, run_edge_task
from fedcure_app.tasks import EdgeResult, EdgeTask

log = logging.getLogger(__name__)


class DiscoveryError(RuntimeError):
    """The SuperNodes did not all register, or their ids could not be mapped to clients."""


def wait_for_nodes(
    grid: Grid,
    count: int,
    *,
    timeout_s: float = 120.0,
    stall_s: float | None = None,
    poll_s: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """Poll ``grid.get_node_ids()`` until at least ``count`` nodes are registered.

    Gives up after ``timeout_s``, or, with ``stall_s``, once some nodes are registered and their
    number has not changed for ``stall_s`` seconds (virtual SuperNodes all register at once, so
    a short federation shows at once).
    """
    start = clock()
    last_n, last_change = -1, start
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        now = clock()
        if len(nodes) != last_n:
            last_n, last_change = len(nodes), now
        stalled = stall_s is not None and nodes and now - last_change >= stall_s
        if now - start >= timeout_s or stalled:
            raise DiscoveryError(
                f"only {len(nodes)} of {count} SuperNodes registered "
                f"(waited {now - start:.0f} s); start one SuperNode per client (simulation: "
                f"`flwr run . --stream --federation-config \"num-supernodes={count}\"`)"
            )
        sleep(poll_s)


def _identity(reply: Message) -> dict[str, Any]:
    if reply.has_error():
        raise DiscoveryError(
            f"node {reply.metadata.src_node_id} failed the identity query: {reply.error.reason}"
        )
    rec = reply.content.config_records.get("identity")
    if rec is None:
        raise DiscoveryError(f"node {reply.metadata.src_node_id} sent no identity record")
    return dict(rec)


def _query_identities(grid: Grid, nodes: list[int], *, timeout_s: float,
                      poll_s: float) -> dict[int, dict[str, Any]]:
    """Node id → its identity record (``partition-id``, ``num-partitions``, ``client-id``)."""
    msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY,
                    group_id="fedcure-discovery") for n in nodes]
    ids = list(grid.push_messages(msgs))
    node_of_id = {mid: n for mid, n in zip(ids, nodes) if mid}
    got, pending = pull_replies(grid, node_of_id, poll_s=poll_s, timeout_s=timeout_s)
    if pending:
        raise DiscoveryError(
            f"{len(pending)} of {len(nodes)} nodes did not answer the identity query within "
            f"{timeout_s:.0f} s"
        )
    return {node_of_id[mid]: _identity(reply) for mid, reply in got.items()}


def shared_mapping(identities: Mapping[int, Mapping[str, Any]],
                   num_clients: int) -> dict[int, int] | None:
    """Client id → node id when a complete simulated federation (every node reports
    ``partition-id`` and the same ``num-partitions`` N, all N registered) has fewer than
    ``num_clients`` nodes: client c goes to the node of partition ``c mod N``. None when the
    nodes are not such a federation, or when it has a node for every client."""
    if not identities or any("client-id" in i for i in identities.values()):
        return None
    sizes = {i.get("num-partitions") for i in identities.values()}
    if len(sizes) != 1 or None in sizes:
        return None
    total = int(sizes.pop())
    node_of_part = {int(i["partition-id"]): n for n, i in identities.items()
                    if "partition-id" in i}
    if total >= num_clients or sorted(node_of_part) != list(range(total)):
        return None
    return {c: node_of_part[c % total] for c in range(num_clients)}


def discover_clients(
    grid: Grid,
    num_clients: int,
    *,
    timeout_s: float = 120.0,
    stall_s: float | None = None,
    poll_s: float = 0.01,
    share_nodes: bool = False,
) -> dict[int, int]:
    """Client id → node id for clients 0..num_clients-1, by querying every registered node.

    A node's client id is its ``client-id`` if it reports one, else its ``partition-id``.
    Nodes with ids ≥ ``num_clients`` are left unused. ``share_nodes``: a complete simulated
    federation of fewer nodes serves every client (:func:`shared_mapping`), logged once.
    """
    t0 = time.monotonic()
    if share_nodes:
        nodes = wait_for_nodes(grid, 1, timeout_s=timeout_s)
        # virtual SuperNodes register together: all N of them answer the first query
        idents = _query_identities(grid, nodes, poll_s=poll_s,
                                   timeout_s=max(1.0, timeout_s - (time.monotonic() - t0)))
        mapping = shared_mapping(idents, num_clients)
        if mapping is not None:
            log.warning("%d virtual SuperNodes for %d clients: each SuperNode trains its "
                        "clients in turn (same results; --federation-config "
                        "\"num-supernodes=%d\" gives every client its own)",
                        len(idents), num_clients, num_clients)
            return mapping
    nodes = wait_for_nodes(grid, num_clients, timeout_s=timeout_s, stall_s=stall_s)
    idents = _query_identities(grid, nodes, poll_s=poll_s,
                               timeout_s=max(1.0, timeout_s - (time.monotonic() - t0)))
    mapping = {}
    for node, ident in idents.items():
        cid = ident.get("client-id", ident.get("partition-id"))
        if cid is None:
            raise DiscoveryError(f"node {node} reports neither client-id nor partition-id")
        cid = int(cid)
        if cid in mapping:
            raise DiscoveryError(f"client {cid} claimed by nodes {mapping[cid]} and {node}")
        mapping[cid] = node
    missing = [c for c in range(num_clients) if c not in mapping]
    if missing:
        raise DiscoveryError(
            f"no node holds client(s) {missing[:10]}{'…' if len(missing) > 10 else ''} "
            f"(nodes report ids {sorted(mapping)[:10]}…)"
        )
    return {c: mapping[c] for c in range(num_clients)}


@dataclass
class ExecutorStats:
    """Wall time spent per task and per edge round through the Flower path."""

    tasks: int = 0
    edge_rounds: int = 0
    seconds: float = 0.0
    discovery_seconds: float = 0.0
    dropped: list[int] = field(default_factory=list)
    #: (edge rounds, wall seconds) of every task, in order
    per_task: list[tuple[int, float]] = field(default_factory=list)
    #: train replies per Ray node (the ClientApp's ``ray-node`` metric; empty outside Ray)
    ray_nodes: dict[int, int] = field(default_factory=dict)

    @property
    def seconds_per_edge_round(self) -> float:
        """Mean wall seconds per edge round over all tasks."""
        return self.seconds / self.edge_rounds if self.edge_rounds else 0.0

    def seconds_per_edge_round_after(self, skip: int) -> float:
        """Mean wall seconds per edge round, leaving out the first ``skip`` tasks (warm-up:
        under Ray the first messages also start the ClientApp actors)."""
        rest = self.per_task[skip:]
        rounds = sum(r for r, _ in rest)
        return sum(s for _, s in rest) / rounds if rounds else 0.0


class _RecordingCoalitionGrid(CoalitionGrid):
    """A :class:`CoalitionGrid` that counts the train replies per Ray node in ``stats``."""

    def __init__(self, grid: Grid, node_ids: list[int], stats: ExecutorStats) -> None:
        super().__init__(grid, node_ids)
        self._stats = stats

    def pull_messages(self, message_ids):  # type: ignore[override]
        replies = super().pull_messages(message_ids)
        for reply in replies:
            if reply.has_error():
                continue
            for rec in reply.content.metric_records.values():
                if "ray-node" in rec:
                    node = int(rec["ray-node"])
                    self._stats.ray_nodes[node] = self._stats.ray_nodes.get(node, 0) + 1
        return replies


class FlowerExecutor:
    """Runs each :class:`EdgeTask` through a Flower ``Grid`` (see module docstring).

    ``poll_s``: seconds between pulls; ``timeout_s``: per edge round reply deadline (None: wait);
    ``discovery_timeout_s``/``discovery_stall_s``: see :func:`wait_for_nodes`;
    ``extra_config``: entries added to every train message's ConfigRecord (the ServerApp sends
    the client-data fingerprint ``data-key``); ``node_of_client``: skip discovery and use this
    mapping.
    """

    def __init__(
        self,
        grid: Grid,
        num_clients: int,
        *,
        poll_s: float = 0.01,
        timeout_s: float | None = None,
        discovery_timeout_s: float = 120.0,
        discovery_stall_s: float | None = None,
        extra_config: Mapping[str, Any] | None = None,
        node_of_client: Mapping[int, int] | None = None,
        share_nodes: bool = False,
    ) -> None:
        self.grid = grid
        self.num_clients = int(num_clients)
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.extra_config = dict(extra_config or {})
        self.stats = ExecutorStats()
        t0 = time.perf_counter()
        if node_of_client is None:
            node_of_client = discover_clients(
                grid, self.num_clients, timeout_s=discovery_timeout_s,
                stall_s=discovery_stall_s, poll_s=poll_s, share_nodes=share_nodes,
            )
        self.node_of_client = {int(c): int(n) for c, n in node_of_client.items()}
        if len(set(self.node_of_client.values())) < len(self.node_of_client):
            # the ClientApp then knows that its node's partition-id is not the client it trains
            self.extra_config["node-shared"] = True
        self.stats.discovery_seconds = time.perf_counter() - t0
        log.info("FlowerExecutor: %d clients mapped to nodes in %.2f s",
                 len(self.node_of_client), self.stats.discovery_seconds)

    def run(self, task: EdgeTask) -> EdgeResult:
        if task.simulation_only:
            raise ValueError(f"{', '.join(task.simulation_only)}: not supported by the Flower "
                             "ClientApp (it trains τ_c plain-SGD mini-batch steps); use the "
                             "in-process executor or leave at the default")
        nodes = [self.node_of_client[c] for c in task.clients if c in self.node_of_client]
        t0 = time.perf_counter()
        result = run_edge_task(
            _RecordingCoalitionGrid(self.grid, nodes, self.stats), task, self.node_of_client,
            poll_s=self.poll_s, timeout_s=self.timeout_s, extra_config=self.extra_config,
        )
        dt = time.perf_counter() - t0
        self.stats.seconds += dt
        self.stats.per_task.append((task.tau_e, dt))
        self.stats.tasks += 1
        self.stats.edge_rounds += task.tau_e
        self.stats.dropped.extend(result.dropped)
        return result

    def close(self) -> None:
        """Nothing to release: the grid belongs to the ServerApp."""


__all__ = ["DiscoveryError", "ExecutorStats", "FlowerExecutor", "discover_clients",
           "shared_mapping", "wait_for_nodes"]
