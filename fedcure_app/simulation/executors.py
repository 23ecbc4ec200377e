"""Client executors: who runs a coalition's τ_e edge rounds for the simulation engine.

Both executors take an :class:`~fedcure_app.tasks.EdgeTask` and return an
:class:`~fedcure_app.tasks.EdgeResult`; the engine's simulated clock never depends on which one
ran (latencies come from device profiles), so the same seed gives the same schedule trace.

- :class:`InProcessExecutor` calls :func:`fedcure_app.training.train_local` directly on torch
  tensors: one model object, FedAvg in torch, no serialisation. The fast path.
- The Flower executor (``fedcure_app.simulation.flower_executor``) sends the same work to real
  Flower ClientApps on virtual SuperNodes through :mod:`fedcure_app.edge`.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import torch

from fedcure_app.models import build_model
from fedcure_app.tasks import ClientReport, EdgeResult, EdgeTask, client_train_seed
from fedcure_app.training import train_local

log = logging.getLogger(__name__)


class ClientExecutor(Protocol):
    """Runs one coalition's edge task and returns the edge model."""

    def run(self, task: EdgeTask) -> EdgeResult: ...

    def close(self) -> None: ...


class InProcessExecutor:
    """Trains every client of a coalition in this process, one after another.

    ``client_data`` holds each client's (x, y) tensors, sliced once up front.
    """

    def __init__(
        self,
        dataset: str,
        num_classes: int,
        client_data: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.model = build_model(dataset, num_classes)
        self.client_data = client_data
        self._params = list(self.model.state_dict().values())

    def _load(self, tensors: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, t in zip(self._params, tensors):
                p.copy_(t)

    def run(self, task: EdgeTask) -> EdgeResult:
        edge = [torch.from_numpy(np.ascontiguousarray(a)).clone() for a in task.arrays]
        sizes = np.array([len(self.client_data[c][1]) for c in task.clients], dtype=np.float64)
        weights = sizes / sizes.sum()
        reports: list[ClientReport] = []
        for r in range(task.tau_e):
            acc = [torch.zeros_like(t) for t in edge]
            for c, w in zip(task.clients, weights):
                x, y = self.client_data[c]
                self._load(edge)
                res = train_local(
                    self.model, x, y,
                    steps=task.tau_c, lr=task.lr, batch_size=task.batch_size,
                    seed=client_train_seed(task.seed, r, c),
                )
                with torch.no_grad():
                    for a, p in zip(acc, self._params):
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
            arrays=[t.numpy() for t in edge],
            num_samples=int(sizes.sum()),
            reports=reports,
        )

    def close(self) -> None:
        """Nothing to release."""
