"""Which Flower node runs which FedCure client, on a deployed edge's SuperLink.

SuperNodes register with the SuperLink under random node ids; each one's ClientApp answers a
``query`` Message with its node config's ``client-id``
(:func:`fedcure_app.flower.client_app.query`).
:class:`NodeDirectory` queries every node it has not identified yet, drops nodes that left
(``grid.get_node_ids()`` no longer lists them), and answers which clients are reachable.
A client that restarts gets a new node id; the latest node claiming a client id wins.

Each node is asked once (a SuperNode handles one message at a time; asking again while the
first query is in flight confuses it); only a node whose answer was an error is asked again,
``retry_s`` later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedcure_app.protocol.text import printable

log = logging.getLogger(__name__)


class NodeDirectory:
    """Client id ↔ Flower node id on one grid (see the module docstring).

    ``retry_s``: how long after an error answer a node is asked again.
    """

    def __init__(self, grid: Grid, *, retry_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.grid = grid
        self.retry_s = float(retry_s)
        self._clock = clock
        #: node id -> time before which it is not asked again (after an error answer)
        self._retry_at: dict[int, float] = {}
        #: node id -> client id of every identified live node
        self.client_of_node: dict[int, int] = {}
        #: message id -> (node id, sent at) of unanswered identity queries
        self._pending: dict[str, tuple[int, float]] = {}
        #: nodes whose ClientApp answered without a client id (not FedCure clients)
        self._strangers: set[int] = set()

    @property
    def node_of_client(self) -> dict[int, int]:
        """Client id → node id for every identified live node."""
        return {c: n for n, c in self.client_of_node.items()}

    def refresh(self) -> None:
        """One pass: forget nodes that left, query new ones, collect answers."""
        live = {int(n) for n in self.grid.get_node_ids()}
        for n in list(self.client_of_node):
            if n not in live:
                log.info("node %d (client %d) left the SuperLink", n, self.client_of_node.pop(n))
        now = self._clock()
        for mid, (n, _) in list(self._pending.items()):
            if n not in live:
                del self._pending[mid]
        asked = {n for n, _ in self._pending.values()}
        new = sorted(n for n in live - set(self.client_of_node) - asked - self._strangers
                     if self._retry_at.get(n, 0.0) <= now)
        if new:
            msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY,
                            group_id="fedcure-identity") for n in new]
            for mid, n in zip(self.grid.push_messages(msgs), new):
                if mid:
                    self._pending[mid] = (n, now)
        if self._pending:
            for reply in self.grid.pull_messages(sorted(self._pending)):
                mid = reply.metadata.reply_to_message_id
                if mid in self._pending:
                    n, _ = self._pending.pop(mid)
                    self._learn(n, reply)

    def _learn(self, node: int, reply: Message) -> None:
        if reply.has_error():
            log.warning("node %d failed the identity query (asking again in %.0f s): %s", node,
                        self.retry_s, printable(reply.error.reason))
            self._retry_at[node] = self._clock() + self.retry_s
            return
        rec = reply.content.config_records.get("identity")
        if rec is None or "client-id" not in rec:
            log.warning("node %d reports no client-id in its node config; ignored "
                        "(start SuperNodes with fedcure-client)", node)
            self._strangers.add(node)
            return
        client = int(rec["client-id"])
        for other, c in list(self.client_of_node.items()):
            if c == client and other != node:
                log.warning("client %d moved from node %d to node %d", client, other, node)
                del self.client_of_node[other]
        self.client_of_node[node] = client
        log.info("node %d is client %d", node, client)

    def resolve(self, clients: Iterable[int], timeout_s: float, *, poll_s: float = 0.05,
                sleep: Callable[[float], None] = time.sleep,
                stop: Callable[[], bool] | None = None) -> dict[int, int]:
        """Client id → node id for ``clients``, waiting up to ``timeout_s`` for all of them.

        Returns what is known by then (possibly partial); the caller decides what a missing
        client means.
        """
        want = {int(c) for c in clients}
        deadline = self._clock() + timeout_s
        while True:
            self.refresh()
            known = self.node_of_client
            if want <= set(known) or self._clock() >= deadline or (stop and stop()):
                return {c: known[c] for c in sorted(want) if c in known}
            sleep(poll_s)


__all__ = ["NodeDirectory"]
