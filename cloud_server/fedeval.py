"""Federated evaluation: the global model evaluated on the clients' held-out parts.

A cloud whose clients train on their own data (``cfg.task``) and that has no central test set
evaluates the global model where the data are. At formation (the initial model), every
``eval_every`` global rounds and after the last one, :class:`FederatedEvaluations` makes one
evaluation task per edge (:func:`evaluation_tasks`: a ``Task`` with ``evaluate`` set, the
version's model and the coalition's clients), which the edges' streams carry behind any
training task (``EdgeStreams.queue_evaluations``). Each edge answers ``EdgeLink.Evaluated``
with its clients' sums (:class:`fedcure_app.tasks.EvalSums`); :func:`combine` adds them up:

    accuracy = Σ correct / Σ samples,  loss = Σ loss_sum / Σ samples (nats),
    class_accuracy[k] = Σ class_correct[k] / Σ class_total[k]  (None: no sample of class k)

which is exactly what a central evaluation on the union of the held-out parts gives (the loss to
float rounding). The evaluation lands on the record of the round it was started at
(``accuracy``, ``loss``, ``evaluation_clients``, ``evaluation_samples``, ``class_accuracy``),
the initial one on ``initial_accuracy`` (and ``initial_evaluation``), and is recomputed as each
edge answers, for as long as the run has not written its results: a late or missing edge never
holds training. Only the final model's evaluation is waited for, a bounded time (the run loop's
``final_eval_wait_s``), before the results are written.

Event loop only (no gRPC besides :func:`evaluated_handler`); recording goes through the
formed run's lock (:meth:`cloud_server.formed.FormedRun.record_federated`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import WithModel, evaluation_from_proto
from fedcure_app.strategy import Dispatch
from fedcure_app.tasks import EvalSums
from cloud_server.refusal import Reason, Refusal
from cloud_server.state import TaskState

log = logging.getLogger("fedcure.cloud")


@dataclass(frozen=True)
class FederatedResult:
    """One evaluation of a global model over the clients that answered (see the module
    docstring): accuracy in [0, 1] and loss in nats (None: no sample answered)."""

    accuracy: float | None
    loss: float | None
    clients: int
    samples: int
    class_accuracy: tuple[float | None, ...]

    def fields(self) -> dict[str, Any]:
        """The record's keys for it."""
        return {"accuracy": self.accuracy, "loss": self.loss,
                "evaluation_clients": self.clients, "evaluation_samples": self.samples,
                "class_accuracy": list(self.class_accuracy)}


def combine(evaluations: Iterable[EvalSums], num_classes: int) -> FederatedResult:
    """The sample-weighted evaluation over clients' sums (see the module docstring). Clients
    without a held-out part (0 samples) do not count as answering clients."""
    evs = [e for e in evaluations if e.samples > 0]
    for e in evs:
        if len(e.class_total) != num_classes:
            raise ValueError(f"per-class sums over {len(e.class_total)} classes, the task has "
                             f"{num_classes}")
    samples = sum(e.samples for e in evs)
    correct = sum(e.correct for e in evs)
    loss = math.fsum(e.loss_sum for e in evs)
    cc = np.zeros(num_classes, dtype=np.int64)
    ct = np.zeros(num_classes, dtype=np.int64)
    for e in evs:
        cc += np.asarray(e.class_correct, dtype=np.int64)
        ct += np.asarray(e.class_total, dtype=np.int64)
    return FederatedResult(
        accuracy=correct / samples if samples else None,
        loss=loss / samples if samples else None, clients=len(evs), samples=int(samples),
        class_accuracy=tuple(float(c) / float(t) if t else None for c, t in zip(cc, ct)))


def federated_mode(cfg: FedCureConfig, evaluator: Any, federated: bool | None) -> bool:
    """Whether a cloud evaluates on the clients' held-out parts: ``federated`` as given, or
    (None) when its clients train on their own data (``cfg.task``) and it has no central
    ``evaluator``; ``ValueError`` for both an evaluator and federated evaluation."""
    if federated is None:
        return cfg.task is not None and evaluator is None
    if federated and evaluator is not None:
        raise ValueError("an evaluator (a central test set) and federated evaluation exclude "
                         "each other")
    return bool(federated)


