"""The cloud's state as plain dataclasses, and their checkpoint form (``to_state``/``from_state``).

Nothing here knows gRPC or the event loop: :mod:`cloud_server.controller` keeps these objects,
:mod:`cloud_server.checkpoint` stores what ``to_state`` returns, and the servicer
(:mod:`cloud_server.service`) only reads them.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcure_app.devices import DeviceProfile
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import WithModel
from fedcure_app.strategy import Dispatch


class Phase(enum.IntEnum):
    """Where the run stands; the values are ``Monitor.Status``'s ``StatusReply.Phase``."""

    REGISTERING = pb.StatusReply.REGISTERING  # waiting for clients (formation may be running)
    TRAINING = pb.StatusReply.TRAINING  # coalitions formed, tasks flowing
    DONE = pb.StatusReply.DONE  # global_rounds reached (results being or already written)


@dataclass
class ClientEntry:
    """One registered client: what it announced and, after formation, its ids."""

    name: str
    label_counts: np.ndarray
    profile: DeviceProfile
    home_edge: int | None
    client_id: int | None = None
    edge_id: int | None = None
    #: the client's SuperNode public key (OpenSSH text) for SuperNode authentication; "" none
    supernode_key: str = ""

    def to_state(self) -> dict[str, Any]:
        """JSON-safe form for the checkpoint."""
        return {"name": self.name, "label_counts": self.label_counts.tolist(),
                "profile": self.profile.model_dump(mode="json"), "home_edge": self.home_edge,
                "client_id": self.client_id, "edge_id": self.edge_id,
                "supernode_key": self.supernode_key}

    @classmethod
    def from_state(cls, c: dict[str, Any]) -> "ClientEntry":
        """Inverse of :meth:`to_state` (a formed client: ids set)."""
        return cls(c["name"], np.asarray(c["label_counts"], dtype=np.int64),
                   DeviceProfile(**c["profile"]), c["home_edge"], int(c["client_id"]),
                   int(c["edge_id"]), supernode_key=str(c.get("supernode_key", "")))


def reply_state(reply: pb.SubmitReply | None) -> dict[str, Any] | None:
    """A Submit answer as JSON (None stays None)."""
    if reply is None:
        return None
    return {"accepted": bool(reply.accepted), "version": int(reply.version),
            "detail": str(reply.detail)}


@dataclass
class TaskState:
    """One dispatched coalition task: the message sent to the edge and what became of it.

    Times are ``time.monotonic()`` seconds.
    """

    task_id: str
    dispatch: Dispatch
    #: the Task message (model beside it: the encoded global model, shared by the version's tasks)
    message: WithModel
    dispatched_at: float
    sent_at: float | None = None
    reply: pb.SubmitReply | None = None
    #: a Submit being applied right now (duplicates wait on it); owned by the servicer's loop
    pending: Any = None
    #: why the task stopped being expected (its deadline passed), None while it is
    expired: str | None = None
    #: seconds after ``dispatched_at`` by which the answer must arrive
    deadline_s: float = math.inf

    def to_state(self, now_mono: float, now_wall: float) -> dict[str, Any]:
        """JSON-safe form for the checkpoint (the send time as wall-clock seconds)."""
        d, sent = self.dispatch, self.sent_at
        return {"coalition": d.coalition, "round": d.round, "version": d.version,
                "reply": reply_state(self.reply), "expired": self.expired,
                "sent_wall": None if sent is None else now_wall - (now_mono - sent)}

    @staticmethod
    def sent_from_state(t: dict[str, Any], now_mono: float, now_wall: float) -> float | None:
        """The monotonic send time of a checkpointed task (None: never sent)."""
        if t["sent_wall"] is None:
            return None
        return now_mono - max(0.0, now_wall - t["sent_wall"])

    @classmethod
    def finished_from_state(cls, task_id: str, t: dict[str, Any]) -> "TaskState":
        """An answered or expired task of a checkpoint (no model, only what its id needs)."""
        d = Dispatch(round=int(t["round"]), coalition=int(t["coalition"]),
                     version=int(t["version"]), clients=(), frequencies_ghz={},
                     t_hat_round_s=0.0, t_hat_s=0.0)
        task = cls(task_id, d, WithModel(pb.Task(task_id=task_id), b""), time.monotonic())
        if t["reply"] is not None:
            task.reply = pb.SubmitReply(**t["reply"])
        task.expired = t["expired"]
        return task


@dataclass
class Arrival:
    """What applying one edge model gives: its round's record, the new tasks, the end."""

    record: dict[str, Any]
    new: list[TaskState]
    finished: bool


def jsonable(obj: Any) -> Any:
    """numpy scalars/arrays to Python, recursively."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


__all__ = ["Arrival", "ClientEntry", "Phase", "TaskState", "jsonable", "reply_state"]
