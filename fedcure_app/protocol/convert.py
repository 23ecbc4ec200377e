"""Conversions between FedCure's value types and their protobuf messages (``cloud.proto``).

- :class:`~fedcure_app.devices.DeviceProfile` ↔ ``DeviceProfile``
  (:func:`profile_to_proto` / :func:`profile_from_proto`, which validates; they live in
  :mod:`fedcure_app.protocol.profiles`, which the client role imports without NumPy);
- :class:`~fedcure_app.tasks.EdgeTask` ↔ ``Task`` (:func:`task_to_proto`, :func:`task_to_wire`,
  :func:`task_from_proto`);
- :class:`~fedcure_app.tasks.ClientReport` ↔ ``ClientStat`` (:func:`report_to_proto` /
  :func:`report_from_proto`);
- :class:`~fedcure_app.tasks.EdgeResult` ↔ ``SubmitRequest`` (:func:`result_to_proto`,
  :func:`result_to_wire`, :func:`result_from_proto`).

Models travel in the :mod:`fedcure_app.protocol.arrays` format; the ``*_to_wire`` variants
return a :class:`~fedcure_app.protocol.wire.WithModel` (model beside the message, no extra
copy), and the ``*_from_proto`` ones accept either form. Units are those of the value types
(seconds, GHz, Mbit/s). Invalid input raises :class:`~fedcure_app.protocol.errors.CodecError`.
"""

from __future__ import annotations

from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.arrays import decode_arrays, encode_arrays, encode_parts
from fedcure_app.protocol.profiles import profile_from_proto, profile_to_proto
from fedcure_app.protocol.wire import WithModel, unwrap
from fedcure_app.tasks import ClientReport, EdgeResult, EdgeTask, EvalSums


# ------------------------------------------------------------------------------ tasks
def _task_header(task: EdgeTask, round: int, t_hat_round_s: float) -> pb.Task:
    return pb.Task(
        task_id=task.task_id,
        coalition=task.coalition,
        version=task.version,
        tau_e=task.tau_e,
        tau_c=task.tau_c,
        lr=task.lr,
        batch_size=task.batch_size,
        client_ids=[int(c) for c in task.clients],
        frequencies_ghz={int(c): float(f) for c, f in task.frequencies_ghz.items()},
        seed=task.seed,
        round=round,
        t_hat_round_s=t_hat_round_s,
        evaluate=bool(task.evaluate),
        client_samples={int(c): int(n) for c, n in task.client_samples.items()},
        max_client_weight=float(task.max_client_weight),
        client_step_bound=float(task.client_step_bound),
    )


def task_to_proto(task: EdgeTask, *, model: bytes | None = None, round: int = 0,
                  t_hat_round_s: float = 0.0) -> pb.Task:
    """An :class:`EdgeTask` as a ``Task`` message; ``model`` = already encoded arrays, if any."""
    msg = _task_header(task, round, t_hat_round_s)
    msg.model = encode_arrays(task.arrays) if model is None else model
    return msg


def task_to_wire(task: EdgeTask, *, model: bytes | None = None, round: int = 0,
                 t_hat_round_s: float = 0.0) -> WithModel:
    """Like :func:`task_to_proto`, with the model kept beside the message (no extra copy)."""
    return WithModel(_task_header(task, round, t_hat_round_s),
                     encode_parts(task.arrays) if model is None else model)


def task_from_proto(msg: pb.Task | WithModel, *, copy: bool = False) -> EdgeTask:
    """The :class:`EdgeTask` of a ``Task`` (plain or :class:`WithModel`; model decoded, as
    read-only views into the message unless ``copy``)."""
    msg, model = unwrap(msg)
    return EdgeTask(
        task_id=msg.task_id,
        coalition=msg.coalition,
        version=msg.version,
        arrays=decode_arrays(model, copy=copy),
        clients=tuple(int(c) for c in msg.client_ids),
        frequencies_ghz={int(c): float(f) for c, f in msg.frequencies_ghz.items()},
        tau_e=msg.tau_e,
        tau_c=msg.tau_c,
        lr=msg.lr,
        batch_size=msg.batch_size,
        seed=int(msg.seed),
        evaluate=bool(msg.evaluate),
        client_samples={int(c): int(n) for c, n in msg.client_samples.items()},
        max_client_weight=float(msg.max_client_weight),
        client_step_bound=float(msg.client_step_bound),
    )


