"""The edge ServerApp's work: serve the cloud's tasks for one coalition on this SuperLink's grid.

:func:`serve_edge` opens the link to the cloud (``EdgeLink.Connect`` with the edge id and the
address its clients reach the SuperLink at) and, for every task on the stream:

1. maps the task's client ids to Flower nodes (:class:`~edge_server.directory.NodeDirectory`,
   waiting up to ``discovery_timeout_s`` for SuperNodes that have not connected yet);
2. runs τ_e synchronous FedAvg rounds with :func:`fedcure_app.flower.edge.run_edge_task` on a
   :class:`~fedcure_app.flower.edge.CoalitionGrid` (each client's frequency directive travels in its
   ConfigRecord; clients that fail are dropped);
3. answers with ``Submit`` (edge model, sample count, per-client stats, measured latency).

When no client answers an edge round (all of them killed, cut off or restarting), the edge
looks its clients up again and runs the task again, every :data:`TASK_RETRY_S`, for up to
``reconnect_timeout_s``: the cloud takes the late answer and schedules the coalition again,
where an edge that gave up would leave its coalition out. When every client answered and every
answer was refused (a NaN loss or model, a model moved beyond the client step bound: running
the task again would bring the same answers), the edge logs it, gives the task up unanswered
(the cloud's deadline then takes the coalition out) and takes the next task.

A task with ``evaluate`` set is an evaluation task (federated evaluation): the edge asks each
client of the coalition to evaluate the task's model on its held-out part and answers with
``EdgeLink.Evaluated`` instead (:mod:`edge_server.evaluation`; no training, no Submit). Tasks are
served in the order the stream brings them; the seconds a training task waited behind an
evaluation count as its start-up (left out of T̂).

The stream ending with status OK means training is over: :func:`serve_edge` returns. A cloud
that goes away (UNAVAILABLE: stopped, restarting, or behind a partition; CANCELLED: a call it
cut while stopping) is reconnected to for ``reconnect_timeout_s``; the cloud resends an
unanswered task. A finished task's Submit is asked again for as long (a late answer is still
aggregated, within the late-answer bound). A cloud that finished ends the stream and then stops,
and an edge may see a call fail before it sees the stream's end: a failure is taken for the
end of training when the end follows within :data:`END_GRACE_S`. A Submit the cloud refuses
(INVALID_ARGUMENT: the coalition's model failed its norm screen; FAILED_PRECONDITION,
NOT_FOUND: the task is no longer expected) is logged and the edge takes the next task. Any
other refusal raises :class:`EdgeRoleError` with one line.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from flwr.serverapp import Grid

from edge_server.directory import NodeDirectory
from edge_server.evaluation import serve_evaluation
from edge_server.progress import ProgressReporter
from edge_server.settings import EdgeSettings
from fedcure_app.flower.edge import CoalitionGrid, EdgeTaskError, run_edge_task
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc
from fedcure_app.protocol.codec import EdgeLinkClient, result_to_wire, task_from_proto
from fedcure_app.protocol.text import printable

log = logging.getLogger("fedcure.edge")


#: seconds between two asks of a cloud that did not answer a Submit
SUBMIT_RETRY_S = 1.0
#: seconds between runs of a task none of whose clients answered (after the first rerun)
TASK_RETRY_S = 2.0
#: seconds one Submit may take (the cloud decodes, checks, aggregates and checkpoints)
SUBMIT_TIMEOUT_S = 300.0
#: Submit failures that mean "not answered" (asked again), not "refused"; RESOURCE_EXHAUSTED
#: is a cloud whose disk is full: it takes the update once it can write it durably; CANCELLED
#: is a call the cloud cut while stopping (its refusals never use that code)
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED)
#: task-stream failures after which the edge connects again: a cloud gone, restarting or
#: stopping (a stopping server cancels the calls still open)
RECONNECTED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
#: seconds an edge whose call failed waits for the task stream's normal end before it calls
#: the failure a refusal: a cloud that finished ends the stream and then stops, and the two
#: may reach the edge in either order
END_GRACE_S = 2.0


class EdgeRoleError(RuntimeError):
    """The edge cannot go on (cloud refused it, or its clients never showed up)."""


@dataclass
class EdgeStats:
    """What one edge did (for its log and tests)."""

    tasks: int = 0
    edge_rounds: int = 0
    seconds: float = 0.0
    dropped: list[int] = field(default_factory=list)
    reconnects: int = 0


def open_cloud_channel(settings: EdgeSettings) -> grpc.Channel:
    """The gRPC channel to the cloud, TLS or plaintext as the settings say."""
    from fedcure_app.protocol.channel import open_channel

    return open_channel(settings.cloud, tls_ca=settings.tls_ca, tls_cert=settings.cloud_cert,
                        tls_key=settings.cloud_key, insecure=settings.insecure)


def watch_parent(pid: int | None, on_gone: Any = None, interval_s: float = 0.5) -> None:
    """Exit this process (code 3) when process ``pid`` is gone: the ServerApp must not outlive
    the ``fedcure-edge`` that started it (``interval_s``: how often to look where the process
    cannot be waited on, :func:`fedcure_app.runtime.processes.wait_gone`)."""
    if not pid:
        return
    from fedcure_app.runtime.processes import wait_gone

    def run() -> None:
        wait_gone(pid, interval_s)
        log.error("fedcure-edge (pid %d) is gone: the edge ServerApp stops", pid)
        if on_gone is not None:
            on_gone()
        os._exit(3)

    threading.Thread(target=run, name="watch-parent", daemon=True).start()


class EdgeServer:
    """One edge's link to the cloud and its task loop (see the module docstring)."""

    def __init__(self, grid: Grid, settings: EdgeSettings,
                 channel: grpc.Channel | None = None) -> None:
        self.grid = grid
        self.settings = settings
        self.channel = channel if channel is not None else open_cloud_channel(settings)
        self.link = EdgeLinkClient(self.channel)
        #: live progress inside a task -> EdgeLink.Progress (edge round, clients training)
        self.progress = ProgressReporter(pb_grpc.EdgeLinkStub(self.channel).Progress,
                                         settings.edge_id, settings.token)
        self.directory = NodeDirectory(grid)
        #: EdgeLink.Evaluated: the answer to an evaluation task
        self.evaluated = pb_grpc.EdgeLinkStub(self.channel).Evaluated
        self.stats = EdgeStats()
        self._stop = threading.Event()
        self._over = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        self.channel.close()
        self.progress.close()

    # ------------------------------------------------------------------ the loop
    @property
    def over(self) -> bool:
        """Whether the cloud ended the task stream normally (training is over)."""
        return self._over.is_set()

    def _read(self, stream: Any, inbox: queue.Queue) -> None:
        """Move the stream's tasks to ``inbox`` with the monotonic second each came; then
        ("end", None) or ("error", err)."""
        try:
            for wire in stream:
                inbox.put(("task", (wire, time.monotonic())))
            self._over.set()
            inbox.put(("end", None))
        except grpc.RpcError as err:
            inbox.put(("error", err))

    def run(self) -> EdgeStats:
        """Serve tasks until the cloud ends the stream; return what was done.

        The stream is read in a background thread, so the end of training is noticed even
        while a task is being served (its Submit is then not retried).
        """
        s = self.settings
        lost_since: float | None = None
        while not self._stop.is_set():
            stream = self.link.connect(pb.ConnectRequest(
                edge_id=s.edge_id, address=s.advertise, token=s.token))
            inbox: queue.Queue = queue.Queue()
            threading.Thread(target=self._read, args=(stream, inbox), name="edge-link",
                             daemon=True).start()
            try:
                while True:
                    kind, item = inbox.get()
                    if kind == "task":
                        lost_since = None
                        self._serve_task(*item)
                        continue
                    if kind == "end":
                        log.info("edge %d: the cloud ended the task stream (training over): "
                                 "%d tasks, %d edge rounds, %.1f s training", s.edge_id,
                                 self.stats.tasks, self.stats.edge_rounds, self.stats.seconds)
                        return self.stats
                    raise item
            except grpc.RpcError as err:
                if self.over:  # e.g. a Submit after the cloud finished and went away
                    return self.stats
                code = err.code() if hasattr(err, "code") else None
                detail = err.details() if hasattr(err, "details") else str(err)
                if self._stop.is_set():
                    break
                if code in RECONNECTED:
                    now = time.monotonic()
                    lost_since = lost_since or now
                    if now - lost_since > s.reconnect_timeout_s:
                        raise EdgeRoleError(
                            f"edge {s.edge_id}: lost the cloud at {s.cloud} for "
                            f"{s.reconnect_timeout_s:.0f} s ({detail})") from None
                    self.stats.reconnects += 1
                    if self._over.wait(1.0):  # the stream ended normally meanwhile
                        return self.stats
                    log.warning("edge %d: cloud unavailable (%s: %s); reconnecting",
                                s.edge_id, code.name, printable(detail))
                    continue
                if self._over.wait(END_GRACE_S):  # a failure that raced the end of training
                    return self.stats
                name = code.name if code is not None else "ERROR"
                raise EdgeRoleError(f"edge {s.edge_id}: the cloud refused the link "
                                    f"({name}: {printable(detail)})") from None
        return self.stats

    def _serve_task(self, wire: Any, received_at: float | None = None) -> None:
        s = self.settings
        task = task_from_proto(wire)
        if task.evaluate:
            serve_evaluation(self.grid, self.directory, s, task, self.evaluated,
                             stop=lambda: self._stop.is_set() or self._over.is_set())
            return
        t0 = time.monotonic()
        # waited in the inbox behind an earlier task (an evaluation): start-up, not training
        queued = 0.0 if received_at is None else max(0.0, t0 - received_at)
        t0 -= queued
        tid = printable(task.task_id)  # the cloud's text: escaped wherever it is logged
        log.info("edge %d: task %s (version %d, clients %s, tau_e %d, tau_c %d, directives %s)",
                 s.edge_id, tid, task.version, list(task.clients), task.tau_e,
                 task.tau_c, {c: round(f, 3) for c, f in task.frequencies_ghz.items()})
        result = None
        self.progress.start_task(task.task_id, task.tau_e)
        self.progress.update(0, list(task.clients))  # reported while its clients are looked up
        waited = queued  # for clients to come online: start-up, not training (left out of T^)
        # clients that all fail an edge round (killed, cut off, restarting) are looked for and
        # the task run again, until reconnect_timeout_s: the cloud takes a late answer, while
        # an edge that gave up would leave its coalition out for good
        give_up_at = t0 + queued + s.reconnect_timeout_s
        attempt = 0
        while True:
            t_look = time.monotonic()
            mapping = self.directory.resolve(
                task.clients, s.discovery_timeout_s,
                stop=lambda: self._stop.is_set() or self._over.is_set())
            waited += time.monotonic() - t_look
            if self.over:
                return
            missing = [c for c in task.clients if c not in mapping]
            if not mapping:
                raise EdgeRoleError(
                    f"edge {s.edge_id}: none of its clients {list(task.clients)} connected a "
                    f"SuperNode to {s.advertise} within {s.discovery_timeout_s:.0f} s")
            if missing:
                log.warning("edge %d: clients %s have no SuperNode; training without them",
                            s.edge_id, missing)
            nodes = [mapping[c] for c in task.clients if c in mapping]
            try:
                result = run_edge_task(
                    CoalitionGrid(self.grid, nodes), task, mapping, poll_s=s.poll_s,
                    timeout_s=s.edge_timeout_s, on_progress=self.progress.update,
                    on_round=lambda r, wall, done, t=task: log.info(
                        "edge %d: task %s edge round %d/%d: %.3f s wall, clients %s",
                        s.edge_id, tid, r, t.tau_e, wall, done))
                break
            except EdgeTaskError as err:
                if err.refused:  # its clients answered, each with an update refused
                    log.warning("edge %d: %s; task given up (the same task would get the same "
                                "answers), taking the next one", s.edge_id, printable(err))
                    self.progress.end_task()
                    return
                if time.monotonic() >= give_up_at:
                    raise EdgeRoleError(f"edge {s.edge_id}: {err} (for {s.reconnect_timeout_s:.0f}"
                                        " s)") from None
                log.warning("edge %d: %s; looking for its clients again", s.edge_id,
                            printable(err))
                if attempt and self._stop.wait(TASK_RETRY_S):
                    return
                attempt += 1
                self.directory.refresh()
        assert result is not None
        latency = time.monotonic() - t0
        result = replace(result, startup_s=min(latency, result.startup_s + waited))
        if result.startup_s > 0.05:
            log.info("edge %d: task %s: %.2f s of its %.2f s were start-up (clients coming "
                     "online or loading), reported apart", s.edge_id, tid,
                     result.startup_s, latency)
        reply = self._submit(result, latency)
        self.progress.end_task()
        self.stats.tasks += 1
        self.stats.edge_rounds += task.tau_e
        self.stats.seconds += latency
        self.stats.dropped.extend(result.dropped)
        if reply is not None:
            log.info("edge %d: task %s done in %.2f s (%d samples%s) -> %s", s.edge_id,
                     tid, latency, result.num_samples,
                     f", dropped {result.dropped}" if result.dropped else "",
                     printable(reply.detail) or ("accepted" if reply.accepted
                                                 else "not accepted"))

    def _submit(self, result: Any, latency: float) -> pb.SubmitReply | None:
        """Submit an edge model; None when the cloud no longer wants it (the task expired past
        the late-answer bound, or is unknown) or training ended.

        A cloud that does not answer (UNAVAILABLE, DEADLINE_EXCEEDED: gone, restarting, or
        behind a partition; RESOURCE_EXHAUSTED: its disk is full) is asked again every
        :data:`SUBMIT_RETRY_S` seconds for ``reconnect_timeout_s`` counted from the first
        failure (a call that hangs until the keepalive gives up does not use up the budget);
        the cloud answers a repeated Submit as it answered the first, so the result is taken at
        most once. Past the budget the edge gives up (:class:`EdgeRoleError`) instead of
        dropping the result and serving on."""
        s = self.settings
        wire = result_to_wire(result, edge_id=s.edge_id, latency_s=latency, token=s.token)
        failing_since: float | None = None
        while True:
            try:
                return self.link.submit(wire, timeout=SUBMIT_TIMEOUT_S)
            except grpc.RpcError as err:
                code = err.code()
                if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                            grpc.StatusCode.INVALID_ARGUMENT):
                    # INVALID_ARGUMENT: the coalition's model was refused (the cloud's norm
                    # screen): this task is lost, the edge takes the next one
                    log.warning("edge %d: the cloud did not take task %s (%s: %s)", s.edge_id,
                                printable(result.task_id), code.name, printable(err.details()))
                    return None
                if self.over or (code not in RETRIED and self._over.wait(END_GRACE_S)):
                    return self._ended_before(result.task_id)
                if code not in RETRIED or self._stop.is_set():
                    raise
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("edge %d: cannot submit task %s (%s: %s); asking again for up "
                                "to %.0f s", s.edge_id, printable(result.task_id), code.name,
                                printable(err.details()), s.reconnect_timeout_s)
                elif now - failing_since > s.reconnect_timeout_s:
                    raise EdgeRoleError(
                        f"edge {s.edge_id}: the cloud at {s.cloud} did not take task "
                        f"{printable(result.task_id)} for {s.reconnect_timeout_s:.0f} s "
                        f"({code.name}: {printable(err.details())})") from None
                if self._over.wait(SUBMIT_RETRY_S):
                    return self._ended_before(result.task_id)

    def _ended_before(self, task_id: str) -> None:
        """Training ended before the cloud took ``task_id``: say so; nothing to submit."""
        log.info("edge %d: training ended before task %s was submitted", self.settings.edge_id,
                 printable(task_id))


