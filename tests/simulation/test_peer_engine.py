"""The peers on FedCure's simulated clock (fedcure_app.simulation.peer_engine): FedAvg aggregates
as Flower's FedAvg strategy does, FedBuff with K = 1 is asynchronous SGD, a FedAvg run matches a
plain PyTorch FedAvg loop, and every peer stops at the time budget with FedCure's record keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcure_app.config import FedCureConfig, apply_flat
from fedcure_app.core import peers as rules
from fedcure_app.data import load_dataset
from fedcure_app.experiments.runner import eval_view
from fedcure_app.models import build_model, set_weights
from fedcure_app.simulation.engine import build_federation, make_inprocess_executor, simulate
from fedcure_app.simulation.peer_engine import PeerClock, fedbuff_rounds
from fedcure_app.tasks import EdgeResult, EdgeTask
from fedcure_app.training import evaluate
from tests.simulation.fake_grid import task_identity


def _cfg(**flat) -> FedCureConfig:
    base = {"dataset": "digits", "num-clients": 6, "num-edges": 2, "tau-c": 2, "tau-e": 1,
            "lr": 0.05, "seed": 3, "global-rounds": 1000}
    return apply_flat(FedCureConfig(), {**base, **flat})


def _task(arrays, clients, seed=11) -> EdgeTask:
    return EdgeTask(task_id="t", coalition=0, version=0, arrays=arrays, clients=tuple(clients),
                    frequencies_ghz={}, tau_e=1, tau_c=2, lr=0.05, batch_size=32, seed=seed)


def test_fedavg_round_aggregates_as_flowers_fedavg_strategy():
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvg

    fed = build_federation(_cfg())
    ex = make_inprocess_executor(fed)
    clients = [0, 2, 5]
    ours = ex.run(_task(fed.initial_arrays, clients)).arrays  # what a peer's FedAvg round gives
    trained = [ex.run(_task(fed.initial_arrays, [c])) for c in clients]
    with task_identity():
        ask = Message(RecordDict({}), dst_node_id=1, message_type="train")
        replies = [Message(RecordDict({
            "arrays": ArrayRecord([np.asarray(a) for a in t.arrays]),
            "metrics": MetricRecord({"num-examples": t.num_samples})}), reply_to=ask)
            for t in trained]
        flower, _ = FedAvg().aggregate_train(1, replies)
    theirs = flower.to_numpy_ndarrays()
    pure = rules.weighted_mean([t.arrays for t in trained],
                               rules.sample_weights([t.num_samples for t in trained]))
    assert len(theirs) == len(ours)
    for a, b, c in zip(ours, theirs, pure):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c, b, rtol=1e-5, atol=1e-6)


class _AddOne:
    """Training adds (client + 1) to every weight: an update one can read off."""

    def run(self, task: EdgeTask) -> EdgeResult:
        c = task.clients[0]
        return EdgeResult(task.task_id, 0, [a + (c + 1) for a in task.arrays], 10)

    def close(self) -> None:
        pass


def test_fedbuff_with_k1_and_one_client_at_a_time_is_sequential_sgd_of_the_client_models():
    fed = build_federation(_cfg(**{"method": "fedbuff", "buffer-k": 1, "concurrency": 1}))
    prev = fed.initial_arrays
    rounds = fedbuff_rounds(PeerClock(fed, _AddOne()), list(prev))
    for _ in range(6):
        agg = next(rounds)
        (client,) = agg.clients
        assert agg.staleness == 0.0
        for new, old in zip(agg.arrays, prev):  # each client trains on the last model
            np.testing.assert_allclose(new, old + (client + 1), rtol=1e-6)
        prev = agg.arrays


def test_fedbuff_weighs_a_stale_update_by_one_over_root_one_plus_staleness():
    fed = build_federation(_cfg(**{"method": "fedbuff", "buffer-k": 1, "concurrency": 4,
                                   "server-lr": 1.0}))
    prev = fed.initial_arrays
    rounds = fedbuff_rounds(PeerClock(fed, _AddOne()), list(prev))
    seen = set()
    for _ in range(12):
        agg = next(rounds)
        (client,) = agg.clients
        s = rules.staleness_weight(agg.staleness)
        seen.add(agg.staleness)
        np.testing.assert_allclose(agg.arrays[0], prev[0] + s * (client + 1), rtol=1e-5)
        prev = agg.arrays
    assert max(seen) > 0  # some updates were stale


def _plain_fedavg(fed, rounds: int, steps: int, lr: float, batch: int, seed: int) -> float:
    """FedAvg written out in PyTorch: every client, `steps` SGD steps on random mini-batches
    from the global model, the sample-weighted mean; test accuracy at the end."""
    ds = fed.dataset
    model = build_model(ds.model_spec, ds.num_classes)
    glob = [torch.from_numpy(np.array(a)) for a in fed.initial_arrays]
    data = [(torch.from_numpy(ds.x_train[ix]), torch.from_numpy(ds.y_train[ix]).long())
            for ix in fed.partition.client_indices]
    sizes = torch.tensor([len(y) for _, y in data], dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        acc = [torch.zeros_like(g, dtype=torch.float64) for g in glob]
        for (x, y), n in zip(data, sizes):
            set_weights(model, [g.numpy() for g in glob])
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            model.train()
            order = torch.randperm(len(y), generator=gen)  # a shuffled pass, as a DataLoader
            for k in range(steps):
                idx = order[(torch.arange(batch) + k * batch) % len(y)]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
            for a, t in zip(acc, model.state_dict().values()):
                a += (n / sizes.sum()) * t.detach().double()
        glob = [a.float() for a in acc]
    set_weights(model, [g.numpy() for g in glob])
    return float(evaluate(model, ds.x_test, ds.y_test).accuracy)


def test_fedavg_run_reaches_the_accuracy_of_a_plain_pytorch_fedavg_loop():
    torch.set_num_threads(1)
    rounds, steps, lr, batch = 30, 10, 0.1, 32  # to the plateau: seeds then move it < 1 point
    cfg = _cfg(**{"method": "fedavg", "fraction": 1.0, "num-clients": 5, "num-edges": 2,
                  "partition": "iid", "tau-c": steps, "lr": lr, "batch-size": batch,
                  "global-rounds": rounds, "eval-every": rounds})
    ours = simulate(cfg)
    plain = _plain_fedavg(build_federation(cfg), rounds, steps, lr, batch, seed=0)
    assert ours["rounds"] == rounds
    assert ours["client_steps"] == rounds * 5 * steps
    print(f"fedavg peer {ours['final_accuracy']:.4f}, plain PyTorch FedAvg {plain:.4f}")
    assert ours["final_accuracy"] == pytest.approx(plain, abs=0.01)


@pytest.fixture(scope="module")
def small_digits():
    return eval_view(load_dataset("digits", None), 120)


@pytest.mark.parametrize("method", ["fedavg", "hierfavg", "fedbuff", "fedat"])
def test_every_peer_stops_at_the_time_budget_with_fedcures_record_keys(method, small_digits):
    budget = 0.4
    flat = {"time-budget-s": budget, "eval-every-s": 0.1, "tau-c": 1}
    fedcure = simulate(_cfg(**flat), dataset=small_digits)
    peer = simulate(_cfg(method=method, **flat), dataset=small_digits)
    times = [r["time_s"] for r in peer["records"]]
    assert times[-1] >= budget > times[-2]
    assert set(fedcure["records"][0]) <= set(peer["records"][-1])
    assert set(fedcure) - {"config"} <= set(peer)
    assert peer["records"][-1]["accuracy"] is not None
    fed = build_federation(_cfg(method=method))
    per_round = {r["wan_bytes"] for r in peer["records"]}
    if method == "hierfavg":  # the edge models cross the edge↔cloud link, nothing else
        assert per_round == {2 * fed.model_bytes * 2}
    if method == "fedavg":  # max(⌊0.1·6⌋, 1) = 1 client, straight to the cloud
        assert per_round == {2 * fed.model_bytes}
    assert peer["client_steps"] == sum(r["client_steps"] for r in peer["records"]) > 0


def test_fedat_tiers_put_the_slowest_clients_together():
    fed = build_federation(_cfg(method="fedat", tiers=2))
    clock = PeerClock(fed, _AddOne())
    prior = clock.pop.round_seconds(clock.work, clock.bytes, clock.pop.f_max_ghz)
    tier = rules.latency_tiers(prior, 2)
    assert prior[tier == 0].max() <= prior[tier == 1].min()


def test_a_peer_can_run_at_fedcures_frequency_rule_and_then_spends_less_energy():
    top = simulate(_cfg(method="fedavg", **{"global-rounds": 5, "tau-c": 1}),
                   dataset=eval_view(load_dataset("digits", None), 50))
    rule = simulate(_cfg(method="fedavg", frequency="fedcure", **{"global-rounds": 5,
                                                                   "tau-c": 1}),
                    dataset=eval_view(load_dataset("digits", None), 50))
    assert rule["energy_j"] < top["energy_j"]
    assert rule["simulated_seconds"] >= top["simulated_seconds"] * 0.5


def test_peer_knobs_out_of_range_are_refused_in_one_line():
    from fedcure_app.config import ConfigError

    with pytest.raises(ConfigError, match="buffer_k"):
        _cfg(**{"buffer-k": 7})
    with pytest.raises(ConfigError, match="tiers"):
        _cfg(tiers=9)
    with pytest.raises(ConfigError, match="fraction"):
        _cfg(fraction=0.0)
