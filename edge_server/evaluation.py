"""The edge's part of federated evaluation: an evaluation task in, ``EdgeLink.Evaluated`` out.

A Task with ``evaluate`` set asks the edge to evaluate the global model of version ``version``
on the held-out part of every client of its coalition. :func:`serve_evaluation` maps the
clients to their Flower nodes (as a training task does), sends each one ``evaluate`` message
(:func:`fedcure_app.flower.edge_eval.run_edge_evaluation`), waits for the replies at most the
edge timeout (:data:`EVAL_TIMEOUT_S` when the edge has none: a dead client must not hold the
edge), and answers with ``EdgeLink.Evaluated``: each answering client's sums and the clients
missing. Nothing is trained and nothing is submitted. The answer is best effort: a cloud that
does not answer is asked again for at most :data:`EVALUATED_RETRY_BUDGET_S`, a refusal is
logged, and the edge serves its next task either way (a missing evaluation never stops it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from edge_server.directory import NodeDirectory
from edge_server.settings import EdgeSettings
from fedcure_app.flower.edge import CoalitionGrid
from fedcure_app.flower.edge_eval import EdgeEvaluation, run_edge_evaluation
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.codec import evaluation_to_proto
from fedcure_app.protocol.text import printable
from fedcure_app.tasks import EdgeTask

log = logging.getLogger("fedcure.edge")

#: seconds an evaluation waits for its clients' replies when the edge has no edge timeout
EVAL_TIMEOUT_S = 120.0
#: seconds the edge keeps asking a cloud that does not answer an ``Evaluated``
EVALUATED_RETRY_BUDGET_S = 30.0
#: seconds one ``Evaluated`` call may take
EVALUATED_TIMEOUT_S = 30.0
#: ``Evaluated`` failures that mean "not answered" (asked again)
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def evaluated_request(result: EdgeEvaluation, edge_id: int, token: str
                      ) -> pb.EvaluatedRequest:
    """The ``Evaluated`` message of an edge's evaluation."""
    return pb.EvaluatedRequest(
        task_id=result.task_id, edge_id=int(edge_id), version=int(result.version),
        clients=[evaluation_to_proto(c, s) for c, s in sorted(result.clients.items())],
        missing_client_ids=[int(c) for c in result.missing], token=token)


def send_evaluated(send: Callable[..., Any], request: pb.EvaluatedRequest, *,
                   stop: Callable[[], bool] = lambda: False,
                   budget_s: float = EVALUATED_RETRY_BUDGET_S, retry_s: float = 1.0,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> pb.EvaluatedReply | None:
    """Call ``send(request, timeout=…)`` (``EdgeLinkStub.Evaluated``); ask again while the
    cloud does not answer, for ``budget_s`` seconds; None when it refused or never answered
    (logged: the evaluation is lost, the edge goes on)."""
    first: float | None = None
    while True:
        try:
            return send(request, timeout=EVALUATED_TIMEOUT_S)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            detail = err.details() if hasattr(err, "details") else str(err)
            now = clock()
            first = now if first is None else first
            if code not in RETRIED or stop() or now - first > budget_s:
                log.warning("edge %d: the evaluation %s was not taken (%s: %s)",
                            request.edge_id, printable(request.task_id),
                            code.name if code is not None else "ERROR", printable(detail))
                return None
            sleep(retry_s)


def serve_evaluation(grid: Any, directory: NodeDirectory, settings: EdgeSettings,
                     task: EdgeTask, send: Callable[..., Any], *,
                     stop: Callable[[], bool] = lambda: False) -> pb.EvaluatedReply | None:
    """Evaluate ``task``'s model on its coalition's held-out parts and answer the cloud (see
    the module docstring); returns the cloud's reply (None: not taken)."""
    s = settings
    t0 = time.monotonic()
    mapping = directory.resolve(task.clients, s.discovery_timeout_s, stop=stop)
    if stop():
        return None
    nodes = [mapping[c] for c in task.clients if c in mapping]
    timeout = s.edge_timeout_s if s.edge_timeout_s else EVAL_TIMEOUT_S
    result = run_edge_evaluation(CoalitionGrid(grid, nodes), task, mapping, poll_s=s.poll_s,
                                 timeout_s=timeout)
    samples = sum(v.samples for v in result.clients.values())
    correct = sum(v.correct for v in result.clients.values())
    log.info("edge %d: evaluation %s of version %d: %d clients, %d held-out samples, "
             "accuracy %s, missing %s, %.2f s", s.edge_id, task.task_id, task.version,
             len(result.clients), samples,
             f"{100 * correct / samples:.2f}%" if samples else "-", result.missing,
             time.monotonic() - t0)
    return send_evaluated(send, evaluated_request(result, s.edge_id, s.token), stop=stop)


__all__ = ["EVALUATED_RETRY_BUDGET_S", "EVALUATED_TIMEOUT_S", "EVAL_TIMEOUT_S", "RETRIED",
           "evaluated_request", "send_evaluated", "serve_evaluation"]
