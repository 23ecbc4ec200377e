"""The edge's live progress inside a task, reported to the cloud with ``EdgeLink.Progress``.

:func:`fedcure_app.flower.edge.run_edge_task` calls :meth:`ProgressReporter.update` (edge round
being trained, clients still training) from the training thread; a background thread sends the
latest state to the cloud whenever it changed, and re-sends it every ``heartbeat_s`` seconds while a
task runs, so the cloud's log moves even while one slow client trains. Reports are best effort: a
failed send is logged at debug level and never delays or fails the task; a cloud without the RPC
(UNIMPLEMENTED) is not asked again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.text import printable

log = logging.getLogger("fedcure.edge")

#: seconds between two reports of an unchanged state while a task runs
HEARTBEAT_S = 5.0


class ProgressReporter:
    """Sends ``ProgressRequest`` messages through ``send`` (e.g. ``EdgeLinkStub.Progress``)."""

    def __init__(self, send: Callable[..., Any], edge_id: int, token: str = "", *,
                 heartbeat_s: float = HEARTBEAT_S, rpc_timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s}")
        self._send = send
        self.edge_id = int(edge_id)
        self.token = token
        self.heartbeat_s = float(heartbeat_s)
        self.rpc_timeout_s = float(rpc_timeout_s)
        self._clock = clock
        self._cond = threading.Condition()
        self._task: tuple[str, int, float] | None = None  # task id, tau_e, start (clock)
        self._state: tuple[int, tuple[int, ...]] | None = None
        self._dirty = False
        self._closed = False
        self._unsupported = False
        #: reports sent (tests, logs)
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="edge-progress", daemon=True)
        self._thread.start()

    def start_task(self, task_id: str, tau_e: int) -> None:
        """A task begins (its first report follows the first :meth:`update`)."""
        with self._cond:
            self._task = (str(task_id), int(tau_e), self._clock())
            self._state = None
            self._dirty = False

    def update(self, edge_round: int, waiting: list[int]) -> None:
        """The task trains edge round ``edge_round`` (0-based; τ_e: all done) and waits for the
        clients ``waiting``."""
        with self._cond:
            if self._task is None:
                return
            self._state = (int(edge_round), tuple(int(c) for c in waiting))
            self._dirty = True
            self._cond.notify_all()

    def end_task(self) -> None:
        """The task is over (answered or given up): stop reporting it."""
        with self._cond:
            self._task = None
            self._state = None
            self._dirty = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=self.rpc_timeout_s + 1.0)

    # ------------------------------------------------------------------ the sender thread
    def _next(self) -> pb.ProgressRequest | None:
        """Wait for something to report (changed state, or a heartbeat); None when closed."""
        with self._cond:
            while not self._closed:
                if self._task is not None and self._state is not None and not self._unsupported:
                    if self._dirty:
                        break
                    self._cond.wait(self.heartbeat_s)
                    if self._task is not None and self._state is not None:
                        break  # a change (dirty) or a heartbeat
                    continue
                self._cond.wait()
            if self._closed:
                return None
            assert self._task is not None and self._state is not None
            task_id, tau_e, started = self._task
            edge_round, waiting = self._state
            self._dirty = False
            return pb.ProgressRequest(
                task_id=task_id, edge_id=self.edge_id, edge_round=edge_round, tau_e=tau_e,
                training_client_ids=list(waiting), elapsed_s=self._clock() - started,
                token=self.token)

    def _run(self) -> None:
        while True:
            req = self._next()
            if req is None:
                return
            try:
                reply = self._send(req, timeout=self.rpc_timeout_s)
                self.sent += 1
            except grpc.RpcError as err:
                code = err.code() if hasattr(err, "code") else None
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("edge %d: the cloud takes no progress reports", self.edge_id)
                    self._unsupported = True
                else:
                    log.debug("edge %d: progress report failed: %s", self.edge_id, printable(err))
                continue
            except ValueError:  # the channel was closed meanwhile
                return
            if reply is not None and not reply.expected:
                with self._cond:
                    if self._task is not None and self._task[0] == req.task_id:
                        self._task = None


__all__ = ["HEARTBEAT_S", "ProgressReporter"]
