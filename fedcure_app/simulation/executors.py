"""Client executors: who runs a coalition's τ_e edge rounds for the simulation engine.

Both executors take an :class:`~fedcure_app.tasks.EdgeTask` and return an
:class:`~fedcure_app.tasks.EdgeResult`; the engine's simulated clock never depends on which one
ran (latencies come from device profiles), so the same seed gives the same schedule trace.

- :class:`InProcessExecutor` calls :func:`fedcure_app.training.train_local` directly on torch
  tensors: one model object, FedAvg in torch, no serialisation. The fast path on one core.
- :class:`ParallelExecutor` runs in a pool of forked worker processes that keep the client
  data (inherited at fork, never pickled) and a built model. Either whole coalition tasks side
  by side (:meth:`ParallelExecutor.submit`, what the engine uses when at least as many
  coalitions train at once as there are workers), or the clients of each edge round of one task
  split over the workers (:meth:`ParallelExecutor.run`): only the edge model goes out and the
  trained client models come back. Bit-for-bit the same result as :class:`InProcessExecutor`
  (same seeds, same thread count, FedAvg summed in client order).
- The Flower executor (``fedcure_app.simulation.flower_executor``) sends the same work to real
  Flower ClientApps on virtual SuperNodes through :mod:`fedcure_app.flower.edge`.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import torch

from fedcure_app.models import build_model
from fedcure_app.tasks import ClientReport, EdgeResult, EdgeTask, client_train_seed
from fedcure_app.runtime.threads import apply_thread_policy, applied_threads, available_cores
from fedcure_app.training import EvalBatches, evaluate_batches, train_local

log = logging.getLogger(__name__)


class ClientExecutor(Protocol):
    """Runs one coalition's edge task and returns the edge model."""

    def run(self, task: EdgeTask) -> EdgeResult: ...

    def close(self) -> None: ...