def evaluation_tasks(cfg: FedCureConfig, version: int, round_: int,
                     assignment: Sequence[int], model: bytes) -> list[TaskState]:
    """One evaluation task per edge with clients: global model ``version`` (its encoded
    ``model``, shared), started at global round ``round_`` (0: the initial model)."""
    out = []
    assign = np.asarray(assignment)
    for m in range(cfg.federation.num_edges):
        clients = tuple(int(c) for c in np.flatnonzero(assign == m))
        if not clients:
            continue
        task_id = f"eval-r{round_}-c{m}-v{version}"
        d = Dispatch(round=int(round_), coalition=m, version=int(version), clients=clients,
                     frequencies_ghz={}, t_hat_round_s=0.0, t_hat_s=0.0)
        msg = pb.Task(task_id=task_id, coalition=m, version=int(version),
                      client_ids=list(clients), round=int(round_), evaluate=True,
                      batch_size=cfg.method.batch_size)
        out.append(TaskState(task_id, d, WithModel(msg, model), time.monotonic()))
    return out


@dataclass
class Collection:
    """One evaluation of one global model: the tasks sent, the sums each client answered."""

    version: int
    round: int
    #: the round's record it lands on (None: the initial model)
    record: dict[str, Any] | None
    tasks: dict[int, TaskState]
    answers: dict[int, EvalSums] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)
    missing: set[int] = field(default_factory=set)

    def settled(self, connected: Callable[[int], bool]) -> bool:
        """Every asked edge that is connected has answered."""
        return all(m in self.answered or not connected(m) for m in self.tasks)