def write_status(path: str | None, state: str, detail: str = "", **extra: Any) -> None:
    """Write the ServerApp's final status JSON (``state``: done | failed) atomically."""
    if not path:
        return
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"state": state, "detail": detail, **extra}, f)
    os.replace(tmp, path)


def serve_edge(grid: Grid, settings: EdgeSettings) -> EdgeStats:
    """Run the edge role on ``grid`` (the ServerApp's entry); writes the status file."""
    handler = None
    if settings.log_file:
        handler = logging.FileHandler(settings.log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                               "%H:%M:%S"))
        for name in ("fedcure", "edge_server", "fedcure_app"):
            lg = logging.getLogger(name)
            lg.addHandler(handler)
            lg.setLevel(logging.INFO)
    try:
        server = EdgeServer(grid, settings)
        watch_parent(settings.parent_pid, on_gone=lambda: write_status(
            settings.status_file, "failed", "fedcure-edge went away"))
        stats = server.run()
        write_status(settings.status_file, "done", tasks=stats.tasks,
                     edge_rounds=stats.edge_rounds, dropped=stats.dropped)
        return stats
    except Exception as err:
        log.error("%s", printable(err, 2000))
        write_status(settings.status_file, "failed", str(err))
        raise
    finally:
        if handler is not None:
            handler.flush()


__all__ = ["EdgeRoleError", "EdgeServer", "EdgeStats", "RETRIED", "SUBMIT_RETRY_S",
           "SUBMIT_TIMEOUT_S", "serve_edge", "write_status"]
