"""The batched executor: a coalition's clients train as one computation.

A dispatched coalition's K clients train τ_e edge rounds with their parameters (and SGD momentum
buffers) stacked along a leading client axis: each optimiser step computes the K clients'
gradients on their own mini-batches, then one SGD update of the stacked tensors.
It computes what :class:`~fedcure_app.simulation.executors.InProcessExecutor` computes one
client after another:

- each client's mini-batches come from the same seeded generator
  (:func:`~fedcure_app.tasks.client_train_seed`) and the same rule as
  :func:`~fedcure_app.training.train_local` (a fresh permutation every epoch, the last batch of
  an epoch possibly short);
- a short batch is padded to the batch size and masked out of the loss, so its gradient is the
  mean over its real samples; a client with fewer steps than another (``tau-c-unit = epochs``
  with unequal client sizes) is masked out of the steps it does not take (its parameters and
  momentum buffer stay as they are);
- SGD with momentum per client as ``torch.optim.SGD`` does it (buffer = μ·buffer + g, the first
  one g; parameter −= lr·buffer); FedAvg at the edge weighted by samples.

Same results as the in-process executor to float tolerance (the loss of a batch is a masked sum
over a count, and FedAvg sums over the client axis: the order of float additions differs).
Every model here is deterministic (no dropout, no batch norm, no buffers), which is what makes
vmapped training the same computation; a model with buffers is refused.

How a step's gradients are computed depends on the device (``vectorized``):

- on a GPU, where a batch-32 step of these CNNs is nearly all kernel launches, one step of all K
  clients replaces K steps: each convolution one grouped convolution over the clients' channel
  blocks, each linear layer one batched matrix product
  (:func:`~fedcure_app.simulation.forwards.grouped_forward`), and a whole edge round of them is
  captured once as a CUDA graph and replayed (:mod:`~fedcure_app.simulation.stacked_round`);
  the convolutions run as grouped convolutions (NCHW or channels-last) or as im2col and matrix
  products, whichever the first edge round measures fastest on the card
  (:mod:`~fedcure_app.simulation.conv_tuning`); a model that is not such a Sequential CNN takes
  one ``torch.func.vmap(grad)`` per step;
- on the CPU, vmap turns each convolution into a grouped convolution that costs about as much as
  K small ones, so each client's forward and backward runs on its slice of the stacked
  parameters, in channels-last layout (oneDNN's fast path for these convolutions, measured about
  1.4× faster per step than the contiguous layout the one-by-one executor uses for the MNIST CNN;
  docs/benchmarks.md), and only the SGD update and FedAvg run on the stacked tensors.

Either way the gradients are the same to float tolerance, and either way the executor's forward
pass pools before it rectifies (:func:`pool_before_relu`): ``max`` commutes with the monotone
ReLU, so the outputs and the gradients are bit for bit those of the model as built, while the
ReLU and its backward touch a quarter of the elements (measured about 1.2–1.5× faster per step
for the MNIST CNN on one core, channels-last).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from fedcure_app.models import build_model
from fedcure_app.simulation.conv_tuning import (
    CONV_PATHS,
    Choice,
    conv_forwards,
    cuda_sync,
    pick_fastest,
)
from fedcure_app.simulation.forwards import direct_forward, pool_before_relu
from fedcure_app.simulation.stacked_round import StackedRound, build_round
from fedcure_app.tasks import ClientReport, EdgeResult, EdgeTask, client_train_seed
from fedcure_app.training import configure_threads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPlan:
    """The mini-batches of K clients for one edge round, as index tensors.

    ``index[s, k, b]``: row of the concatenated training data that client k's b-th sample of
    step s is (padding rows point at the client's first sample); ``mask[s, k, b]``: 1.0 for a
    real sample, 0.0 for padding; ``active[s, k]``: whether client k takes step s at all;
    ``samples[k]``: samples client k processes in the edge round (repeats across epochs);
    ``counts[s][k]``: real samples in client k's batch of step s (0 for a step it does not
    take).
    """

    index: torch.Tensor
    mask: torch.Tensor
    active: torch.Tensor
    samples: list[int]
    counts: list[list[int]]

    @property
    def steps(self) -> int:
        return int(self.index.shape[0])


def client_steps(n: int, batch_size: int, amount: dict[str, int]) -> int:
    """Optimiser steps one client takes for ``amount`` (``{"steps": τ_c}`` or
    ``{"epochs": E}`` = E·⌈n/B⌉ steps), as :func:`~fedcure_app.training.train_local` counts."""
    if "epochs" in amount:
        return int(amount["epochs"]) * math.ceil(n / batch_size)
    return int(amount["steps"])


def client_batches(n: int, steps: int, batch_size: int, seed: int) -> list[torch.Tensor]:
    """The sample indices (within the client's own data) of each of ``steps`` mini-batches:
    the order :func:`~fedcure_app.training.train_local` draws them in with ``seed``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    per_epoch = math.ceil(n / batch_size)
    out: list[torch.Tensor] = []
    perm = torch.empty(0, dtype=torch.int64)
    batch_in_epoch = per_epoch
    for _ in range(steps):
        if batch_in_epoch >= per_epoch:
            perm = torch.randperm(n, generator=gen)
            batch_in_epoch = 0
        out.append(perm[batch_in_epoch * batch_size:(batch_in_epoch + 1) * batch_size])
        batch_in_epoch += 1
    return out


def plan_round(sizes: list[int], offsets: list[int], seeds: list[int], batch_size: int,
               amount: dict[str, int]) -> BatchPlan:
    """The :class:`BatchPlan` of one edge round for clients of ``sizes`` samples whose data
    start at rows ``offsets`` of the concatenated training data, with their training seeds."""
    k = len(sizes)
    per_client = [client_batches(n, client_steps(n, batch_size, amount), batch_size, s)
                  for n, s in zip(sizes, seeds)]
    steps = max((len(b) for b in per_client), default=0)
    index = torch.zeros((steps, k, batch_size), dtype=torch.int64)
    mask = torch.zeros((steps, k, batch_size), dtype=torch.float32)
    active = torch.zeros((steps, k), dtype=torch.bool)
    samples = []
    counts = [[0] * k for _ in range(steps)]
    for c, (batches, off) in enumerate(zip(per_client, offsets)):
        index[:, c, :] = off
        for s, idx in enumerate(batches):
            index[s, c, :len(idx)] = idx + off
            mask[s, c, :len(idx)] = 1.0
            active[s, c] = True
            counts[s][c] = len(idx)
        for s in range(len(batches), steps):
            mask[s, c, :] = 1.0  # a step the client does not take: computed, then discarded
        samples.append(int(sum(len(idx) for idx in batches)))
    return BatchPlan(index, mask, active, samples, counts)


def stacked(t: torch.Tensor, k: int, channels_last: bool) -> torch.Tensor:
    """``k`` copies of ``t`` along a new leading axis; a 4-d convolution weight with
    ``channels_last`` is laid out so that every copy is channels-last (stride 1 on its input
    channels, also when there is only one)."""
    if not (channels_last and t.dim() == 4):
        return t.unsqueeze(0).expand(k, *t.shape).clone()
    o, c, h, w = t.shape
    out = torch.empty_strided((k, o, c, h, w), (o * c * h * w, c * h * w, 1, w * c, c),
                              dtype=t.dtype, device=t.device)
    out.copy_(t.unsqueeze(0).expand(k, *t.shape))
    return out


class BatchedExecutor:
    """Trains every client of a coalition at once on parameters stacked along a leading client
    axis (module docstring). ``client_data`` holds each client's (x, y) tensors; they are
    concatenated once on ``device``. ``vectorized``: one vmapped gradient over the clients per
    step (default on a GPU) or each client's gradient on its slice, channels-last (default on
    the CPU). ``conv_path``: how the vectorized step computes its convolutions (one of
    :data:`~fedcure_app.simulation.conv_tuning.CONV_PATHS`); None: the fastest on a GPU's first
    edge round, ``grouped`` elsewhere."""

    def __init__(self, dataset: str, num_classes: int,
                 client_data: list[tuple[torch.Tensor, torch.Tensor]], *,
                 device: torch.device | str = "cpu", vectorized: bool | None = None,
                 graphs: bool | None = None, conv_path: str | None = None) -> None:
        configure_threads()
        self.device = torch.device(device)
        self.vectorized = self.device.type != "cpu" if vectorized is None else bool(vectorized)
        self.graphs = self.device.type == "cuda" if graphs is None else bool(graphs)
        if self.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need --device cuda")
        self.model = build_model(dataset, num_classes).to(self.device)
        state = self.model.state_dict()
        self.names = [name for name, _ in self.model.named_parameters()]
        if list(state) != self.names:
            extra = sorted(set(state) - set(self.names))
            raise ValueError(f"the batched executor trains parameters only; the {dataset} model "
                             f"has buffers ({', '.join(extra)}): use --executor inprocess")
        self.sizes = [int(len(y)) for _, y in client_data]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(int).tolist()
        self.x = torch.cat([x.float() for x, _ in client_data]).to(self.device)
        self.y = torch.cat([y.long() for _, y in client_data]).to(self.device)

        model = self.forward_model = pool_before_relu(self.model)
        self._direct = direct_forward(model)
        self._forwards = conv_forwards(model) if self.vectorized else {}
        if conv_path is not None and conv_path not in CONV_PATHS:
            raise ValueError(f"unknown convolution path {conv_path!r}; choose one of "
                             f"{', '.join(CONV_PATHS)}")
        if conv_path is not None and self._forwards and conv_path not in self._forwards:
            raise ValueError(f"the {dataset} model has no {conv_path} path "
                             f"(it has {', '.join(self._forwards)})")
        #: the convolution path in use (None: the vmapped gradient or the CPU's sliced one)
        self.conv_path: str | None = (conv_path or "grouped") if self._forwards else None
        self._grouped = self._forwards.get(self.conv_path) if self.conv_path else None
        #: time the paths on the first edge round (on a GPU, none named) and keep the fastest
        self._tune = (conv_path is None and self.device.type == "cuda" and len(self._forwards) > 1)
        #: how the paths compared when they were timed (:mod:`conv_tuning`)
        self.conv_choice: Choice | None = None
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN time its algorithms
        self._shapes = [p.shape for p in self.model.parameters()]
        self._rounds: dict[tuple, StackedRound] = {}

        def loss_fn(params: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
            logits = functional_call(model, params, (xb,))
            ce = F.cross_entropy(logits, yb, reduction="none")
            return (ce * mask).sum() / mask.sum()

        self._step = vmap(grad_and_value(loss_fn))

    def _vmapped_grads(self, params: list[torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                       mask: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every client's gradient and loss of one step, as one vmapped computation."""
        grads, loss = self._step(dict(zip(self.names, params)), xb, yb, mask)
        return [grads[n] for n in self.names], loss

    def _sliced_grads(self, params: list[torch.Tensor], grads: list[torch.Tensor],
                      xb: torch.Tensor, yb: torch.Tensor, counts: list[int]
                      ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every client's gradient and loss of one step, client by client on its slice of the
        stacked parameters (channels-last), written into ``grads``; a client without a step
        gets a zero gradient (the update discards it)."""
        loss = torch.zeros(len(counts), device=self.device)
        for c, n in enumerate(counts):
            if n == 0:
                for g in grads:
                    g[c].zero_()
                continue
            ps = [p[c].detach().requires_grad_() for p in params]
            xin = xb[c, :n].contiguous(memory_format=torch.channels_last)
            if self._direct is not None:
                logits = self._direct(ps, xin)
            else:
                logits = functional_call(self.forward_model, dict(zip(self.names, ps)), (xin,))
            out = F.cross_entropy(logits, yb[c, :n])
            for g, gc in zip(grads, torch.autograd.grad(out, ps)):
                g[c].copy_(gc)
            loss[c] = out.detach()
        return grads, loss

    def _train_round(self, edge: list[torch.Tensor], plan: BatchPlan, lr: float,
                     momentum: float) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Train K copies of ``edge`` for the round ``plan`` describes; return the stacked
        client parameters ([K, ...] each, in :attr:`names` order) and each client's summed
        mini-batch loss (nats) over the steps it took."""
        k = plan.index.shape[1]
        if self._tune and self._grouped is not None:
            self._choose_conv_path(edge, plan, lr, momentum)
        if self._grouped is not None:
            return self._stacked_round(plan, lr, momentum).run(
                edge, plan.index, plan.mask, plan.active)
        params = [stacked(t, k, not self.vectorized) for t in edge]
        bufs = [torch.zeros_like(p) for p in params] if momentum else []
        grad_space = [] if self.vectorized else [torch.empty_like(p) for p in params]
        index = plan.index.to(self.device)
        mask = plan.mask.to(self.device)
        active = plan.active.to(self.device)
        partial = not bool(plan.active.all())
        loss_sum = torch.zeros(k, device=self.device)
        for s in range(plan.steps):
            xb = self.x[index[s]]
            yb = self.y[index[s]]
            if self.vectorized:
                g, loss = self._vmapped_grads(params, xb, yb, mask[s])
            else:
                g, loss = self._sliced_grads(params, grad_space, xb, yb, plan.counts[s])
            if momentum:
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, g)
                update = bufs
            else:
                update = g
            if partial:  # clients past their last step keep parameters and buffer
                keep = ~active[s]
                kept = [t[keep] for t in params + bufs]  # copies of the idle clients' slices
                torch._foreach_add_(params, update, alpha=-lr)
                for t, o in zip(params + bufs, kept):
                    t[keep] = o
                loss_sum += torch.where(active[s], loss, torch.zeros_like(loss))
            else:
                torch._foreach_add_(params, update, alpha=-lr)
                loss_sum += loss
        return params, loss_sum

    def _round_key(self, plan: BatchPlan, lr: float, momentum: float) -> tuple:
        return (int(plan.index.shape[1]), plan.steps, int(plan.index.shape[2]), float(lr),
                float(momentum))

    def _build_round(self, forward, plan: BatchPlan, lr: float, momentum: float
                     ) -> StackedRound:
        k, steps, batch, _, _ = self._round_key(plan, lr, momentum)
        return build_round(forward, self.x, self.y, self._shapes, graph=self.graphs, k=k,
                           steps=steps, batch=batch, lr=lr, momentum=momentum)

    def _keep(self, plan: BatchPlan, lr: float, momentum: float, built: StackedRound
              ) -> StackedRound:
        """Store ``built`` as the round of this shape."""
        if self.graphs and built.graph is None:
            self.graphs = False  # a capture failed once: the later shapes run eagerly too
        self._rounds[self._round_key(plan, lr, momentum)] = built
        return built

    def _stacked_round(self, plan: BatchPlan, lr: float, momentum: float) -> StackedRound:
        """The :class:`StackedRound` of this round's shape (built, and on a GPU captured as a
        CUDA graph, the first time the shape comes up)."""
        found = self._rounds.get(self._round_key(plan, lr, momentum))
        if found is None:
            found = self._keep(plan, lr, momentum,
                               self._build_round(self._grouped, plan, lr, momentum))
        return found

    def _choose_conv_path(self, edge: list[torch.Tensor], plan: BatchPlan, lr: float,
                          momentum: float) -> None:
        """Build this round's shape with every convolution path, time them on this round
        (:func:`~fedcure_app.simulation.conv_tuning.pick_fastest`), keep the fastest for this
        and every later round, and free the others."""
        self._tune = False
        rounds: dict[str, StackedRound] = {}
        for name, forward in self._forwards.items():
            try:
                rounds[name] = self._build_round(forward, plan, lr, momentum)
            except Exception as err:  # noqa: BLE001 - a path that cannot be built is not used
                if name == CONV_PATHS[0]:
                    raise
                log.info("convolution path %s not built: %s: %s", name, type(err).__name__, err)
        choice = pick_fastest(
            {name: (lambda r=r: r.run(edge, plan.index, plan.mask, plan.active)[0])
             for name, r in rounds.items()}, sync=cuda_sync(self.device))
        self.conv_choice, self.conv_path = choice, choice.path
        self._grouped = self._forwards[choice.path]
        self._keep(plan, lr, momentum, rounds.pop(choice.path))
        rounds.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        log.info("batched executor on %s: convolutions as %s", self.device, choice.describe())

    def run(self, task: EdgeTask) -> EdgeResult:
        clients = [int(c) for c in task.clients]
        sizes = [self.sizes[c] for c in clients]
        offsets = [self.offsets[c] for c in clients]
        weights = torch.tensor(np.asarray(sizes, dtype=np.float64) / float(sum(sizes)),
                               dtype=torch.float32, device=self.device)
        amount = task.local_amount()
        edge = [torch.from_numpy(np.ascontiguousarray(a)).to(self.device, torch.float32)
                for a in task.arrays]
        reports: list[ClientReport] = []
        for r in range(task.tau_e):
            t0 = time.perf_counter()
            seeds = [client_train_seed(task.seed, r, c) for c in clients]
            plan = plan_round(sizes, offsets, seeds, task.batch_size, amount)
            stacked, loss_sum = self._train_round(edge, plan, task.lr, task.momentum)
            with torch.no_grad():
                edge = [torch.tensordot(weights, p, dims=1) for p in stacked]
            steps = plan.active.sum(dim=0).tolist()
            losses = loss_sum.cpu().tolist()
            share = (time.perf_counter() - t0) / len(clients)
            for i, c in enumerate(clients):
                reports.append(ClientReport(
                    client=c, edge_round=r, samples=plan.samples[i], seconds=share,
                    f_applied_ghz=float(task.frequencies_ghz.get(c, 0.0)),
                    loss=losses[i] / steps[i] if steps[i] else float("nan"),
                ))
        return EdgeResult(
            task_id=task.task_id, coalition=task.coalition,
            arrays=[t.detach().cpu().numpy() for t in edge],
            num_samples=int(sum(sizes)), reports=reports,
        )

    def close(self) -> None:
        """Drop the round buffers and CUDA graphs."""
        self._rounds.clear()


__all__ = ["BatchPlan", "BatchedExecutor", "client_batches", "client_steps", "plan_round",
           "direct_forward", "pool_before_relu"]