class InProcessExecutor:
    """Trains every client of a coalition in this process, one after another.

    ``client_data`` holds each client's (x, y) tensors, sliced once up front; ``device``: where
    the model trains (the client data are moved there once; on the CPU nothing is copied).
    """

    def __init__(
        self,
        dataset: str,
        num_classes: int,
        client_data: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.model = build_model(dataset, num_classes).to(self.device)
        self.sizes = [len(y) for _, y in client_data]
        self.client_data = [(x.to(self.device), y.to(self.device)) for x, y in client_data]
        self.params = list(self.model.state_dict().values())

    def _load(self, tensors: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, t in zip(self.params, tensors):
                p.copy_(t)

    def run(self, task: EdgeTask) -> EdgeResult:
        edge = [torch.from_numpy(np.ascontiguousarray(a)).clone().to(self.device)
                for a in task.arrays]
        sizes = np.array([self.sizes[c] for c in task.clients], dtype=np.float64)
        weights = sizes / sizes.sum()
        reports: list[ClientReport] = []
        amount = task.local_amount()
        for r in range(task.tau_e):
            acc = [torch.zeros_like(t) for t in edge]
            for c, w in zip(task.clients, weights):
                x, y = self.client_data[c]
                self._load(edge)
                res = train_local(
                    self.model, x, y, **amount, lr=task.lr, batch_size=task.batch_size,
                    seed=client_train_seed(task.seed, r, c), momentum=task.momentum,
                )
                with torch.no_grad():
                    for a, p in zip(acc, self.params):
                        a.add_(p, alpha=float(w))
                reports.append(ClientReport(
                    client=int(c), edge_round=r, samples=int(res.samples),
                    seconds=float(res.seconds),
                    f_applied_ghz=float(task.frequencies_ghz.get(c, 0.0)),
                    loss=float(res.loss),
                ))
            edge = acc
        return EdgeResult(
            task_id=task.task_id,
            coalition=task.coalition,
            arrays=[t.cpu().numpy() for t in edge],
            num_samples=int(sizes.sum()),
            reports=reports,
        )

    def close(self) -> None:
        """Nothing to release."""


def resolve_workers(workers: int | None) -> int:
    """The worker-process count: ``workers`` if given (checked), else the cores this process
    may run on."""
    if workers is None:
        return available_cores()
    if int(workers) < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    return int(workers)


# ------------------------------------------------------------------ worker process side
_WORKER: dict[str, Any] = {}


def _worker_init(dataset: str, num_classes: int,
                 client_data: list[tuple[torch.Tensor, torch.Tensor]], threads: int,
                 test_data: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """Runs once in each forked worker: thread policy, the model, the (inherited) client and
    test data."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and shuts down
    apply_thread_policy(threads)
    inproc = InProcessExecutor(dataset, num_classes, client_data)
    _WORKER.update(executor=inproc, model=inproc.model, params=inproc.params, data=client_data,
                   test=test_data)


def _run_task(task: EdgeTask) -> EdgeResult:
    """A whole coalition task in this worker, as :class:`InProcessExecutor` runs it."""
    return _WORKER["executor"].run(task)


def _eval_batches(arrays: list[np.ndarray], start: int, stop: int, batch_size: int
                  ) -> EvalBatches:
    """Per-batch summed losses and correct counts (all, per class) of the test samples
    [start, stop)."""
    model, params = _WORKER["model"], _WORKER["params"]
    with torch.no_grad():
        for p, a in zip(params, arrays):
            p.copy_(torch.from_numpy(a))
    x, y = _WORKER["test"]
    return evaluate_batches(model, x, y, start, stop, batch_size=batch_size)


def _worker_ready() -> int:
    import os

    return os.getpid()


def _train_clients(
    arrays: list[np.ndarray], jobs: list[tuple[int, int]], amount: dict[str, int], lr: float,
    batch_size: int, momentum: float = 0.0,
) -> list[tuple[list[np.ndarray], int, float, float]]:
    """Train each (client, seed) of ``jobs`` from the edge model ``arrays``, in this worker, for
    ``amount`` (:meth:`EdgeTask.local_amount`); return per client (trained arrays, samples,
    seconds, loss)."""
    model, params, data = _WORKER["model"], _WORKER["params"], _WORKER["data"]
    edge = [torch.from_numpy(a) for a in arrays]
    out = []
    for client, seed in jobs:
        with torch.no_grad():
            for p, t in zip(params, edge):
                p.copy_(t)
        x, y = data[client]
        res = train_local(model, x, y, **amount, lr=lr, batch_size=batch_size, seed=seed,
                          momentum=momentum)
        out.append(([p.detach().numpy().copy() for p in params], int(res.samples),
                    float(res.seconds), float(res.loss)))
    return out


#: an edge round's clients are cut into this many chunks per worker, handed out as workers
#: become free: a worker slowed by another process on its core takes fewer of them, instead
#: of holding up the round with an equal share (each round ends with a barrier: FedAvg)
CHUNKS_PER_WORKER = 5


def _chunks(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` cut into at most ``parts`` contiguous chunks of near-equal length."""
    size = math.ceil(len(items) / max(1, parts)) if items else 0
    return [items[i:i + size] for i in range(0, len(items), size)] if size else []


class ParallelExecutor:
    """Trains the clients of every edge round in ``workers`` forked processes.

    The workers inherit ``client_data`` at fork (copy-on-write, no pickling) and build their
    model once; per edge round each gets the edge model and a contiguous chunk of the
    coalition's clients with their seeds, and sends back the trained client models. FedAvg is
    summed here in client order, so the edge model, the reports and hence the whole run are
    bit-for-bit those of :class:`InProcessExecutor` (each process uses the same torch thread
    count, ``threads``: default the policy's count in this process).

    With ``test_data`` (x, y tensors), :meth:`evaluate_global` splits the test set over the
    workers too, with the same result as :func:`fedcure_app.training.evaluate`.
    """

    def __init__(
        self,
        dataset: str,
        num_classes: int,
        client_data: list[tuple[torch.Tensor, torch.Tensor]],
        workers: int,
        *,
        threads: int | None = None,
        test_data: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = int(workers)
        self.client_data = client_data
        self._sizes = np.array([len(y) for _, y in client_data], dtype=np.int64)
        self._test_size = None if test_data is None else int(len(test_data[1]))
        threads = threads or applied_threads() or apply_thread_policy()
        self.threads = threads
        self._pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_worker_init,
            initargs=(dataset, num_classes, client_data, threads, test_data),
        )
        # start every worker now (fork before the caller starts threads of its own)
        for f in [self._pool.submit(_worker_ready) for _ in range(self.workers)]:
            f.result()
        log.info("ParallelExecutor: %d worker processes, %d torch thread(s) each",
                 self.workers, threads)

    def run(self, task: EdgeTask) -> EdgeResult:
        edge = [torch.from_numpy(np.ascontiguousarray(a)).clone() for a in task.arrays]
        sizes = self._sizes[list(task.clients)].astype(np.float64)
        weights = sizes / sizes.sum()
        reports: list[ClientReport] = []
        clients = [int(c) for c in task.clients]
        for r in range(task.tau_e):
            arrays = [t.numpy() for t in edge]
            jobs = [(c, client_train_seed(task.seed, r, c)) for c in clients]
            futures = [self._pool.submit(_train_clients, arrays, chunk, task.local_amount(),
                                         task.lr, task.batch_size, task.momentum)
                       for chunk in _chunks(jobs, self.workers * CHUNKS_PER_WORKER)]
            trained = [item for f in futures for item in f.result()]
            acc = [torch.zeros_like(t) for t in edge]
            with torch.no_grad():
                for (params, samples, seconds, loss), c, w in zip(trained, clients, weights):
                    for a, p in zip(acc, params):
                        a.add_(torch.from_numpy(p), alpha=float(w))
                    reports.append(ClientReport(
                        client=c, edge_round=r, samples=samples, seconds=seconds,
                        f_applied_ghz=float(task.frequencies_ghz.get(c, 0.0)), loss=loss,
                    ))
            edge = acc
        return EdgeResult(
            task_id=task.task_id,
            coalition=task.coalition,
            arrays=[t.numpy() for t in edge],
            num_samples=int(sizes.sum()),
            reports=reports,
        )

    def submit(self, task: EdgeTask) -> Future[EdgeResult]:
        """Run the whole of ``task`` in one worker, as :class:`InProcessExecutor` would; the
        caller collects the result later. With several tasks in flight (the engine keeps up to
        ``max-concurrent`` coalitions training) the workers run whole tasks side by side, with no
        barrier every edge round, which keeps every core busy also when another process takes
        a share of them. The task's model is copied now (the caller may change its arrays)."""
        task = replace(task, arrays=[np.array(a, copy=True) for a in task.arrays])
        return self._pool.submit(_run_task, task)

    def evaluate_global(self, arrays: list[np.ndarray], batch_size: int = 256
                        ) -> tuple[float, float, np.ndarray] | None:
        """(accuracy, mean loss, confusion counts [true][predicted]) of the model ``arrays`` on
        the test data,
        split over the workers in whole batches and summed in order (bit-for-bit
        :func:`~fedcure_app.training.evaluate`); None without test data."""
        if not self._test_size:
            return None
        n = self._test_size
        starts = list(range(0, n, batch_size))
        arrays = [np.ascontiguousarray(a) for a in arrays]
        futures = [self._pool.submit(_eval_batches, arrays, chunk[0],
                                     min(n, chunk[-1] + batch_size), batch_size)
                   for chunk in _chunks(starts, self.workers)]
        total_loss = 0.0
        correct = 0
        confusion: np.ndarray | None = None
        for f in futures:
            part = f.result()
            for value in part.losses:
                total_loss += value
            correct += part.correct
            confusion = part.confusion if confusion is None else confusion + part.confusion
        assert confusion is not None
        return correct / n, total_loss / n, confusion

    def close(self) -> None:
        """Stop the worker processes."""
        self._pool.shutdown(wait=True, cancel_futures=True)
