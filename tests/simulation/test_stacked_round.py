"""The grouped forward of K clients and the stacked round built on it (the batched executor's
path on a GPU, run eagerly here): each client's own logits and gradients, the round's buffers
reused without carrying state from one task to the next, the vmap path for other models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedcure_app.models import build_model
from fedcure_app.simulation.batched import BatchedExecutor
from fedcure_app.simulation.executors import InProcessExecutor
from fedcure_app.simulation.forwards import direct_forward, grouped_forward, pool_before_relu
from tests.simulation.test_batched import TOLERANCE, _clients, _max_diff, _task

SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


@pytest.mark.parametrize("dataset", ["digits", "mnist", "cifar10"])
def test_the_grouped_forward_gives_each_client_the_logits_and_gradients_of_its_own_model(
        dataset):
    torch.manual_seed(2)
    k, batch = 3, 2
    models = [pool_before_relu(build_model(dataset)) for _ in range(k)]
    grouped = grouped_forward(models[0])
    single = direct_forward(models[0])
    assert grouped is not None and single is not None
    stacked = [torch.stack([p.detach() for p in ps]).requires_grad_()
               for ps in zip(*(m.parameters() for m in models))]
    x = torch.randn(k, batch, *SHAPES[dataset])
    logits = grouped(stacked, x.transpose(0, 1).reshape(batch, -1, *SHAPES[dataset][1:]))
    assert logits.shape == (k, batch, 10)
    grads = torch.autograd.grad(logits.square().sum(), stacked)
    for c in range(k):
        own = [p.detach().clone().requires_grad_() for p in models[c].parameters()]
        expected = single(own, x[c])
        assert torch.allclose(logits[c], expected, atol=1e-5)
        for g, e in zip(grads, torch.autograd.grad(expected.square().sum(), own)):
            assert torch.allclose(g[c], e, atol=1e-4)


def test_the_grouped_forward_refuses_what_it_cannot_group():
    assert grouped_forward(nn.Sequential(nn.Linear(4, 4), nn.ReLU())) is None  # no Flatten
    assert grouped_forward(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(start_dim=2),
                                         nn.Linear(4, 2))) is None
    assert grouped_forward(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten())) is None
    assert grouped_forward(nn.Sequential(nn.Flatten(), nn.Linear(4, 2), nn.Flatten())) is None


def test_one_executor_gives_the_same_edge_model_for_the_same_task_twice():
    # the round's buffers (parameters, momentum, loss sums) are reused: nothing may carry over
    data = _clients([9, 21, 24])
    task = _task((0, 1, 2), momentum=0.9)
    ex = BatchedExecutor("digits", 10, data, vectorized=True)
    first = ex.run(task)
    other = ex.run(_task((2, 0, 1), momentum=0.9, seed=5))
    again = ex.run(task)
    assert len(ex._rounds) == 1  # one round shape: K = 3, τ_c = 4, batch 8
    assert _max_diff(first.arrays, again.arrays) == 0.0
    assert [r.loss for r in first.reports] == [r.loss for r in again.reports]
    assert _max_diff(first.arrays, other.arrays) > 0.0


def test_a_model_without_a_grouped_forward_takes_the_vmapped_gradient():
    data = _clients([5, 24, 40])
    task = _task((0, 1, 2), momentum=0.9)
    ex = BatchedExecutor("digits", 10, data, vectorized=True)
    ex._grouped = None  # as for a model grouped_forward refuses
    b = ex.run(task)
    a = InProcessExecutor("digits", 10, data).run(task)
    assert _max_diff(a.arrays, b.arrays) < TOLERANCE
    assert not ex._rounds


def test_cuda_graphs_are_refused_off_a_gpu():
    with pytest.raises(ValueError, match="CUDA graphs"):
        BatchedExecutor("digits", 10, _clients([4, 4]), graphs=True)
    assert not BatchedExecutor("digits", 10, _clients([4, 4]), vectorized=True).graphs


def test_the_grouped_round_reports_each_clients_mean_loss_like_the_one_by_one_executor():
    data = _clients([7, 20, 48])
    task = _task((0, 1, 2), tau_c=1, tau_c_unit="epochs", momentum=0.9)
    a = InProcessExecutor("digits", 10, data).run(task)
    b = BatchedExecutor("digits", 10, data, vectorized=True).run(task)
    assert np.allclose([r.loss for r in a.reports], [r.loss for r in b.reports], atol=1e-5)
