"""The grouped forward of K clients and the stacked round built on it (the batched executor's
path on a GPU, run eagerly here): what it refuses, the round's buffers reused without carrying
state from one task to the next, the vmap path for other models. Each client's own logits and
gradients, on every convolution path: tests/simulation/test_conv_tuning.py."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from fedcure_app.simulation.batched import BatchedExecutor
from fedcure_app.simulation.executors import InProcessExecutor
from fedcure_app.simulation.forwards import grouped_forward
from tests.simulation.test_batched import TOLERANCE, _clients, _max_diff, _task


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
