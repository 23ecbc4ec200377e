"""A formed run's transitions: :class:`FormedRun`.

The controller makes one when coalitions are formed (or a checkpoint is restored) and drops it
when a formation attempt fails. It holds the :class:`~cloud_server.state.Federation` and the
:class:`~cloud_server.arrivals.Arrivals` that change it, and takes the controller's lock for
every transition of the strategy, publishing the views after each (the collaborators never take
the lock): a Submit checked, then applied (aggregation, dispatch, checkpoint: all or nothing);
the global model evaluated (centrally, or its federated evaluation's tasks made and each result
kept); a coalition lost or taken back; at the end the final checkpoint and the results. It knows neither gRPC nor the event loop: the run loop calls these methods (the
heavy ones in worker threads), and tests call them directly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from fedcure_app.config import FedCureConfig
from fedcure_app.protocol.codec import CodecError, check_like, decode_arrays, encode_arrays
from fedcure_app.strategy import FedCureStrategy
from fedcure_app.tasks import ClientReport
from cloud_server.arrivals import Arrivals
from cloud_server.checkpoint import CheckpointStore
from cloud_server.durable import Durability
from cloud_server.fedeval import FederatedResult, evaluation_tasks
from cloud_server.reach import reach_warnings
from cloud_server.refusal import Reason, Refusal
from cloud_server.results import ResultsWriter
from cloud_server.screening import NormScreen
from cloud_server.state import (
    Arrival, Federation, Roster, RunLog, Tally, TaskBook, TaskState,
)
from cloud_server.views import RunViews

log = logging.getLogger("fedcure.cloud")

#: ``evaluator(arrays) -> (accuracy, loss)`` on a held-out set, or ``(accuracy, loss,
#: class_accuracy)`` with the accuracy per class in label order (None: a class without samples)
Evaluator = Callable[[list[np.ndarray]], tuple]


class FormedRun:
    """The transitions of one formed federation (see the module docstring).

    Parameters
    ----------
    cfg:
        The configuration (``run.eval_every``, ``run.global_rounds``).
    federation:
        The formed federation: strategy, clients by id, assignments.
    lock:
        The controller's lock: held for every transition.
    roster, log, tasks, screen, durability, results, store:
        The controller's collaborators this run changes or writes with.
    views:
        Published after every transition.
    tally:
        Counts expired tasks.
    evaluator:
        ``arrays -> (accuracy, loss)``, or None (no evaluation).
    """

    def __init__(self, cfg: FedCureConfig, federation: Federation, *, lock: threading.Lock,
                 roster: Roster, log: RunLog, tasks: TaskBook, screen: NormScreen,
                 durability: Durability, results: ResultsWriter,
                 store: CheckpointStore | None, views: RunViews, tally: Tally,
                 evaluator: Evaluator | None) -> None:
        self.cfg = cfg
        self.federation = federation
        self.lock = lock
        self.roster = roster
        self.log = log
        self.durability = durability
        self.results = results
        self.store = store
        self.views = views
        self.tally = tally
        self.evaluator = evaluator
        self.tasks = tasks
        self.arrivals = Arrivals(cfg, federation, log, tasks, screen, durability)
        #: held while the results are written: they are written once (finish or a stop)
        self._writing = threading.Lock()
        #: the results were written (or their write was tried) and what it returned
        self._written = False
        self._result: dict[str, Any] | None = None

    @property
    def strategy(self) -> FedCureStrategy:
        """The federation's strategy."""
        return self.federation.strategy

    # ================================================================== submits
    def too_stale(self, task: TaskState) -> Refusal | None:
        """For an expired task: the refusal when it is staler than ``late-staleness-bound``."""
        return self.arrivals.too_stale(task)

    def check_submit(self, task: TaskState, num_samples: int, latency_s: float, stats: Any,
                     dropped: list[int], startup_s: float = 0.0) -> None:
        """A Submit of ``task`` is expected and its numbers are within bounds."""
        self.arrivals.check(task, num_samples, latency_s, stats, dropped, startup_s)

    def decode_model(self, task: TaskState, blob: bytes | memoryview) -> list[np.ndarray]:
        """The edge model of a Submit, decoded and checked against the global model's tensors
        (worker thread)."""
        try:
            arrays = decode_arrays(blob)
            check_like(arrays, self.strategy.global_arrays)
        except CodecError as err:
            raise Refusal(Reason.INVALID_ARGUMENT, f"task {task.task_id}: {err}") from None
        return arrays

    def arrive(self, task: TaskState, arrays: list[np.ndarray], latency: float,
               edge_latency: float, num_samples: int, reports: list[ClientReport],
               dropped: list[int], late: bool = False, startup_s: float = 0.0) -> Arrival:
        """Aggregate one edge model, dispatch again, record the round, write the checkpoint
        (worker thread): all of it or, when any step fails, none (:meth:`Arrivals.arrive`)."""
        assert self.log.t0 is not None
        with self.lock:
            arrival = self.arrivals.arrive(task, arrays, latency, edge_latency, num_samples,
                                           reports, dropped, late, startup_s)
            self.views.publish(self.federation)
            return arrival

    # ================================================================== evaluation
    def should_evaluate(self, arrival: Arrival) -> bool:
        """The global model is evaluated after this arrival (every ``eval_every`` rounds and
        at the end, given an evaluator)."""
        return self.evaluator is not None and (
            arrival.record["round"] % self.cfg.run.eval_every == 0 or arrival.finished)

    def record_evaluation(self, record: dict[str, Any], accuracy: float, loss: float,
                          class_accuracy: list[float | None] | None = None) -> None:
        """Keep an evaluation of the global model in its round's ``record`` and publish it."""
        with self.lock:
            record["accuracy"], record["loss"] = accuracy, loss
            if class_accuracy is not None:
                record["class_accuracy"] = class_accuracy
            self.views.publish(self.federation)

    def evaluate(self) -> tuple[float, float, list[float | None] | None]:
        """Accuracy, loss and (when the evaluator gives it) the per-class accuracy of a copy of
        the global model (worker thread)."""
        assert self.evaluator is not None
        with self.lock:
            arrays = [np.array(a, copy=True) for a in self.strategy.global_arrays]
        got = self.evaluator(arrays)
        per_class = list(got[2]) if len(got) > 2 and got[2] is not None else None
        return float(got[0]), float(got[1]), per_class

    def evaluation_tasks(self, round_: int) -> list[TaskState]:
        """Federated evaluation of the current global model: one evaluation task per edge
        (:func:`cloud_server.fedeval.evaluation_tasks`), started at global round ``round_``."""
        with self.lock:
            s = self.strategy
            return evaluation_tasks(self.cfg, s.version, round_, self.federation.assignment,
                                    self.tasks.model_bytes(s))

    def record_federated(self, record: dict[str, Any] | None, result: FederatedResult) -> None:
        """Keep a federated evaluation (recomputed as edges answer) in its round's ``record``,
        or for the initial model (``record`` None), and publish it."""
        with self.lock:
            if record is None:
                self.log.initial_accuracy = result.accuracy
                self.log.initial_evaluation = {"loss": result.loss, **{
                    k: v for k, v in result.fields().items() if k not in ("accuracy", "loss")}}
            else:
                record.update(result.fields())
            self.views.publish(self.federation, rebuild=True)

    # ================================================================== failover
    def lose(self, m: int, task: TaskState | None, why: str) -> list[TaskState]:
        """Mark coalition m unavailable (its task, if any, expires) and refill the free slot;
        returns the new tasks (worker thread)."""
        with self.lock:
            new = self.arrivals.lose(m, task, why)
            if task is not None:
                self.tally.expired()
            self.views.publish(self.federation)
            return new

    def refuse(self, m: int, task: TaskState, why: str) -> list[TaskState]:
        """Coalition m's edge model was refused: its task ends, the slot is refilled; returns
        the new tasks (worker thread)."""
        with self.lock:
            new = self.arrivals.refuse(m, task, why)
            self.views.publish(self.federation)
            return new

    def take_back(self, m: int, why: str) -> list[TaskState]:
        """Let coalition m be scheduled again and fill free slots; returns the new tasks."""
        with self.lock:
            new = self.arrivals.take_back(m, why)
            self.views.publish(self.federation)
            return new

    # ================================================================== the end
    def finish(self) -> dict[str, Any] | None:
        """Close a finished run (worker thread): warn about the target shares the measured
        latencies put out of reach, write the final checkpoint and the results, which it
        returns. A failure of either write is logged (None: no results); the run still ends.
        Results a stop wrote first are kept (and returned): nothing is written twice."""
        with self._writing:
            if not self._written:
                self._written = True
                self._result = self._close()
            return self._result

    def write_on_stop(self) -> tuple[dict[str, Any] | None, bool]:
        """The results of a run stopped before its end (worker thread): written now from the
        rounds done, unless the run finished and wrote its own (waited for while it writes
        them), which are never replaced. Returns the results and whether this call wrote
        them."""
        with self._writing:
            if self._written:
                return self._result, False
            self._written = True
            self._result = self.write_results()
            return self._result, True

    def _close(self) -> dict[str, Any] | None:
        """:meth:`finish`'s work, under the write-once lock."""
        if self.log.records:
            with self.lock:
                measured = self.strategy.estimator.mean()
            s = self.strategy
            self.log.warnings.extend(reach_warnings(s.delta, measured, s.max_concurrent,
                                                    "the measured latencies"))
        try:
            with self.lock:
                self.durability.save(self.federation)
        except Exception:  # noqa: BLE001
            log.exception("writing the final checkpoint failed")
        try:
            return self.write_results()
        except Exception:  # noqa: BLE001
            log.exception("writing the results failed")
            return None

    def write_results(self) -> dict[str, Any]:
        """The run's summary (:meth:`ResultsWriter.summary`), written with the final model and
        the plots into ``out_dir`` (nothing written without one); returns the summary."""
        fed = self.federation
        with self.lock:
            result = self.results.summary(fed, self.roster, self.log, self.store)
            blob = None if self.results.out_dir is None else encode_arrays(
                fed.strategy.global_arrays, {"version": str(fed.strategy.version),
                                             "rounds": str(len(self.log.records))})
            arrays = [np.array(a, copy=True) for a in fed.strategy.global_arrays]
        self.results.write(result, blob, arrays)
        return result


__all__ = ["Evaluator", "FormedRun"]