class FederatedEvaluations:
    """The run's federated evaluations (see the module docstring).

    Parameters
    ----------
    cfg:
        ``run.eval_every``, ``federation.num_classes``.
    make_tasks:
        ``round -> evaluation tasks`` of the current global model (the formed run's, under its
        lock: :meth:`cloud_server.formed.FormedRun.evaluation_tasks`).
    record:
        ``(record or None, result)``: keep an evaluation (the formed run's, under its lock).
    queue:
        Hands evaluation tasks to the edges' streams (``EdgeStreams.queue_evaluations``).
    """

    def __init__(self, cfg: FedCureConfig, *,
                 make_tasks: Callable[[int], list[TaskState]],
                 record: Callable[[dict[str, Any] | None, FederatedResult], None],
                 queue: Callable[[list[TaskState]], Any]) -> None:
        self.cfg = cfg
        self._make_tasks = make_tasks
        self._record = record
        self._queue = queue
        #: evaluations by task id of their tasks
        self._by_task: dict[str, Collection] = {}
        #: evaluations by global round they were started at
        self.by_round: dict[int, Collection] = {}
        #: no answer is taken any more (the results are being written)
        self.closed = False
        self._changed = asyncio.Event()

    def due(self, round_: int, finished: bool) -> bool:
        """An evaluation starts after global round ``round_`` (every ``eval_every``, the last)."""
        return round_ % self.cfg.run.eval_every == 0 or finished

    async def start(self, record: dict[str, Any] | None) -> Collection:
        """Evaluate the current global model: one task per edge, queued on the streams; its
        result lands on ``record`` (None: the initial model, at formation)."""
        round_ = 0 if record is None else int(record["round"])
        tasks = await asyncio.to_thread(self._make_tasks, round_)
        col = Collection(version=tasks[0].dispatch.version if tasks else -1, round=round_,
                         record=record, tasks={t.dispatch.coalition: t for t in tasks})
        for t in tasks:
            self._by_task[t.task_id] = col
        self.by_round[round_] = col
        await self._queue(tasks)
        log.info("round %d: federated evaluation of version %d sent to edges %s", round_,
                 col.version, sorted(col.tasks))
        return col

    async def answer(self, m: int, req: pb.EvaluatedRequest) -> bool:
        """Edge m's ``Evaluated``: checked, kept, and the evaluation recomputed and recorded;
        False when no answer is taken any more. Raises :class:`Refusal` (NOT_FOUND: unknown
        task; INVALID_ARGUMENT: another edge's task, another version, a client outside the
        coalition, inconsistent sums)."""
        col = self._by_task.get(req.task_id)
        if col is None:
            raise Refusal(Reason.NOT_FOUND, f"unknown evaluation task {req.task_id[:80]!r}")
        task = col.tasks.get(m)
        if task is None or task.task_id != req.task_id:
            raise Refusal(Reason.INVALID_ARGUMENT,
                          f"evaluation task {req.task_id} is not edge {m}'s")
        if int(req.version) != col.version:
            raise Refusal(Reason.INVALID_ARGUMENT, f"evaluation task {req.task_id} is of "
                          f"version {col.version}, not {req.version}")
        members = set(task.dispatch.clients)
        k = self.cfg.federation.num_classes
        got: dict[int, EvalSums] = {}
        try:
            for ev in req.clients:
                c, sums = evaluation_from_proto(ev)
                if c not in members or c in got:
                    raise ValueError(f"client {c} is not in coalition {m} or is listed twice")
                if len(sums.class_total) != k:
                    raise ValueError(f"client {c}: per-class sums over "
                                     f"{len(sums.class_total)} classes, the task has {k}")
                got[c] = sums
        except ValueError as err:
            raise Refusal(Reason.INVALID_ARGUMENT, f"evaluation {req.task_id}: {err}") from None
        if self.closed:
            return False
        for c in members:  # an edge answering again replaces its clients' answers
            col.answers.pop(c, None)
        col.answers.update(got)
        col.answered.add(m)
        col.missing = (col.missing - members) | {int(c) for c in req.missing_client_ids
                                                 if c in members}
        result = combine(col.answers.values(), k)
        await asyncio.to_thread(self._record, col.record, result)
        log.info("round %d: federated evaluation of version %d: edge %d answered (%d clients)"
                 "%s; now %d clients, %d samples%s", col.round, col.version, m, len(got),
                 f", missing {sorted(req.missing_client_ids)}" if req.missing_client_ids else "",
                 result.clients, result.samples,
                 "" if result.accuracy is None else f", accuracy {100 * result.accuracy:.2f}%")
        self._changed.set()
        return True

    async def settle(self, round_: int, connected: Callable[[int], bool], timeout_s: float
                     ) -> bool:
        """Wait until every connected edge asked in round ``round_``'s evaluation answered, at
        most ``timeout_s`` seconds; whether it settled."""
        col = self.by_round.get(round_)
        if col is None:
            return True
        wait = float(timeout_s)
        end = time.monotonic() + wait
        while not col.settled(connected):
            left = end - time.monotonic()
            if left <= 0:
                log.warning("round %d: federated evaluation of version %d: no answer from "
                            "edges %s within %.0f s; the result counts the edges that "
                            "answered", round_, col.version,
                            sorted(set(col.tasks) - col.answered), wait)
                return False
            self._changed.clear()
            try:  # an answer, or every second (an edge disconnecting changes `connected`)
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return True

    def close(self) -> None:
        """Take no more answers (the results are being written); unsent tasks are dropped."""
        self.closed = True
        for col in self.by_round.values():
            for t in col.tasks.values():
                if t.expired is None:
                    t.expired = "the run ended"


def evaluated_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Serves ``fedcure.v1.EdgeLink/Evaluated`` with ``servicer.Evaluated`` (next to the
    codec's EdgeLink handler, which serves the other EdgeLink methods)."""
    return grpc.method_handlers_generic_handler("fedcure.v1.EdgeLink", {
        "Evaluated": grpc.unary_unary_rpc_method_handler(
            servicer.Evaluated, request_deserializer=pb.EvaluatedRequest.FromString,
            response_serializer=pb.EvaluatedReply.SerializeToString),
    })


__all__ = ["Collection", "FederatedEvaluations", "FederatedResult", "combine",
           "evaluated_handler", "evaluation_tasks", "federated_mode"]
