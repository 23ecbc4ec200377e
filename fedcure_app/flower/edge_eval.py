"""Federated evaluation at an edge: one ``evaluate`` message to each client of a coalition.

:func:`run_edge_evaluation` takes an evaluation task (an :class:`~fedcure_app.tasks.EdgeTask`
with ``evaluate`` set: the global model of version ``version`` and the coalition's clients),
sends every client node one Flower ``evaluate`` message with the model packed as train messages
carry it (:mod:`fedcure_app.flower.packing`) and a ConfigRecord (``client-id``, ``task-id``,
``coalition``, ``version``), waits for the replies at most ``timeout_s`` seconds, and returns
each answering client's sums (:class:`~fedcure_app.tasks.EvalSums`, read from the reply's
metrics by :func:`fedcure_app.flower.eval_metrics.sums_from_metrics`) and the clients that did
not answer usefully (no node, not pushed, no reply in time, an error reply, malformed metrics,
per-class lists of another length than the task's classes). Nothing is trained or aggregated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedcure_app.flower.edge import pull_replies
from fedcure_app.flower.eval_metrics import sums_from_metrics
from fedcure_app.flower.packing import pack
from fedcure_app.protocol.text import printable
from fedcure_app.tasks import EdgeTask, EvalSums

log = logging.getLogger(__name__)


@dataclass
class EdgeEvaluation:
    """What one evaluation task gave: each answering client's sums, the clients missing."""

    task_id: str
    coalition: int
    version: int
    clients: dict[int, EvalSums] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    #: why each missing client is missing (one line each)
    problems: dict[int, str] = field(default_factory=dict)


def _evaluate_message(arrays: ArrayRecord, task: EdgeTask, client: int, node: int,
                      ttl: float | None) -> Message:
    config = ConfigRecord({
        "client-id": int(client), "task-id": str(task.task_id),
        "coalition": int(task.coalition), "version": int(task.version),
    })
    return Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=int(node),
                   message_type=MessageType.EVALUATE, group_id=f"{task.task_id}/eval", ttl=ttl)


def _reply_sums(reply: Message, num_classes: int | None) -> EvalSums:
    """The sums of one evaluate reply; ``ValueError`` saying why it cannot be used."""
    if reply.has_error():
        raise ValueError(f"error reply: {reply.error.reason} (code {reply.error.code})")
    records = reply.content.metric_records
    if len(records) != 1:
        raise ValueError(f"expected one MetricRecord, got {len(records)}")
    sums = sums_from_metrics(next(iter(records.values())))
    if num_classes is not None and len(sums.class_total) != num_classes:
        raise ValueError(f"per-class sums over {len(sums.class_total)} classes, the task has "
                         f"{num_classes}")
    return sums


def run_edge_evaluation(grid: Grid, task: EdgeTask, node_of_client: Mapping[int, int], *,
                        poll_s: float = 0.01, timeout_s: float | None = None,
                        num_classes: int | None = None) -> EdgeEvaluation:
    """Evaluate ``task.arrays`` on every client of ``task.clients`` that has a node in
    ``node_of_client``, waiting at most ``timeout_s`` seconds for the replies (None: for all).
    ``num_classes``: the task's classes, which every reply's per-class sums must cover (None:
    the first answering client's count, all others must agree). See the module docstring."""
    if poll_s <= 0:
        raise ValueError(f"poll_s must be > 0, got {poll_s}")
    out = EdgeEvaluation(task.task_id, int(task.coalition), int(task.version))
    nodes = {}
    for c in task.clients:
        if c in node_of_client:
            nodes[int(c)] = int(node_of_client[c])
        else:
            out.problems[int(c)] = "no Flower node"
    ttl = None if timeout_s is None else max(1.0, 2.0 * float(timeout_s))
    if nodes:
        record = ArrayRecord(pack(task.arrays), keep_input=True)
        msgs = [_evaluate_message(record, task, c, n, ttl) for c, n in nodes.items()]
        ids = list(grid.push_messages(msgs))
        if len(ids) != len(msgs):
            raise RuntimeError(f"grid returned {len(ids)} message ids for {len(msgs)} messages")
        client_of_id = {mid: c for mid, c in zip(ids, nodes) if mid}
        for mid, c in zip(ids, nodes):
            if not mid:
                out.problems[c] = "could not be pushed"
        got, pending = pull_replies(grid, client_of_id, poll_s=poll_s, timeout_s=timeout_s)
        for mid in pending:
            out.problems[client_of_id[mid]] = f"no reply within {timeout_s} s"
        for c in nodes:  # coalition order
            reply = next((r for m, r in got.items() if client_of_id[m] == c), None)
            if reply is None:
                continue
            try:
                sums = _reply_sums(reply, num_classes)
            except ValueError as err:
                out.problems[c] = str(err)
                continue
            if num_classes is None:
                num_classes = len(sums.class_total)
            out.clients[c] = sums
    out.missing = [int(c) for c in task.clients if c not in out.clients]
    for c, why in sorted(out.problems.items()):
        log.warning("evaluation %s: client %d not evaluated: %s", printable(task.task_id), c,
                    printable(why))
    return out


__all__ = ["EdgeEvaluation", "run_edge_evaluation"]
