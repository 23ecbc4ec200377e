"""One edge round of K clients on stacked parameters, as a fixed sequence of tensor ops on
static buffers: run eagerly, or captured once as a CUDA graph and replayed.

On a GPU a batched step of these CNNs costs little arithmetic and many small kernels, each
launched from Python through the dispatcher; a CUDA graph records the kernels of a whole edge
round (τ_c steps: mini-batch gather, forward, backward, SGD with momentum) once and replays
them with one call. A graph replays fixed addresses, so everything a round reads or writes
lives in buffers allocated once per (K, steps, batch, lr, momentum): the round copies the edge
model and the round's :class:`~fedcure_app.simulation.batched.BatchPlan` into them, then
replays (or runs the same ops eagerly where no graph is used: on the CPU, and as the fallback
when a capture fails).

A client past its last step (``active`` false) keeps its parameters and momentum buffer: the
update is selected per client with ``torch.where``, not by indexing, so that the shapes never
depend on the plan.
"""

from __future__ import annotations

import logging

import torch
from torch.nn import functional as F

from fedcure_app.simulation.forwards import Forward

log = logging.getLogger(__name__)


def _per_client(flag: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``flag`` ([K]) shaped to broadcast over a stacked tensor ``like`` ([K, ...])."""
    return flag.view(-1, *([1] * (like.dim() - 1)))


class StackedRound:
    """The training of one edge round of ``k`` clients (``steps`` mini-batch steps of
    ``batch`` samples, SGD at ``lr`` with ``momentum``) through ``forward``
    (:func:`~fedcure_app.simulation.forwards.grouped_forward`) on the training data ``x``
    ([N, C, H, W], float) and ``y`` ([N], int64), on their device. ``graph``: capture it as a
    CUDA graph (the device must be a GPU)."""

    def __init__(self, forward: Forward, x: torch.Tensor, y: torch.Tensor,
                 shapes: list[torch.Size], *, k: int, steps: int, batch: int, lr: float,
                 momentum: float, graph: bool = False) -> None:
        dev = x.device
        self.forward, self.x, self.y = forward, x, y
        self.k, self.steps, self.batch = int(k), int(steps), int(batch)
        self.lr, self.momentum = float(lr), float(momentum)
        self.params = [torch.zeros((k, *s), device=dev, requires_grad=True) for s in shapes]
        self.bufs = [torch.zeros((k, *s), device=dev) for s in shapes] if momentum else []
        self.index = torch.zeros((steps, batch, k), dtype=torch.int64, device=dev)
        self.mask = torch.ones((steps, k, batch), device=dev)
        self.active = torch.ones((steps, k), dtype=torch.bool, device=dev)
        self.loss_sum = torch.zeros(k, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        if graph:
            self._capture()

    def _body(self) -> None:
        """The round's ops on the static buffers: ``params`` and ``loss_sum`` hold the
        result."""
        c, h, w = self.x.shape[1:]
        with torch.no_grad():
            self.loss_sum.zero_()
            for b in self.bufs:
                b.zero_()
        for s in range(self.steps):
            idx = self.index[s]  # [B, K]: sample b of every client side by side
            xb = self.x[idx].reshape(self.batch, self.k * c, h, w)
            yb = self.y[idx].t()  # [K, B]
            logits = self.forward(self.params, xb)
            ce = F.cross_entropy(logits.reshape(self.k * self.batch, -1), yb.reshape(-1),
                                 reduction="none").view(self.k, self.batch)
            m = self.mask[s]
            per = (ce * m).sum(1) / m.sum(1)  # each client's mean over its real samples
            grads = torch.autograd.grad(per.sum(), self.params)
            with torch.no_grad():
                act = self.active[s]
                update = list(grads)
                if self.momentum:
                    for b, g in zip(self.bufs, grads):
                        b.copy_(torch.where(_per_client(act, b), b * self.momentum + g, b))
                    update = self.bufs
                for p, u in zip(self.params, update):
                    p.copy_(torch.where(_per_client(act, p), torch.add(p, u, alpha=-self.lr),
                                        p))
                self.loss_sum.add_(torch.where(act, per, torch.zeros_like(per)))

    def _capture(self) -> None:
        """Warm the ops up on a side stream (as CUDA graph capture requires), then record
        them."""
        stream = torch.cuda.Stream(device=self.x.device)
        stream.wait_stream(torch.cuda.current_stream(self.x.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._body()
        torch.cuda.current_stream(self.x.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body()
        self.graph = graph

    def run(self, edge: list[torch.Tensor], index: torch.Tensor, mask: torch.Tensor,
            active: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Train K copies of the edge model ``edge`` on the plan's ``index`` ([steps, K, B]),
        ``mask`` ([steps, K, B]) and ``active`` ([steps, K]), on any device (copied into this
        round's buffers); return the stacked client
        parameters and each client's summed mini-batch loss (nats). Both are this object's
        buffers: read them before the next call."""
        with torch.no_grad():
            for p, e in zip(self.params, edge):
                p.copy_(e.unsqueeze(0).expand_as(p))
            self.index.copy_(index.permute(0, 2, 1))
            self.mask.copy_(mask)
            self.active.copy_(active)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
        return [p.detach() for p in self.params], self.loss_sum


def build_round(forward: Forward, x: torch.Tensor, y: torch.Tensor, shapes: list[torch.Size],
                *, graph: bool, **kw: float) -> StackedRound:
    """A :class:`StackedRound`, captured as a CUDA graph where ``graph`` asks for one and the
    capture succeeds; where it fails, the eager one (logged once per round shape)."""
    if graph:
        try:
            return StackedRound(forward, x, y, shapes, graph=True, **kw)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
            log.warning("CUDA graph capture failed (%s: %s); training this round shape "
                        "eagerly", type(err).__name__, err)
    return StackedRound(forward, x, y, shapes, graph=False, **kw)  # type: ignore[arg-type]


__all__ = ["StackedRound", "build_round"]
