"""The batched executor (a coalition's clients as one computation) against the one-by-one
executor: the same edge model to float tolerance, the same mini-batch order, masks for short
batches and unequal step counts, and a short run's accuracies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.data import load_dataset
from fedcure_app.models import build_model, get_weights
from fedcure_app.simulation import batched
from fedcure_app.simulation.batched import (
    BatchedExecutor,
    client_batches,
    client_steps,
    direct_forward,
    plan_round,
    pool_before_relu,
)
from fedcure_app.simulation.engine import (
    SimulationEngine,
    build_federation,
    make_executor,
    make_inprocess_executor,
)
from fedcure_app.simulation.executors import InProcessExecutor
from fedcure_app.tasks import EdgeTask

#: Float tolerance of the edge model (max abs difference of any weight) after a task.
TOLERANCE = 1e-5


def _clients(sizes: list[int], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic 1×8×8 clients of the given sizes (digits-shaped)."""
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(rng.random((n, 1, 8, 8), dtype=np.float32)),
             torch.from_numpy(rng.integers(0, 10, n))) for n in sizes]


def _task(clients: tuple[int, ...], **kw) -> EdgeTask:
    torch.manual_seed(3)
    base = dict(task_id="t", coalition=0, version=0, arrays=get_weights(build_model("digits")),
                clients=clients, frequencies_ghz={c: 1.0 for c in clients}, tau_e=3, tau_c=4,
                lr=0.05, batch_size=8, seed=17)
    base.update(kw)
    return EdgeTask(**base)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_batched_edge_model_matches_one_by_one_after_a_task(momentum, vectorized):
    # sizes: a client smaller than one batch, one whose epochs end in a short batch, equal ones
    data = _clients([5, 21, 24, 24, 40])
    task = _task(tuple(range(5)), momentum=momentum)
    a = InProcessExecutor("digits", 10, data).run(task)
    b = BatchedExecutor("digits", 10, data, vectorized=vectorized).run(task)
    assert _max_diff(a.arrays, b.arrays) < TOLERANCE
    assert a.num_samples == b.num_samples
    assert [(r.client, r.edge_round, r.samples) for r in a.reports] == \
        [(r.client, r.edge_round, r.samples) for r in b.reports]
    for ra, rb in zip(a.reports, b.reports):
        assert rb.loss == pytest.approx(ra.loss, abs=1e-5)
        assert rb.f_applied_ghz == ra.f_applied_ghz


@pytest.mark.parametrize("vectorized", [True, False])
def test_batched_handles_local_epochs_with_unequal_client_sizes_by_masks(vectorized):
    # one epoch is ⌈n/8⌉ steps: 1, 3, 6 steps — the short clients sit out the later steps
    data = _clients([7, 20, 48])
    task = _task((0, 1, 2), tau_c=1, tau_c_unit="epochs", momentum=0.9)
    a = InProcessExecutor("digits", 10, data).run(task)
    b = BatchedExecutor("digits", 10, data, vectorized=vectorized).run(task)
    assert _max_diff(a.arrays, b.arrays) < TOLERANCE
    assert [r.samples for r in b.reports[:3]] == [7, 20, 48]


def test_batched_trains_a_subset_of_clients_in_the_tasks_order():
    data = _clients([12, 30, 9, 16])
    task = _task((3, 1), tau_e=2)
    a = InProcessExecutor("digits", 10, data).run(task)
    b = BatchedExecutor("digits", 10, data).run(task)
    assert _max_diff(a.arrays, b.arrays) < TOLERANCE
    assert [r.client for r in b.reports] == [3, 1, 3, 1]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), batch=st.integers(1, 16), seed=st.integers(0, 2**31 - 1),
       epochs=st.integers(1, 3))
def test_client_batches_cover_every_sample_once_per_epoch(n, batch, seed, epochs):
    steps = client_steps(n, batch, {"epochs": epochs})
    assert steps == epochs * math.ceil(n / batch)
    batches = client_batches(n, steps, batch, seed)
    per_epoch = math.ceil(n / batch)
    for e in range(epochs):
        seen = torch.cat(batches[e * per_epoch:(e + 1) * per_epoch])
        assert sorted(seen.tolist()) == list(range(n))
    assert all(1 <= len(b) <= batch for b in batches)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5), batch=st.integers(1, 12),
       steps=st.integers(0, 7))
def test_plan_masks_padding_and_points_into_each_clients_own_rows(sizes, batch, steps):
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
    plan = plan_round(sizes, offsets, list(range(len(sizes))), batch, {"steps": steps})
    assert plan.steps == steps
    for k, (n, off) in enumerate(zip(sizes, offsets)):
        rows = plan.index[:, k, :]
        assert bool(((rows >= off) & (rows < off + n)).all())
        # every real sample is unmasked, every pad masked: the mask counts the samples
        assert plan.mask[:, k, :].sum().item() == plan.samples[k]
        assert plan.samples[k] == sum(len(b) for b in client_batches(n, steps, batch, k))
    assert bool(plan.active.all())