# ------------------------------------------------------------------------------ results
def report_to_proto(report: ClientReport) -> pb.ClientStat:
    """A :class:`ClientReport` as a ``ClientStat`` message."""
    return pb.ClientStat(
        client_id=report.client,
        edge_round=report.edge_round,
        samples=report.samples,
        seconds=report.seconds,
        f_applied_ghz=report.f_applied_ghz,
        loss=report.loss,
    )


def report_from_proto(msg: pb.ClientStat) -> ClientReport:
    """The :class:`ClientReport` of a ``ClientStat`` message."""
    return ClientReport(
        client=msg.client_id,
        edge_round=msg.edge_round,
        samples=int(msg.samples),
        seconds=msg.seconds,
        f_applied_ghz=msg.f_applied_ghz,
        loss=msg.loss,
    )


def _submit_header(result: EdgeResult, edge_id: int, latency_s: float, token: str
                   ) -> pb.SubmitRequest:
    return pb.SubmitRequest(
        task_id=result.task_id,
        edge_id=edge_id,
        num_samples=result.num_samples,
        stats=[report_to_proto(r) for r in result.reports],
        dropped_client_ids=[int(c) for c in result.dropped],
        latency_s=latency_s,
        token=token,
        startup_s=float(result.startup_s),
    )


def result_to_proto(result: EdgeResult, *, edge_id: int, latency_s: float, token: str = "",
                    model: bytes | None = None) -> pb.SubmitRequest:
    """An :class:`EdgeResult` as a ``SubmitRequest`` from ES ``edge_id``."""
    msg = _submit_header(result, edge_id, latency_s, token)
    msg.model = encode_arrays(result.arrays) if model is None else model
    return msg


def result_to_wire(result: EdgeResult, *, edge_id: int, latency_s: float, token: str = "",
                   model: bytes | None = None) -> WithModel:
    """Like :func:`result_to_proto`, with the model beside the message (for
    :class:`EdgeLinkClient`): the arrays are copied once, into the wire bytes, when sent; do not
    change them before the call returns."""
    return WithModel(_submit_header(result, edge_id, latency_s, token),
                     encode_parts(result.arrays) if model is None else model)


def result_from_proto(msg: pb.SubmitRequest | WithModel, coalition: int, *,
                      copy: bool = False) -> EdgeResult:
    """The :class:`EdgeResult` of a ``SubmitRequest`` (its task's ``coalition`` given)."""
    msg, model = unwrap(msg)
    return EdgeResult(
        task_id=msg.task_id,
        coalition=coalition,
        arrays=decode_arrays(model, copy=copy),
        num_samples=int(msg.num_samples),
        reports=[report_from_proto(s) for s in msg.stats],
        dropped=[int(c) for c in msg.dropped_client_ids],
        startup_s=float(msg.startup_s),
    )


# ------------------------------------------------------------------------------ evaluations
def evaluation_to_proto(client: int, sums: EvalSums) -> pb.ClientEvaluation:
    """One client's :class:`EvalSums` as a ``ClientEvaluation`` message."""
    return pb.ClientEvaluation(
        client_id=int(client), samples=int(sums.samples), loss_sum=float(sums.loss_sum),
        correct=int(sums.correct), class_correct=[int(v) for v in sums.class_correct],
        class_total=[int(v) for v in sums.class_total])


def evaluation_from_proto(msg: pb.ClientEvaluation) -> tuple[int, EvalSums]:
    """(client id, :class:`EvalSums`) of a ``ClientEvaluation``; ``ValueError`` when its sums
    are inconsistent."""
    return int(msg.client_id), EvalSums(
        samples=int(msg.samples), loss_sum=float(msg.loss_sum), correct=int(msg.correct),
        class_correct=tuple(int(v) for v in msg.class_correct),
        class_total=tuple(int(v) for v in msg.class_total))


__all__ = [
    "evaluation_from_proto", "evaluation_to_proto",
    "profile_from_proto", "profile_to_proto", "report_from_proto", "report_to_proto",
    "result_from_proto", "result_to_proto", "result_to_wire", "task_from_proto", "task_to_proto",
    "task_to_wire",
]
