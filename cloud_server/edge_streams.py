"""The event-loop side of the edges: each edge's connection and the task its stream serves.

:class:`EdgeStreams` maps an edge id to its :class:`EdgeSlot`. A Connect call opens a
:class:`Stream` (a newer one for the same edge replaces it), waits in :meth:`EdgeStreams.next`
for a task it has not sent yet, and closes. :meth:`~EdgeStreams.publish` hands new tasks to their
edges' streams. Evaluation tasks (federated evaluation, :mod:`cloud_server.fedeval`) wait in
their edge's queue (:meth:`~EdgeStreams.queue_evaluations`) and go out once, after any training
task the stream has not sent yet; an unsent one is dropped when a newer one comes for its edge.
Event loop only; no gRPC (a replaced stream raises :class:`Refusal` ABORTED).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from cloud_server.refusal import Reason, Refusal
from cloud_server.state import TaskState

log = logging.getLogger("fedcure.cloud")


@dataclass
class EdgeSlot:
    """Edge m on the event loop: whether a stream is open, and the task its stream serves."""

    edge_id: int
    #: set while the edge's newest stream is open (and at close, to wake waiting Registers)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    #: counts Connect calls; a stream whose generation is not the slot's is replaced
    generation: int = 0
    current: TaskState | None = None
    connects: int = 0
    #: evaluation tasks not sent yet, oldest first (each goes out once, to one stream)
    evaluations: list[TaskState] = field(default_factory=list)


@dataclass
class Stream:
    """One Connect call of an edge: its slot, its generation, the last task it sent."""

    slot: EdgeSlot
    generation: int
    last: TaskState | None = None

    @property
    def edge_id(self) -> int:
        return self.slot.edge_id


class EdgeStreams(Mapping[int, EdgeSlot]):
    """Every edge's :class:`EdgeSlot` by id (see the module docstring)."""

    def __init__(self, num_edges: int) -> None:
        self._slots = {m: EdgeSlot(m) for m in range(num_edges)}

    def __getitem__(self, m: int) -> EdgeSlot:
        return self._slots[m]

    def __iter__(self) -> Iterator[int]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    async def open(self, m: int) -> Stream:
        """Edge m connected: a new stream; the older one of the same edge ends."""
        slot = self._slots[m]
        slot.generation += 1
        slot.connects += 1
        slot.connected.set()
        async with slot.cond:
            slot.cond.notify_all()  # a previous stream of this edge ends
        return Stream(slot, slot.generation)

    async def next(self, stream: Stream, done: asyncio.Event) -> TaskState | None:
        """The next task for ``stream`` (marked sent), once there is one it has not sent;
        None once ``done`` is set. Raises :class:`Refusal` ABORTED when a newer stream of the
        same edge replaced it."""
        slot = stream.slot

        def training() -> bool:
            cur = slot.current
            return (cur is not None and cur is not stream.last and cur.reply is None
                    and cur.expired is None)

        def ready() -> bool:
            slot.evaluations[:] = [t for t in slot.evaluations if t.expired is None]
            return (done.is_set() or slot.generation != stream.generation or training()
                    or bool(slot.evaluations))

        async with slot.cond:
            await slot.cond.wait_for(ready)
        if slot.generation != stream.generation:
            raise Refusal(Reason.ABORTED,
                          f"edge {slot.edge_id} connected again; this stream is replaced")
        if done.is_set():
            return None
        if not training():  # an evaluation task: sent once, never again
            task = slot.evaluations.pop(0)
            task.sent_at = time.monotonic()
            return task
        task = slot.current
        assert task is not None
        if task.sent_at is None:
            task.sent_at = time.monotonic()
        stream.last = task
        return task

    def close(self, stream: Stream) -> bool:
        """``stream`` ended; returns whether it was its edge's newest (the edge is gone)."""
        if stream.slot.generation != stream.generation:
            return False
        stream.slot.connected.clear()
        return True

    def hold(self, tasks: list[TaskState]) -> None:
        """Give each edge its task in flight (a resumed run, before any stream opens)."""
        for t in tasks:
            self._slots[t.dispatch.coalition].current = t

    def drop(self, m: int, task: TaskState) -> None:
        """Edge m no longer serves ``task`` (it expired)."""
        slot = self._slots[m]
        if slot.current is task:
            slot.current = None

    async def publish(self, tasks: list[TaskState]) -> None:
        """Make new tasks visible to their edges' streams."""
        for t in tasks:
            slot = self._slots[t.dispatch.coalition]
            slot.current = t
            log.info("round %d: task %s -> edge %d (%d clients, version %d, T^ %.2f s, "
                     "deadline %s)", t.dispatch.round, t.task_id, t.dispatch.coalition,
                     len(t.dispatch.clients), t.dispatch.version, t.dispatch.t_hat_s,
                     f"{t.deadline_s:.1f} s" if math.isfinite(t.deadline_s) else "none")
            async with slot.cond:
                slot.cond.notify_all()

    async def queue_evaluations(self, tasks: list[TaskState]) -> None:
        """Queue evaluation tasks for their edges' streams (an edge's unsent older one is
        dropped: only the newest model's evaluation is worth its time)."""
        for t in tasks:
            slot = self._slots[t.dispatch.coalition]
            for old in slot.evaluations:
                old.expired = "superseded by a newer evaluation"
            slot.evaluations[:] = [t]
            async with slot.cond:
                slot.cond.notify_all()

    async def wake_all(self, *, connected: bool = False) -> None:
        """Wake every stream (the run ended); with ``connected`` also every Register waiting
        for an edge to connect (the cloud is closing)."""
        if connected:
            for slot in self._slots.values():
                slot.connected.set()
        for slot in self._slots.values():
            async with slot.cond:
                slot.cond.notify_all()


__all__ = ["EdgeSlot", "EdgeStreams", "Stream"]