def test_the_vectorized_step_is_the_default_on_a_gpu_only():
    assert not BatchedExecutor("digits", 10, _clients([8, 8])).vectorized
    assert BatchedExecutor("digits", 10, _clients([8, 8]), vectorized=True).vectorized


def test_sliced_weights_are_channels_last_also_with_one_input_channel():
    w = torch.randn(32, 1, 5, 5)
    s = batched.stacked(w, 3, channels_last=True)
    assert s[1].stride() == (25, 1, 5, 1) and torch.equal(s[2], w)
    assert batched.stacked(w, 3, channels_last=False).is_contiguous()


def test_batched_refuses_a_model_with_buffers(monkeypatch):
    def with_batch_norm(dataset: str, num_classes: int = 10) -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                             nn.Linear(4 * 6 * 6, num_classes))

    monkeypatch.setattr(batched, "build_model", with_batch_norm)
    with pytest.raises(ValueError, match="buffers .*--executor inprocess"):
        BatchedExecutor("digits", 10, _clients([8, 8]))


def test_a_short_batched_run_matches_the_one_by_one_runs_accuracies():
    cfg = apply_flat(FedCureConfig(), {
        "dataset": "digits", "num-clients": 9, "num-edges": 3, "global-rounds": 6,
        "tau-c": 2, "tau-e": 2, "eval-every": 2, "seed": 4, "lr": 0.05, "momentum": 0.9})
    digits = load_dataset("digits")
    fed = build_federation(cfg, digits)
    one = SimulationEngine(fed, make_inprocess_executor(fed)).run()
    fed_b = build_federation(apply_flat(cfg, {"executor": "batched"}), digits)
    ex = make_executor(fed_b, 1)
    assert isinstance(ex, BatchedExecutor)
    two = SimulationEngine(fed_b, ex).run()
    # the schedule never depends on the executor; the accuracies agree to float tolerance
    assert [r["coalition"] for r in one["records"]] == [r["coalition"] for r in two["records"]]
    accs = [(r["accuracy"], s["accuracy"]) for r, s in zip(one["records"], two["records"])
            if r["accuracy"] is not None]
    assert accs and all(abs(a - b) <= 0.005 for a, b in accs)


@settings(max_examples=25, deadline=None)
@given(dataset=st.sampled_from(["digits", "mnist", "cifar10"]), seed=st.integers(0, 2**31 - 1),
       shift=st.floats(-1.0, 1.0))
def test_pooling_before_the_relu_gives_bit_identical_outputs_and_gradients(dataset, seed, shift):
    torch.manual_seed(seed)
    model = build_model(dataset)
    reordered = pool_before_relu(model)
    assert reordered is not model
    assert [n for n, _ in reordered.named_parameters()] == [n for n, _ in model.named_parameters()]
    shape = {"digits": (4, 1, 8, 8), "mnist": (4, 1, 28, 28), "cifar10": (4, 3, 32, 32)}[dataset]
    x = torch.randn(shape) + shift  # a shift makes whole windows negative or positive
    y = torch.randint(0, 10, (4,))
    outs, grads = [], []
    for m in (model, reordered):
        out = m(x)
        loss = nn.functional.cross_entropy(out, y)
        outs.append(out.detach())
        grads.append(torch.autograd.grad(loss, list(m.parameters())))
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_a_model_without_a_relu_before_a_pool_is_left_as_it_is():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.ReLU())
    assert pool_before_relu(model) is model
    assert pool_before_relu(nn.Linear(2, 2)).__class__ is nn.Linear


@pytest.mark.parametrize("dataset", ["digits", "mnist", "cifar10"])
def test_the_direct_forward_computes_what_functional_call_computes(dataset):
    torch.manual_seed(1)
    model = pool_before_relu(build_model(dataset))
    forward = direct_forward(model)
    assert forward is not None
    shape = {"digits": (3, 1, 8, 8), "mnist": (3, 1, 28, 28), "cifar10": (3, 3, 32, 32)}[dataset]
    x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    a = forward(params, x)
    b = functional_call(model, dict(zip(names, params)), (x,))
    assert torch.equal(a, b)
    ga = torch.autograd.grad(a.square().sum(), params)
    gb = torch.autograd.grad(b.square().sum(), params)
    assert all(torch.equal(u, v) for u, v in zip(ga, gb))


def test_a_layer_the_direct_forward_does_not_know_falls_back_to_functional_call():
    assert direct_forward(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh())) is None
    padded = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"), nn.ReLU())
    assert direct_forward(padded) is None  # F.conv2d alone would pad with zeros
    assert direct_forward(nn.Linear(2, 2)) is None
