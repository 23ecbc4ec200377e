"""The batched executor's convolution paths (grouped NCHW, grouped channels-last, im2col): the
same function of the stacked parameters, and the rule that times them and keeps the fastest."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedcure_app.models import build_model
from fedcure_app.simulation.batched import BatchedExecutor
from fedcure_app.simulation.conv_tuning import (
    CONV_PATHS,
    Choice,
    conv_forwards,
    pick_fastest,
)
from fedcure_app.simulation.executors import InProcessExecutor
from fedcure_app.simulation.forwards import direct_forward, im2col_forward, pool_before_relu
from tests.simulation.test_batched import TOLERANCE, _clients, _max_diff, _task

SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


@pytest.mark.parametrize("path", CONV_PATHS)
@pytest.mark.parametrize("dataset", ["digits", "mnist", "cifar10"])
def test_every_conv_path_gives_each_client_the_logits_and_gradients_of_its_own_model(
        dataset, path):
    torch.manual_seed(4)
    k, batch = 3, 2
    models = [pool_before_relu(build_model(dataset)) for _ in range(k)]
    forward = conv_forwards(models[0])[path]
    single = direct_forward(models[0])
    stacked = [torch.stack([p.detach() for p in ps]).requires_grad_()
               for ps in zip(*(m.parameters() for m in models))]
    x = torch.randn(k, batch, *SHAPES[dataset])
    logits = forward(stacked, x.transpose(0, 1).reshape(batch, -1, *SHAPES[dataset][1:]))
    assert logits.shape == (k, batch, 10)
    grads = torch.autograd.grad(logits.square().sum(), stacked)
    for c in range(k):
        own = [p.detach().clone().requires_grad_() for p in models[c].parameters()]
        expected = single(own, x[c])
        assert torch.allclose(logits[c], expected, atol=1e-5)
        for g, e in zip(grads, torch.autograd.grad(expected.square().sum(), own)):
            assert torch.allclose(g[c], e, atol=1e-4)


def test_im2col_handles_padding_stride_and_dilation_and_refuses_grouped_convolutions():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1, dilation=2), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 3 * 3, 5))
    forwards = conv_forwards(model)
    assert set(forwards) == set(CONV_PATHS)
    stacked = [torch.stack([p.detach() * (1 + c) for c in range(2)]) for p in model.parameters()]
    x = torch.randn(3, 4, 7, 7)  # batch 3, two clients of two channels
    assert torch.allclose(forwards["im2col"](stacked, x), forwards["grouped"](stacked, x),
                          atol=1e-5)
    grouped_conv = nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Flatten(), nn.Linear(2, 2))
    assert im2col_forward(grouped_conv) is None
    assert "im2col" not in conv_forwards(grouped_conv)
    assert conv_forwards(nn.Sequential(nn.Linear(4, 4), nn.ReLU())) == {}


def _clocked(durations: dict[str, float]):
    """Candidates that advance a fake clock by their duration, and the clock."""
    now = [0.0]

    def make(name: str):
        def call() -> list[torch.Tensor]:
            now[0] += durations[name]
            return [torch.ones(3)]
        return call

    return {n: make(n) for n in durations}, (lambda: now[0])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=4))
def test_pick_fastest_chooses_the_candidate_with_the_least_time(times):
    # whole "seconds": the fake clock's differences are exact, so equal times tie exactly
    names = [f"p{i}" for i in range(len(times))]
    candidates, clock = _clocked(dict(zip(names, times)))
    choice = pick_fastest(candidates, clock=clock, repeats=2)
    fastest = min(times)
    assert choice.path == names[times.index(fastest)]  # ties: the earlier candidate
    assert choice.seconds[choice.path] == pytest.approx(fastest)
    assert set(choice.seconds) == set(names) and not choice.rejected


def test_pick_fastest_rejects_a_path_that_differs_or_fails_and_raises_for_the_reference():
    def failing() -> list[torch.Tensor]:
        raise RuntimeError("CUDA out of memory\nmore")

    candidates, clock = _clocked({"ref": 3.0, "fast": 2.0, "wrong": 1.0})
    candidates["wrong"] = lambda: [torch.full((3,), 1.01)]
    candidates["oom"] = failing
    choice = pick_fastest(candidates, clock=clock)
    assert choice.path == "fast"
    assert choice.rejected["wrong"] == "differs by 1.0e-02"
    assert choice.rejected["oom"] == "RuntimeError: CUDA out of memory"
    assert "fast 2000.00 ms" in choice.describe() and "oom not used" in choice.describe()
    with pytest.raises(RuntimeError, match="out of memory"):
        pick_fastest({"ref": failing, "fast": candidates["fast"]})
    with pytest.raises(ValueError, match="at least one"):
        pick_fastest({})
    with pytest.raises(ValueError, match="repeats"):
        pick_fastest(candidates, repeats=0)


@pytest.mark.parametrize("path", CONV_PATHS)
def test_the_batched_executor_on_each_conv_path_matches_one_by_one(path):
    data = _clients([9, 21, 24])
    task = _task((0, 1, 2), momentum=0.9)
    a = InProcessExecutor("digits", 10, data).run(task)
    ex = BatchedExecutor("digits", 10, data, vectorized=True, conv_path=path)
    assert ex.conv_path == path and not ex._tune  # a named path is not timed
    assert _max_diff(a.arrays, ex.run(task).arrays) < TOLERANCE


def test_the_executor_times_the_paths_once_keeps_the_fastest_and_frees_the_others():
    data = _clients([9, 21, 24, 30])
    task = _task((0, 1, 2), momentum=0.9)
    ex = BatchedExecutor("digits", 10, data, vectorized=True)
    assert not ex._tune and ex.conv_path == "grouped"  # on the CPU: no timing by default
    ex._tune = True  # as on a GPU
    first = ex.run(task)
    choice = ex.conv_choice
    assert isinstance(choice, Choice) and ex.conv_path == choice.path in CONV_PATHS
    assert set(choice.seconds) | set(choice.rejected) == set(CONV_PATHS)
    assert len(ex._rounds) == 1  # the chosen path's round only
    assert _max_diff(InProcessExecutor("digits", 10, data).run(task).arrays,
                     first.arrays) < TOLERANCE
    ex.run(_task((3, 0, 1), momentum=0.9))
    assert ex.conv_choice is choice  # timed once


def test_an_unknown_or_missing_conv_path_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown convolution path 'winograd'"):
        BatchedExecutor("digits", 10, _clients([4, 4]), vectorized=True, conv_path="winograd")
    monkeypatch.setattr("fedcure_app.simulation.batched.conv_forwards",
                        lambda model: {"grouped": conv_forwards(model)["grouped"]})
    with pytest.raises(ValueError, match="no im2col path"):
        BatchedExecutor("digits", 10, _clients([4, 4]), vectorized=True, conv_path="im2col")


def test_a_run_records_the_conv_path_and_how_the_paths_compared():
    from fedcure_app.config import FedCureConfig, apply_flat
    from fedcure_app.data import load_dataset
    from fedcure_app.simulation.engine import SimulationEngine, build_federation, client_tensors

    cfg = apply_flat(FedCureConfig(), {
        "dataset": "digits", "num-clients": 6, "num-edges": 2, "global-rounds": 2,
        "tau-c": 1, "tau-e": 1, "eval-every": 2, "seed": 1, "executor": "batched"})
    fed = build_federation(cfg, load_dataset("digits"))
    ex = BatchedExecutor("digits", 10, client_tensors(fed), vectorized=True)
    ex._tune = True  # as on a GPU
    summary = SimulationEngine(fed, ex).run()
    assert summary["conv_path"] == ex.conv_path in CONV_PATHS
    recorded = summary["conv_choice"]
    assert recorded["path"] == ex.conv_path
    assert set(recorded["seconds"]) | set(recorded["rejected"]) == set(CONV_PATHS)
    assert all(s > 0 for s in recorded["seconds"].values())
