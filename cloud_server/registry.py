"""Registration's rules over the run's :class:`~cloud_server.state.Roster`.

:class:`Registry` records the clients by name (``Association.Register``), the partition each
name claims (``Association.Claim``), the address each edge server connects with and which edges
are connected now. It checks every Register field at the door (:mod:`cloud_server.validation`);
whether registration is still open is the controller's to say (formation closes it). Not
thread-safe by itself: the controller calls it from the event loop, and under its lock from
worker threads.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import CodecError, profile_from_proto
from fedcure_app.protocol.withdraw import known_reason
from fedcure_app.flower.supernode_auth import check_supernode_key
from cloud_server import validation as door
from cloud_server.formation import model_cycles_key, natural_key
from cloud_server.refusal import Reason, Refusal
from cloud_server.state import ClientEntry, Roster

log = logging.getLogger("fedcure.cloud")


class Registry:
    """Registration's rules; the clients, claims and edges they change live in ``roster``.

    Parameters
    ----------
    cfg:
        The configuration: M edges, the partition count (``federation.num_clients``), the
        classes and the dataset a device profile must cover.
    roster:
        Who takes part (shared with the checkpoint and the results).
    """

    def __init__(self, cfg: FedCureConfig, roster: Roster) -> None:
        self.num_edges = cfg.federation.num_edges
        self.num_partitions = cfg.federation.num_clients
        self.num_classes = cfg.federation.num_classes
        self.cfg = cfg
        self.roster = roster
        self._model_key: str | None = None
        self._signature: list[list[Any]] | None = None
        #: registrations changed since the last formation attempt (worth trying again)
        self.changed = False

    @property
    def dataset(self) -> str:
        """The model a device profile must give cycles for (a task's model by its FLOPs)."""
        if self._model_key is None:
            self._model_key = model_cycles_key(self.cfg)
        return self._model_key

    def signature(self) -> list[list[Any]] | None:
        """The run's model as [[name, [shape…]], …] (state_dict order), what a client of a
        task must have built; None for a built-in dataset (nothing to check)."""
        if self.cfg.task is None:
            return None
        if self._signature is None:
            from fedcure_app.models import build_model, model_signature

            self._signature = [[k, list(v)] for k, v in
                               model_signature(build_model(self.cfg.task))]
        return self._signature

    def check_signature(self, who: str, theirs: list[list[Any]] | None) -> None:
        """Refuse a client of a task whose model differs from the cloud's (``theirs``: its
        signature as :func:`cloud_server.validation.parse_signature` read it), naming the
        first difference."""
        mine = self.signature()
        if mine is None:
            return
        if theirs is None:
            raise door.Refused("no model signature; this cloud runs a task and checks every "
                               "client's model")
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                raise door.Refused(f"its model differs from the cloud's ({self.cfg.task.model}):"
                                   f" tensor {i} is {door.clip(b[0])} {tuple(b[1])} on the "
                                   f"client, {a[0]!r} {tuple(a[1])} on the cloud")
        if len(mine) != len(theirs):
            raise door.Refused(f"its model differs from the cloud's ({self.cfg.task.model}): "
                               f"{len(theirs)} tensors on the client, {len(mine)} on the cloud")

    # ------------------------------------------------------------------ clients
    def withdraw(self, name: str, reason: str, *, open_: bool) -> int:
        """Client ``name`` cannot take part (its data or model was refused): forget its claim
        and registration, remember why, and wait for it no longer; returns the clients still
        awaited. Refused once formation ran (``open_`` False) for a client that is part of a
        coalition."""
        try:
            name = door.check_name(name)
        except door.Refused as err:
            raise Refusal(Reason.INVALID_ARGUMENT, str(err)) from None
        if not open_ and name in self.roster.clients:
            raise Refusal(Reason.FAILED_PRECONDITION, f"client {door.clip(name)} is part of a "
                          "coalition: formation already ran")
        self.forget(name, known_reason(reason))  # a code and a count, nothing private
        return self.roster.awaited

    def forget(self, name: str, reason: str) -> None:
        """Drop ``name``'s claim and registration and record it as withdrawn (one log line)."""
        self.roster.claims.pop(name, None)
        if self.roster.clients.pop(name, None) is not None:
            self.changed = True
        first = name not in self.roster.withdrawn
        self.roster.withdrawn[name] = reason
        if first:
            log.warning("client %s withdrew: %s (formation waits for %d clients now)",
                        door.clip(name), reason, self.roster.awaited)

    def claim(self, name: str, wanted: int | None) -> int:
        """The stable partition index of client ``name`` (``wanted`` if free, else the first)."""
        try:
            name = door.check_name(name)
        except door.Refused as err:
            raise Refusal(Reason.INVALID_ARGUMENT, str(err)) from None
        n = self.num_partitions
        claims = self.roster.claims
        held = claims.get(name)
        if held is not None:
            if wanted is not None and wanted != held:
                raise Refusal(Reason.FAILED_PRECONDITION,
                              f"client {door.clip(name)} already holds partition {held}, "
                              f"not {wanted}")
            return held
        taken = set(claims.values())
        if wanted is not None:
            if not 0 <= wanted < n:
                raise Refusal(Reason.INVALID_ARGUMENT, f"partition {wanted} outside [0, {n})")
            if wanted in taken:
                raise Refusal(Reason.ALREADY_EXISTS,
                              f"partition {wanted} is already held by another client")
            index = wanted
        else:
            free = [i for i in range(n) if i not in taken]
            if not free:
                raise Refusal(Reason.RESOURCE_EXHAUSTED, f"all {n} partitions are taken")
            index = free[0]
        claims[name] = index
        log.info("client %r claimed partition %d of %d", name, index, n)
        return index

    def validate(self, req: pb.RegisterRequest) -> ClientEntry:
        """Every field of a Register request within bounds (``cloud_server.validation``), and
        the client's predicted edge round finite: one client can never make formation fail."""
        try:
            name = door.check_name(req.client_name)
        except door.Refused as err:
            raise Refusal(Reason.INVALID_ARGUMENT, str(err)) from None
        who = f"client {door.clip(name)}"
        try:
            private = req.histogram_epsilon > 0
            door.check_label_counts(req.label_counts, self.num_classes,
                                    allow_zero=private and req.num_samples > 0)
            door.check_samples(req.num_samples)
            if not req.HasField("device"):
                raise door.Refused("no device profile")
            door.check_profile_size(len(req.device.cycles_per_sample))
            profile = profile_from_proto(req.device)
            device, rate = door.check_compute(req.compute_device, req.samples_per_s)
            if rate > 0:
                profile = door.measured_profile(profile, self.dataset, rate)
            door.check_profile(profile, self.dataset)
            door.check_key_text(req.supernode_public_key)
            signature = door.parse_signature(req.model_signature)
            door.check_epsilon(req.histogram_epsilon)
            door.check_sample_count(req.num_samples, req.label_counts, req.histogram_epsilon,
                                    req.histogram_min_count)
        except (door.Refused, CodecError, ValueError, TypeError, OverflowError,
                RecursionError) as err:  # whatever parsing raises: one line, never UNKNOWN
            raise Refusal(Reason.INVALID_ARGUMENT,
                          f"{who}: {' '.join(str(err).split())[:300]}") from None
        try:
            self.check_signature(who, signature)
        except door.Refused as err:
            # it cannot train with the others: formation no longer waits for it
            self.forget(name, f"refused at registration: {err}")
            raise Refusal(Reason.FAILED_PRECONDITION, f"{who}: {err}") from None
        counts = np.asarray(req.label_counts, dtype=np.int64)
        home: int | None = None
        if req.HasField("home_edge"):
            home = int(req.home_edge)
            if not 0 <= home < self.num_edges:
                raise Refusal(Reason.INVALID_ARGUMENT,
                              f"{who}: home_edge {home} outside [0, {self.num_edges})")
        key = req.supernode_public_key.strip()
        if key:
            try:
                check_supernode_key(key)
            except ValueError as err:
                raise Refusal(Reason.INVALID_ARGUMENT, f"{who}: {err}") from None
        return ClientEntry(name, counts, profile, home, supernode_key=key,
                           compute_device=device, samples_per_s=rate,
                           num_samples=int(req.num_samples),
                           histogram_epsilon=float(req.histogram_epsilon))

    def register(self, entry: ClientEntry, *, open_: bool) -> ClientEntry:
        """Record a registration (a known name while ``open_``: the latest data counts);
        returns the stored client. A new name is refused unless ``open_``; a name that had
        withdrawn comes back as one client (its withdrawal is forgotten, so it is registered
        once and counted once)."""
        clients = self.roster.clients
        known = clients.get(entry.name)
        if known is None:
            if not open_:
                raise Refusal(
                    Reason.FAILED_PRECONDITION,
                    f"registration is closed: coalition formation already ran with "
                    f"{len(clients)} clients; {door.clip(entry.name)} is not one of them",
                )
            if self.roster.withdrawn.pop(entry.name, None) is not None:
                # one name, one client: it came back (fixed, restarted) and is awaited again
                log.info("client %r is back: its registration replaces its withdrawal",
                         entry.name)
            clients[entry.name] = entry
            expected = self.roster.awaited
            self.changed = True
            n = len(clients)
            if n == expected or n <= 3 or n % max(1, expected // 10) == 0:
                log.info("client %r registered (%d/%d)", entry.name, n, expected)
        elif open_:
            known.label_counts, known.profile, known.home_edge = (
                entry.label_counts, entry.profile, entry.home_edge)
            known.compute_device, known.samples_per_s = entry.compute_device, entry.samples_per_s
            self.changed = True
        client = clients[entry.name]
        if entry.supernode_key and entry.supernode_key != client.supernode_key:
            # a restarted client may come with a new SuperNode key: its ES registers that one
            client.supernode_key = entry.supernode_key
        return client

    def ordered(self) -> list[ClientEntry]:
        """The clients in id order, whatever the order they came in: by claimed partition
        index, then the name's natural order (``c2`` before ``c10``); under a task (own data:
        a partition index says nothing) by name alone, as ``fedcure simulate`` orders a clients
        folder, so the same fleet gets the same ids, and forms the same coalitions, every run."""
        clients = self.roster.clients
        if self.cfg.task is not None:
            return [clients[n] for n in sorted(clients)]
        return [clients[n] for n in sorted(clients, key=self._order)]

    def _order(self, name: str) -> tuple[int, list[Any]]:
        return self.roster.claims.get(name, self.num_partitions), natural_key(name)

    def members(self, m: int) -> list[ClientEntry]:
        """The clients of coalition m in id order (none before formation)."""
        return [c for c in self.roster.by_id() if c.edge_id == m and c.client_id is not None]

    def forget_ids(self) -> None:
        """Clear every client's ids (a failed formation)."""
        for c in self.roster.clients.values():
            c.client_id = c.edge_id = None

    # ------------------------------------------------------------------ edges
    def edge_connected(self, m: int, address: str) -> None:
        """Edge m's newest Connect stream opened with its fleet ``address``."""
        self.roster.edge_addresses[m] = address
        self.roster.connected.add(m)

    def edge_left(self, m: int) -> None:
        """Edge m's newest Connect stream ended."""
        self.roster.connected.discard(m)


__all__ = ["Registry"]
