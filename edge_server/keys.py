"""Registering the coalition's SuperNode keys with this edge's SuperLink (``--supernode-auth``).

:class:`KeyRegistrar` asks the cloud for this ES's members (``EdgeLink.Members``) every
``every_s`` seconds and registers each new or changed SuperNode public key with the local
SuperLink (:func:`fedcure_app.flower.supernode_auth.register_supernode_key`), so that the clients
the cloud assigned here, and no one else, can connect their SuperNodes.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from fedcure_app.protocol.text import printable

log = logging.getLogger("fedcure.edge")


class KeyRegistrar:
    """Keeps the SuperLink's registered SuperNode keys in step with the cloud's members."""

    def __init__(self, channel: Any, edge_id: int, token: str, *, keys_dir: Path,
                 connection: str, env: dict[str, str], flwr_bin: str = "flwr",
                 every_s: float = 1.0) -> None:
        from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc

        self.stub = pb_grpc.EdgeLinkStub(channel)
        self.edge_id, self.token = edge_id, token
        self.keys_dir, self.connection, self.env = keys_dir, connection, env
        self.flwr_bin, self.every_s = flwr_bin, every_s
        #: client id -> the key registered for it
        self.registered: dict[int, str] = {}
        #: client id -> Flower node id (when Flower gave one)
        self.node_ids: dict[int, int] = {}
        self.errors = 0
        self._warned: set[Any] = set()

    def sync(self) -> int:
        """One round: fetch the members, register new keys; return how many were registered."""
        import grpc

        from fedcure_app.protocol import cloud_pb2 as pb
        from fedcure_app.flower.supernode_auth import RegistrationError, register_supernode_key

        try:
            reply = self.stub.Members(pb.MembersRequest(edge_id=self.edge_id, token=self.token),
                                      timeout=10.0)
        except grpc.RpcError as err:
            self.errors += 1
            code = err.code() if hasattr(err, "code") else None
            if code != grpc.StatusCode.UNAVAILABLE and code not in self._warned:
                self._warned.add(code)
                log.warning("edge %d: cannot fetch its members' SuperNode keys (%s: %s)",
                            self.edge_id, getattr(code, "name", code),
                            printable(err.details() if hasattr(err, "details") else err))
            return 0
        added = 0
        for member in reply.members:
            key = member.supernode_public_key.strip()
            cid = int(member.client_id)
            if not key or self.registered.get(cid) == key:
                continue
            try:
                node = register_supernode_key(
                    key, self.keys_dir / f"client{cid}-{len(self.registered)}.pub",
                    connection=self.connection, env=self.env, flwr_bin=self.flwr_bin)
            except (RegistrationError, ValueError) as err:
                self.errors += 1
                log.warning("edge %d: client %d's SuperNode key not registered: %s",
                            self.edge_id, cid, printable(err))
                continue
            self.registered[cid] = key
            if node is not None:
                self.node_ids[cid] = node
            added += 1
            log.info("edge %d: registered client %d's (%s) SuperNode key%s", self.edge_id, cid,
                     printable(member.client_name), f" (node {node})" if node is not None else "")
        return added

    def run(self, stop: threading.Event) -> None:
        """Sync until ``stop`` is set."""
        while not stop.is_set():
            self.sync()
            stop.wait(self.every_s)


__all__ = ["KeyRegistrar"]
