"""A Flower ``Grid`` double: nodes answer through Python callables, in this process.

``handlers[node_id](message) -> Message | RecordDict | Error | None``: a reply Message, or
its content or error; ``None`` means the node never answers. Like the real grids, ``pull_messages`` returns each reply once and deletes it; asking
again for an id whose reply was already returned yields a "Message Unavailable" error reply
(and is counted in ``repulls``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from uuid import uuid4

from flwr.app import Error, Message
from flwr.serverapp import Grid



@contextmanager
def task_identity(run_id: int = 1, node_id: int = 1, task_id: int = 1) -> Iterator[None]:
    """Set Flower's process-wide TaskIdentity (Message() needs it) and restore it afterwards."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = old


Handler = Callable[[Message], "RecordDict | Error | None"]


class FakeGrid(Grid):
    def __init__(self, handlers: dict[int, Handler], *, delay_pulls: int = 0) -> None:
        self.handlers = dict(handlers)
        self.delay_pulls = delay_pulls  # pulls before a reply becomes visible
        self.sent: list[Message] = []
        self._replies: dict[str, tuple[int, Message]] = {}
        self._returned: set[str] = set()
        self.repulls = 0
        self.pulls = 0

    # Grid API -------------------------------------------------------------------------
    def set_run(self, run) -> None:  # pragma: no cover - unused
        self._run = run

    @property
    def run(self):  # pragma: no cover - unused
        return getattr(self, "_run", None)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.handlers)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            mid = uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.append(msg)
            try:
                out = self.handlers[msg.metadata.dst_node_id](msg)
            except Exception as ex:  # like the runtime: an exception becomes an error reply
                out = Error(code=2, reason=str(type(ex)) + ":<'" + str(ex) + "'>")
            if isinstance(out, Message):
                self._replies[mid] = (0, out)
            elif isinstance(out, Error):
                self._replies[mid] = (0, Message(out, reply_to=msg))
            elif out is not None:
                self._replies[mid] = (0, Message(out, reply_to=msg))
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        self.pulls += 1
        out = []
        for mid in message_ids:
            if mid in self._returned:
                self.repulls += 1
                continue
            if mid in self._replies:
                seen, reply = self._replies[mid]
                if seen >= self.delay_pulls:
                    out.append(reply)
                    del self._replies[mid]
                    self._returned.add(mid)
                else:
                    self._replies[mid] = (seen + 1, reply)
        return out

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover - unused
        raise NotImplementedError
